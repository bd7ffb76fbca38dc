"""The baselines of an ad relevance fine-tune without the fine-tune: BM25 and the zero-shot
cosine of `pretrained=` (`AdRelevance.baselines`), on the test rows that
`finetune.py` with the same Hydra overrides would test on (same split, subsample and metrics).

    python bench/ad_relevance_baseline.py dataset=home_depot data_dir=... pretrained=... [overrides]
"""

import json
import sys
from functools import partial

from omegaconf import OmegaConf

from bert_lightning.config import compose
from bert_lightning.inference import zero_shot_cosines
from bert_lightning.tasks.kinds import load_splits, make_task


def main(overrides: list[str]) -> dict:
    cfg = compose("finetune", [*overrides, "paths.output_dir=."])
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    if task.cfg.kind != "ad_relevance":
        raise SystemExit("the baselines are for task=ad_relevance")
    test = load_splits(task, cfg.seed)[1]["test"]
    zero_shot = partial(zero_shot_cosines, cfg.pretrained, max_seq_length=cfg.max_seq_length)
    out = task.baselines(test, zero_shot if cfg.pretrained else None)
    return {"rows": len(test["text"]), **out}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
