#!/usr/bin/env bash
# Does pretraining pay on a GPU? A bert_base-shaped encoder pretrained for $MINUTES (default 10)
# of bf16 with MLM and with RTD (experiment=gpu_10min) on a Wikipedia + books subset, then the
# downstream suite's GPU budget ($SUITE_BUDGET) on both and on random weights ($SEEDS seeds,
# default 3), into OUT/curve.md (bench/budget_curve.py):
#   bash bench/gpu_pretraining_pays.sh DATA OUT [overrides...]
# DATA (bench/gpu_carry.sh writes it): wiki_books/ (train and validation shards), tokenizer.json
# (trained once beforehand, so the GPU's minutes go to pretraining) and the suite's data sets
# (glue_sst2/, glue_cola/, wnut17/, home_depot/). Stopped, the same command continues: finished
# runs and cells stay, a stopped run resumes from its last.ckpt with what is left of its budget.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$1
out=$2
shift 2
wb=$data/wiki_books
exec "${PYTHON:-python3}" bench/budget_curve.py "$out" --trainers ours,rtd \
  --minutes "${MINUTES:-10}" --seeds "${SEEDS:-3}" --suite-budget "${SUITE_BUDGET:-gpu}" \
  --tasks "${TASKS:-sst2,cola,wnut17,home_depot}" --data-dir "$data" experiment=gpu_10min \
  "data.train_files=[$wb/wikipedia-train-*.jsonl.gz,$wb/books-train-*.jsonl.gz]" \
  "data.val_files=[$wb/wikipedia-validation-*.jsonl.gz,$wb/books-validation-*.jsonl.gz]" \
  "data.tokenizer.path=$data/tokenizer.json" "data.cache_dir=$out/hf_cache" "$@"
