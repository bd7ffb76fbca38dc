"""Fine-tuning a pretrained encoder on a downstream task (`finetune.py`)."""
