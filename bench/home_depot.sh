#!/usr/bin/env bash
# Home Depot: all-MiniLM-L6-v2 fine-tuned (experiment=home_depot_minilm) beside its baselines
# (BM25, the zero-shot cosine) on the same test rows, with the wall time of the whole run:
#   DATA=../shared/data [OUT=outputs/results/home_depot_minilm] bash bench/home_depot.sh [overrides]
# Prints the test table (AUROC, Spearman, NDCG@10) at the end; all figures in $OUT/results.json.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-outputs/results/home_depot_minilm}
start=$(date +%s)
python finetune.py experiment=home_depot_minilm data_dir="$DATA/home_depot" \
  trainer.enable_progress_bar=false paths.output_dir="$OUT" "$@"
echo "wall time: $(($(date +%s) - start)) s"
