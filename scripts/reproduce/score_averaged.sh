#!/usr/bin/env bash
# Is checkpoint averaging worth it? For each finished tuning run, translate the valid split with
# its averaged.pt (the last train.average_last step checkpoints) and score it; the result goes to
# RUN/averaged_valid.json and to the kept copy of the run, where `relmt-report ... kind=tuning`
# shows it beside the last checkpoint's valid BLEU. Valid split only (issue 12: never tune on test).
#   scripts/reproduce/score_averaged.sh runs/tune_multi30k/r1_drop0.1 ...    # DATA defaults to ../shared/data/multi30k
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
DATA=${DATA:-../shared/data/multi30k}
KEEP=${KEEP:-docs/results/reproduction/multi30k/tuning}
for run in "$@"; do
    ckpt="$run/checkpoints/averaged.pt"
    [[ -f $ckpt ]] || { echo "$ckpt: missing (train.average_last=0?)" >&2; exit 2; }
    "$BIN/relmt-translate" "checkpoint=$ckpt" "input=$DATA/valid.en" "output=$run/averaged_valid.de" progress=false
    "$BIN/relmt-score" "hyp=$run/averaged_valid.de" "ref=$DATA/valid.de" "out=$run/averaged_valid.json" > /dev/null
    if [[ -d $KEEP/$(basename "$run") ]]; then cp "$run/averaged_valid.json" "$KEEP/$(basename "$run")/"; fi
    echo "$run: averaged checkpoints, valid sacreBLEU $(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['sacrebleu']['score'], 2))" "$run/averaged_valid.json")"
done
