"""Pretrain a BERT encoder: `python train.py [model=bert_mini] [trainer.devices=8] ...`
(installed: `bert-lightning pretrain ...`)."""

import hydra
from omegaconf import DictConfig

from bert_lightning.config import CONFIG_DIR, hydra_reported
from bert_lightning.training.pretrain import train


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    with hydra_reported():
        return train(cfg)


if __name__ == "__main__":
    main()
