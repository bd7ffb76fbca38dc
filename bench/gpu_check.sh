#!/usr/bin/env bash
# Every GPU check in one go (at most ~10 minutes) on a machine with a GPU and no network:
#   bash bench/gpu_check.sh [--device cpu] [WHEELS] [OUT]
# WHEELS (default .whl): the wheels the GPU image lacks (hydra-core, omegaconf, antlr4,
# datasets, torchdata, pysbd, ...), downloaded beforehand on a machine with a registry by
# `bash ../shared/gpu/fetch_wheels.sh .whl` or `pip download` of the same list. OUT (default
# $OUT, else gpu_check_out): JSON per check, logs, and summary.md, the table printed at the end.
# `--device cpu`: the same chain on tiny settings, a dry run the tests take so that the script
# cannot rot between GPUs.
# Order, the headline first: bert_base `train.py trainer=gpu` as a user runs it (packed data,
# 4 loader workers, logging, checkpoints), eager and compiled (the preset's default), each fit
# step against the bare step, with MFU and the host syncs of the steps that do not log; the bare
# step against transformers, eager and compiled; then padded batches (fine-tuning's shapes);
# then bert_large; then a short real run; then (with bench/gpu_carry.sh's data) whether
# pretraining pays. Each part has its own time limit; a part that fails or runs out of time
# leaves a blank row, the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
device=cuda
if [ "${1:-}" = "--device" ]; then
  device=$2
  shift 2
fi
wheels=${1:-.whl}
out=${2:-${OUT:-gpu_check_out}}
mkdir -p "$out"
py=${PYTHON:-python3}

if ! $py -c "import hydra, omegaconf, datasets, torchdata, pysbd" 2>/dev/null; then
  $py -m pip install -q --no-index --no-deps --target /tmp/gpu_check_site "$wheels"/*.whl
  export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 ||
  echo "$device (no nvidia-smi)" > "$out/gpu.txt"

if [ "$device" = cuda ]; then
  base=bert_base large=bert_large batch=256 seq=128 steps=60 warmup=5 every=20 bare_steps=""
  fit=(model=bert_base trainer=gpu data.batch_size=256 data.num_workers=4)
  run=(trainer=gpu model=bert_base data.batch_size=256 data.num_workers=4
    trainer.max_time=00:00:02:00 trainer.max_steps=100000 trainer.val_check_interval=200)
  padded=(--device cuda --steps 20 --warmup 3)
else  # tiny: the width and depth of debug=tiny, a few steps of each part
  base=bert_tiny large=bert_tiny batch=2 seq=16 steps=4 warmup=1 every=2
  bare_steps="--steps 1 --no-bf16"
  tiny=(model.hidden_size=32 model.num_hidden_layers=2 model.num_attention_heads=2
    model.intermediate_size=64 data.max_seq_length=32 data.batch_size=4 trainer=cpu)
  fit=(model=bert_tiny "${tiny[@]}")
  run=(debug=tiny "${tiny[@]}" trainer.max_steps=4 trainer.val_check_interval=2)
  padded=(--device cpu --workloads packed --batch-size 2 --batches 2 --steps 1 --warmup 1
    --no-bf16)
fi

step() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/log.txt"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "   exit $?" | tee -a "$out/log.txt"
  tail -n 4 "$out/$name.log"
}

fit_args=(--steps "$steps" --warmup "$warmup" --ckpt-every "$every")
step fit_eager 120 $py bench/fit_overhead.py "${fit_args[@]}" --json "$out/fit_eager.json" \
  "${fit[@]}" model_compile=false
step fit_compiled 180 $py bench/fit_overhead.py "${fit_args[@]}" \
  --json "$out/fit_compiled.json" "${fit[@]}" model_compile=true
bench=(bench/train_step.py --device "$device" --batch-size "$batch" --seq-len "$seq" --warmup
  "$warmup" $bare_steps)
step step_eager 120 $py "${bench[@]}" --sizes "$base" --json "$out/step_eager.json"
step step_compiled 150 $py "${bench[@]}" --sizes "$base" --compile \
  --json "$out/step_compiled.json"
step padded_step 120 $py bench/padded_step.py "${padded[@]}" --json "$out/padded_step.json"
step step_large 120 $py "${bench[@]}" --sizes "$large" --json "$out/step_large.json"
step train_gpu 150 $py train.py "${run[@]}" "paths.output_dir=$out/train_gpu"
$py bench/gpu_summary.py "$out" | tee "$out/summary.md"
# Then, where bench/gpu_carry.sh's data came along: MLM and RTD pretraining and the suite on
# both (bench/gpu_pretraining_pays.sh, ~20 min of pretraining before the suite). Its folder
# outlives OUT, so a later call on a warm machine continues it.
pays_data=${PAYS_DATA:-.gpu_carry/data}
if [ "$device" = cuda ] && [ -d "$pays_data/wiki_books" ]; then
  step pretraining_pays "${PAYS_LIMIT:-3000}" bash bench/gpu_pretraining_pays.sh "$pays_data" \
    "${PAYS_OUT:-gpu_check_out/pays}"
  cat "${PAYS_OUT:-gpu_check_out/pays}/curve.md" 2>/dev/null | tee -a "$out/summary.md"
fi
