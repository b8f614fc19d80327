#!/usr/bin/env bash
# Tuning the Multi30k CPU recipe (experiment=multi30k_cpu) on the valid split only: the test splits
# are removed from every tuning run, so no test set is decoded while choosing settings.
# Settings run two at a time with one thread each, which gives more total throughput on 2 cores
# than one job with two threads (docs/results/threads_cpu.md). A finished run (metrics.json) is
# skipped; a run cut off is resumed. Each run's small artifacts go to docs/results/multi30k/tuning/.
#
#   scripts/tune_multi30k.sh ROUND      # ROUND: a function below; DATA defaults to ../shared/data/multi30k
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
DATA=${DATA:-../shared/data/multi30k}
OUT=${OUT:-runs/tune_multi30k}
KEEP=docs/results/multi30k/tuning
common=(experiment=multi30k_cpu "data.dir=$DATA" "~data.splits.test" "~data.splits.test_2017_flickr"
        "~data.splits.test_2017_mscoco" train.num_threads=1 train.progress=false)

run() {  # run NAME OVERRIDES...: one tuning run, resumed if cut off, its artifacts kept
    local name=$1; shift
    local dir="$OUT/$name"
    if [[ -f "$dir/metrics.json" ]]; then return; fi
    local resume=()
    if [[ -f "$dir/checkpoints/last.pt" ]]; then resume=(train.resume=true); fi
    "$BIN/relmt-train" "${common[@]}" "$@" "${resume[@]}" "hydra.run.dir=$dir" > "$dir.out" 2>&1 || true
    if [[ -f "$dir/metrics.json" ]]; then
        mkdir -p "$KEEP/$name"
        cp "$dir/metrics.json" "$dir/config.yaml" "$dir/train.log" "$dir/metrics.jsonl" "$KEEP/$name/"
    fi
}

pair() {  # pair "NAME1 OVERRIDES1..." "NAME2 OVERRIDES2...": side by side, one thread each
    # shellcheck disable=SC2086
    run $1 & run $2 & wait
}

round1() {  # dropout at the recipe's horizon (peak lr 0.005, warm-up 1000, 6144-token batches)
    pair "r1_drop0.3 model.dropout=0.3" "r1_drop0.1 model.dropout=0.1"
}

mkdir -p "$OUT"
"$BIN/relmt-prepare" "${common[@]:0:5}" > /dev/null  # the data cache, built once before the pair
for r in "$@"; do "$r"; done
