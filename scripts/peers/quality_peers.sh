#!/usr/bin/env bash
# relmt against OpenNMT-py 3.5.1 on Multi30k at equal budget (issue 30 §1): the six OpenNMT-py runs (abs and
# rel, seeds 1-3) of scripts/peers/quality_peers.py, in two one-thread lanes side by side, each finished run's
# config, logs, translations and scores kept in docs/results/reproduction/quality_peers/runs/ for git. The relmt runs
# they are compared with are the recipe's, docs/results/reproduction/multi30k/runs/t1_{abs,rel}_s{1,2,3}.
#
#   scripts/peers/quality_peers.sh                       # all six: about 70 min per run, 3.5 h on 2 cores
#   scripts/peers/quality_peers.sh onmt_rel_s2           # named runs only, in one lane
#
# DATA (default ../shared/data/multi30k: this project's machines) is the Multi30k raw text. A run with a
# metrics.json is done and skipped; one cut off starts again (OpenNMT-py keeps no checkpoint before the end).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-../shared/data/multi30k}
OUT=${OUT:-runs/quality_peers}
KEEP=${KEEP:-docs/results/reproduction/quality_peers/runs}
source scripts/peers/install.sh
install_peer onmt
mkdir -p "$OUT"

lane() {  # the named runs one after another, each kept when it finishes
    for name in "$@"; do
        .venv/bin/python scripts/peers/quality_peers.py --venv "$SCRATCH/onmt" --data "$DATA" --out "$OUT" --run "$name"
        mkdir -p "$KEEP/$name/translations"
        # kept without this machine's paths: the checkout's become relative, the peers' venvs $SCRATCH
        for f in config.yaml train.log translate.log metrics.json; do
            sed -e "s|$PWD/||g" -e "s|$SCRATCH|\$SCRATCH|g" "$OUT/$name/$f" > "$KEEP/$name/$f"
        done
        cp "$OUT/$name"/translations/*.de "$KEEP/$name/translations/"
    done
}

if (( $# )); then
    lane "$@"
else
    lane onmt_abs_s1 onmt_abs_s2 onmt_abs_s3 > "$OUT.abs.log" 2>&1 &
    lane onmt_rel_s1 onmt_rel_s2 onmt_rel_s3 > "$OUT.rel.log" 2>&1 &
    wait
fi
