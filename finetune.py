"""Fine-tune: `python finetune.py task=ad_relevance task.train_file=... pretrained=...`
(installed: `bert-lightning finetune ...`)."""

from omegaconf import DictConfig

from bert_lightning.config import hydra_main
from bert_lightning.training.finetune import best_val, finetune


@hydra_main("finetune")
def main(cfg: DictConfig) -> float | None:
    return best_val(finetune(cfg), cfg)


if __name__ == "__main__":
    main()
