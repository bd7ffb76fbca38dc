"""The unlabelled text of a fine-tuning run's training split, for task-adaptive pretraining
(Gururangan et al. 2020: MLM on the task's own text before fine-tuning on it): each distinct
text of the split that `python finetune.py OVERRIDES` trains on (`train_texts`: the queries and
titles of an ad_relevance task), one JSON line each, for `data=corpus data.train_files=OUT`.
The validation and test rows stay out (their queries are other groups).

    python bench/task_text.py hd_text.jsonl experiment=home_depot_minilm data_dir=DATA/home_depot
"""

from __future__ import annotations

import argparse
import json

from omegaconf import OmegaConf

from bert_lightning.atomic import write_text
from bert_lightning.config import compose
from bert_lightning.tasks.base import load_splits, train_texts
from bert_lightning.tasks.kinds import make_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", help="the JSON-lines file to write")
    p.add_argument("overrides", nargs="+", help="finetune.py's, as a run is given them")
    args = p.parse_args()
    cfg = compose("finetune", [*args.overrides, "paths.output_dir=."])
    _, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    texts = list(dict.fromkeys(train_texts(tables["train"])))  # distinct, in order
    write_text(args.out, "".join(json.dumps({"text": t}) + "\n" for t in texts))
    print(f"{len(texts)} texts of {len(tables['train']['group'])} training rows -> {args.out}")


if __name__ == "__main__":
    main()
