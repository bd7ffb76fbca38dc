"""Pretrain a BERT encoder: `python train.py [model=bert_mini] [trainer.devices=8] ...`
(installed: `bert-lightning pretrain ...`, the same entry)."""

from bert_lightning.commands.pretrain import main

if __name__ == "__main__":
    main(job="train")  # Hydra's job, and its log: train.log
