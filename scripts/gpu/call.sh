#!/usr/bin/env bash
# The next GPU lease's calls (issue 73 §5), exactly as `make rehearse-gpu` rehearses them on the CPU. Each is one
# device-tool run of `bash scripts/gpu/call.sh N` (scripts/gpu/README.md, "The next lease"). The two fit 12
# device-minutes with the machine's start (about 35 s) and the transfers: 320 s + 340 s of command.
#   1  timing alone: base training in every position mode beside OpenNMT-py rel (step time / abs, MFU, relmt rel /
#      OpenNMT-py rel), big abs and rel (MFU), flex against the reference route (loss after CONV_UPDATES bf16
#      updates, and whether it compiles)
#   2  correctness side by side: the Multi30k recipe (rel) trains in the background while the CUDA tests and the
#      suite run; its test2016 BLEU goes beside the CPU seeds'
#   3  decoding (issue 76 §4), only where status leaves 150 s after the two: one sentence at a time and 32 per
#      batch, a Python step per token against the whole search in one AOTInductor call (scripts/bench/decode_gpu.py)
set -u
cd "$(dirname "$0")/../.."
case "${1:-}" in
  1) export PHASES=${PHASES:-"train43 big conv"} TOTAL=${TOTAL:-320} SIZES_KIND=base STEPS=${STEPS:-6} \
       PROFILE_STEPS=${PROFILE_STEPS:-2} ONMT=${ONMT:-rel} CONV_UPDATES=${CONV_UPDATES:-300} ;;
  2) export PHASES=${PHASES:-"m30k tests suite"} TOTAL=${TOTAL:-340} M30K_POSITIONS=${M30K_POSITIONS:-rel} \
       M30K_BOX=${M30K_BOX:-330} SUITE_TIMEOUT=${SUITE_TIMEOUT:-170} ;;
  3) export PHASES=${PHASES:-"decode"} TOTAL=${TOTAL:-130} ;;
  *) echo "usage: bash scripts/gpu/call.sh 1|2|3 (OUT=... set by the device tool)" >&2; exit 2 ;;
esac
exec bash scripts/gpu/gpu_checks.sh
