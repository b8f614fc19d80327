#!/usr/bin/env bash
# Fetch Multi30k EN-DE (WMT16 multimodal task 1, raw text) from its public repository into the
# layout relmt reads: data/multi30k/{split}.{en,de}, with val renamed valid and test_2016_flickr
# renamed test (configs/experiment/multi30k_cpu.yaml, configs/data/multi30k_text.yaml).
# Needs internet access; the tests never run it.
#   data/get_multi30k.sh [OUT]      # OUT defaults to data/multi30k
set -euo pipefail
OUT=${1:-$(dirname "$0")/multi30k}
BASE=https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw
mkdir -p "$OUT"
for pair in train:train val:valid test_2016_flickr:test test_2017_flickr:test_2017_flickr \
            test_2017_mscoco:test_2017_mscoco test_2018_flickr:test_2018_flickr; do
    remote=${pair%%:*} local=${pair##*:}
    for lang in en de; do
        curl -fsSL "$BASE/$remote.$lang.gz" | gunzip > "$OUT/$local.$lang.tmp"
        mv "$OUT/$local.$lang.tmp" "$OUT/$local.$lang"
    done
done
wc -l "$OUT"/*.en "$OUT"/*.de
