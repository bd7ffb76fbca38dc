"""Fine-tune: `python finetune.py task=ad_relevance task.train_file=... pretrained=...`
(installed: `bert-lightning finetune ...`)."""

import hydra
from omegaconf import DictConfig

from bert_lightning.config import CONFIG_DIR, hydra_reported
from bert_lightning.training.finetune import best_val, finetune


@hydra.main(config_path=str(CONFIG_DIR), config_name="finetune", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    with hydra_reported():
        return best_val(finetune(cfg), cfg)


if __name__ == "__main__":
    main()
