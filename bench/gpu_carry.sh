#!/usr/bin/env bash
# What a GPU machine without a registry needs for bench/gpu_check.sh and
# bench/gpu_pretraining_pays.sh, gathered into one git-ignored folder to carry there:
#   bash bench/gpu_carry.sh WIKI_BOOKS SUITE_DATA TOKENIZER WHEELS [OUT]
# WIKI_BOOKS: the wiki_books folder (a subset of it is copied: one full Wikipedia shard, the
# short last one and the short last book shard, with both validation files; about 43 MB);
# SUITE_DATA: the folder of the downstream data sets; TOKENIZER: a tokenizer.json trained on
# the same corpus; WHEELS: the folder of the wheels the GPU image lacks. OUT (default
# .gpu_carry): OUT/data (the DATA of gpu_pretraining_pays.sh) and OUT/wheels.
set -euo pipefail
wb=$1 suite=$2 tok=$3 wheels=$4 out=${5:-.gpu_carry}
mkdir -p "$out/data/wiki_books" "$out/wheels"
for f in wikipedia-train-00000 wikipedia-train-00006 books-train-00002 \
  wikipedia-validation-00000 books-validation-00000; do
  cp "$wb/$f.jsonl.gz" "$out/data/wiki_books/"
done
for d in glue_sst2 glue_cola wnut17 home_depot; do
  cp -r "$suite/$d" "$out/data/"
done
cp "$tok" "$out/data/tokenizer.json"
cp "$wheels"/*.whl "$out/wheels/"
du -sh "$out"
