#!/usr/bin/env bash
# `make train` on a fresh clone, timed (issue 14: under 3 minutes on 2 cores, with the same BLEU).
# Clones HEAD into a scratch directory, runs `make train` there (which builds .venv first: pip
# resolves from the package registry, and the torch wheel comes from pip's cache when present), and
# writes docs/results/performance/make_train/ with the run's artifacts and timing.json: the wall time of the
# whole command, of building .venv, and of relmt-train itself (metrics.json). Run nothing else
# meanwhile.
#
#   scripts/bench/time_make_train.sh [SCRATCH]        # default /tmp/relmt-make-train
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SCRATCH=${1:-/tmp/relmt-make-train}
KEEP=$ROOT/docs/results/performance/make_train
rm -rf "$SCRATCH"
git clone --quiet "$ROOT" "$SCRATCH"
cd "$SCRATCH"
commit=$(git rev-parse --short HEAD)
start=$(date +%s.%N)
make .venv/.installed > venv.log 2>&1
built=$(date +%s.%N)
make train > train.out 2>&1
end=$(date +%s.%N)
run=$(dirname "$(ls -d runs/*/*/metrics.json | tail -1)")
mkdir -p "$KEEP"
rm -rf "$KEEP/translations"
cp "$run/metrics.json" "$run/config.yaml" "$run/train.log" "$run/metrics.jsonl" "$KEEP/"
[[ -d $run/translations ]] && cp -r "$run/translations" "$KEEP/"
"$ROOT/.venv/bin/python" - "$start" "$built" "$end" "$commit" "$KEEP" <<'EOF'
import json
import sys
from pathlib import Path

from relmt.bench import hardware

start, built, end = (float(x) for x in sys.argv[1:4])
keep = Path(sys.argv[5])
metrics = json.loads((keep / "metrics.json").read_text())
timing = {"command": "scripts/bench/time_make_train.sh", "commit": sys.argv[4], "hardware": hardware(),
          "make_train_seconds": end - start, "venv_seconds": built - start, "train_command_seconds": end - built,
          "relmt_train_wall_seconds": metrics["wall_seconds"], "test_bleu": {split: scores["bleu"] for split, scores in metrics["test"].items()}}
(keep / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
print(json.dumps(timing, indent=2))
EOF
