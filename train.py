"""Pretrain a BERT encoder: `python train.py [model=bert_mini] [trainer.devices=8] ...`
(installed: `bert-lightning pretrain ...`)."""

from omegaconf import DictConfig

from bert_lightning.config import hydra_main
from bert_lightning.training.pretrain import train


@hydra_main("train")
def main(cfg: DictConfig) -> float | None:
    return train(cfg)


if __name__ == "__main__":
    main()
