"""Fine-tuning is not implemented yet (tracked in the fine-tuning issue)."""

import sys

if __name__ == "__main__":
    sys.exit(
        "finetune.py: fine-tuning is not implemented yet; `python train.py` pretrains. "
        "See README.md, section 'Status'."
    )
