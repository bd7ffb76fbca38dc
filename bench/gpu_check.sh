#!/usr/bin/env bash
# Every GPU check in one go (at most ~10 minutes) on a machine with a GPU and no network:
#   bash bench/gpu_check.sh [WHEELS] [OUT]
# WHEELS (default .whl): the wheels the GPU image lacks (hydra-core, omegaconf, antlr4,
# datasets, torchdata, pysbd, ...), downloaded beforehand on a machine with a registry by
# `bash ../shared/gpu/fetch_wheels.sh .whl` or `pip download` of the same list. OUT (default
# $OUT, else gpu_check_out): JSON per check, logs, and summary.md, the table printed at the end.
# Order: the step bench first (the headline figures), then padded batches (unpadded encoder
# vs padded path vs transformers), then the loop overhead, then a short real
# run of train.py on the GPU preset, then (with bench/gpu_carry.sh's data) whether
# pretraining pays: MLM and RTD, the suite on both. Each part has its own time limit; a part that fails or
# runs out of time leaves a blank row, the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
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
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1

step() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/log.txt"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "   exit $?" | tee -a "$out/log.txt"
  tail -n 4 "$out/$name.log"
}

bench="bench/train_step.py --device cuda --batch-size 256 --seq-len 128 --sizes bert_base bert_large"
step step_eager 150 $py $bench --json "$out/step_eager.json"
step step_compiled 180 $py $bench --compile --json "$out/step_compiled.json"
step padded_step 120 $py bench/padded_step.py --device cuda --steps 20 --warmup 3 \
  --json "$out/padded_step.json"
step fit_overhead 100 $py bench/fit_overhead.py --steps 60 --ckpt-every 20 \
  --json "$out/fit_overhead.json" model=bert_base trainer=gpu data.batch_size=256 \
  data.num_workers=4
step train_gpu 150 $py train.py trainer=gpu model=bert_base data.batch_size=256 \
  data.num_workers=4 trainer.max_time=00:00:02:00 trainer.max_steps=100000 \
  trainer.val_check_interval=200 "paths.output_dir=$out/train_gpu"
$py bench/gpu_summary.py "$out" | tee "$out/summary.md"
# Then, where bench/gpu_carry.sh's data came along: MLM and RTD pretraining and the suite on
# both (bench/gpu_pretraining_pays.sh, ~20 min of pretraining before the suite). Its folder
# outlives OUT, so a later call on a warm machine continues it.
pays_data=${PAYS_DATA:-.gpu_carry/data}
if [ -d "$pays_data/wiki_books" ]; then
  step pretraining_pays "${PAYS_LIMIT:-3000}" bash bench/gpu_pretraining_pays.sh "$pays_data" \
    "${PAYS_OUT:-gpu_check_out/pays}"
  cat "${PAYS_OUT:-gpu_check_out/pays}/curve.md" 2>/dev/null | tee -a "$out/summary.md"
fi
