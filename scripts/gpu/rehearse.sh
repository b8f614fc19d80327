#!/usr/bin/env bash
# The next GPU lease's calls (scripts/gpu/call.sh 1, 2 and 3) rehearsed end to end on a CPU-only machine (issue 73 §1;
# `make rehearse-gpu`, which CI runs): every phase at tiny shapes inside the device lane (tests/fake_cuda.py), the
# wheels checked against the GPU image, the outputs packed as a call packs them, then checked and turned into the
# report page (scripts/gpu/rehearse_check.py). A script error found here costs no device-minute.
#   scripts/gpu/rehearse.sh              # all phases of the three calls, a few minutes on 2 cores
#   CALLS=1 scripts/gpu/rehearse.sh      # one call
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${R:-/tmp/relmt-rehearsal}
PY=${PY:-$PWD/.venv/bin/python}
export PATH="$(dirname "$PY"):$PATH"
[ -d .whl ] || bash scripts/gpu/gpu_wheels.sh >/dev/null    # the wheels the call carries (from PyPI)
rm -rf "$R"; mkdir -p "$R"
python scripts/gpu/rehearse_data.py "$R" >/dev/null         # the toy corpus in the carried data's layouts
status=0
for call in ${CALLS:-1 2 3}; do
  mkdir -p "$R/out$call"
  echo "== rehearsal of scripts/gpu/call.sh $call"
  # the lane is slower than a GPU: the phases keep their boxes, the call's TOTAL is lifted
  OUT="$R/out$call" W="$R/work$call" REHEARSE=1 TOTAL=${REHEARSE_TOTAL:-1200} WMT="$R/wmt_like" M30K="$R/multi30k" \
    bash scripts/gpu/call.sh "$call" || status=$?
  python scripts/gpu/rehearse_check.py "$R/out$call" --call "$call" || status=1
done
exit $status
