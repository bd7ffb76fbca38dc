"""Fine-tuning tasks (`kinds`: how each reads, encodes, builds its head and scores) and their
metrics (`metrics`)."""
