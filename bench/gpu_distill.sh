#!/usr/bin/env bash
# GPU only. What a few GPU minutes buy a bert_mini: all-MiniLM-L6-v2 distilled into it
# (experiment=distill_minilm, the TinyBERT hidden-state loss that won the CPU ablation) and MLM
# from scratch (experiment=cpu_30min's recipe), for $MINUTES (default 2.5) and $MLM_MINUTES
# (default $MINUTES) of one GPU, on the same text and tokenizer (MiniLM's), batch 256 x 128:
#   bash bench/gpu_distill.sh CARRY OUT [overrides...]
# CARRY (bench/gpu_distill_carry.py writes it, under 64 MiB): wheels/, teacher/ (the teacher's
# tokenizer and config, its weights in fp16 as model.safetensors.xz), train.jsonl.xz and
# val.jsonl.xz. OUT: per arm, <arm>.log and the student's weights in fp16 shards of under 16 MB
# (<arm>-<i>.safetensors; `python bench/gpu_distill_carry.py --unpack OUT DIR` turns them into
# Hugging Face folders that `bert-lightning downstream` scores on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
carry=$1
out=$2
shift 2
extra=("$@")  # overrides for both arms
mkdir -p "$out"
py=${PYTHON:-python3}
if ! $py -c "import hydra, omegaconf, datasets, torchdata, bm25s" 2>/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_distill_site "$carry"/wheels/*.whl
  export PYTHONPATH=/tmp/gpu_distill_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
work=${WORK:-/tmp/gpu_distill}
$py bench/gpu_distill_carry.py --open "$carry" "$work" || exit 1
budget() {  # minutes -> trainer.max_time
  $py -c "s=round($1*60); print(f'trainer.max_time=00:00:{s//60:02d}:{s%60:02d}')"
}
common=(data=corpus "data.train_files=[$work/train.jsonl]" "data.val_files=[$work/val.jsonl]"
  trainer.accelerator=${ACCELERATOR:-gpu} trainer.devices=1
  data.batch_size=${BATCH:-256} data.num_proc=8 "data.cache_dir=$work/hf_cache"
  trainer.val_check_interval=500 ++trainer.limit_val_batches=20 callbacks.progress_bar.every=250
  trainer.enable_progress_bar=false)
arm() {  # name, overrides...
  local name=$1
  shift
  echo "== $name" | tee -a "$out/summary.txt"
  timeout "${ARM_LIMIT:-240}" $py train.py "${common[@]}" "paths.output_dir=$work/$name" "$@" \
    "${extra[@]}" > "$out/$name.log" 2>&1
  echo "   exit $?" | tee -a "$out/summary.txt"
  find "$work/$name" -name metrics.csv -exec tail -n 4 {} \; >> "$out/$name.log"
  tail -n 6 "$out/$name.log"
  $py bench/gpu_distill_carry.py --pack "$work/$name/checkpoints/last.ckpt" "$out/$name" \
    2>&1 | tail -n 2 | tee -a "$out/summary.txt"
}
arm distill experiment=distill_minilm "objective.teacher=$work/teacher" objective.attention=0 \
  objective.value_relation=0 objective.hidden=1 "$(budget "${MINUTES:-2.5}")"
arm mlm experiment=cpu_30min "data.tokenizer.path=$work/teacher/tokenizer.json" \
  "$(budget "${MLM_MINUTES:-${MINUTES:-2.5}}")"
