"""bert_lightning: pretrain BERT encoders from scratch and fine-tune them."""

__version__ = "0.1.0"
