"""Fine-tuning tasks (`kinds`: how each reads, encodes, builds its head and scores), their
metrics (`metrics`) and their splits as a LightningDataModule (`datamodule`)."""
