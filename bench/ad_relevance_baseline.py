"""The baselines of an ad relevance fine-tune without the fine-tune: BM25 and the zero-shot
cosine of `pretrained=` (`AdRelevance.baseline_scores`), on the test rows that `finetune.py`
with the same Hydra overrides would test on (same split, subsample and metrics), and their order
within each query with intervals, BM25 against the zero-shot encoder (`ranking_report`).

    python bench/ad_relevance_baseline.py dataset=home_depot data_dir=... pretrained=... [overrides]
"""

import json
import sys
from functools import partial

from omegaconf import OmegaConf

from bert_lightning.config import compose
from bert_lightning.inference import zero_shot_cosines
from bert_lightning.tasks.ad_relevance import score_metrics
from bert_lightning.tasks.kinds import load_splits, make_task
from bert_lightning.tasks.ranking import ranking_report


def main(overrides: list[str]) -> dict:
    cfg = compose("finetune", [*overrides, "paths.output_dir=."])
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    if task.cfg.kind != "ad_relevance":
        raise SystemExit("the baselines are for task=ad_relevance")
    test = load_splits(task, cfg.seed)[1]["test"]
    zero_shot = partial(zero_shot_cosines, cfg.pretrained, max_seq_length=cfg.max_seq_length)
    scores = task.baseline_scores(test, zero_shot if cfg.pretrained else None)
    return {
        "rows": len(test["text"]),
        "baselines": {k: score_metrics(task, test, s) for k, s in scores.items()},
        "ranking": ranking_report(scores, test["target"], test["group"]),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
