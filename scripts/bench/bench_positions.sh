#!/usr/bin/env bash
# Speed and memory of every position mode (issue 31 §3), on a quiet machine (nothing else running):
# - training step at the Multi30k recipe's size (mmt_tiny, 6,144 padded tokens, one thread, as the recipe runs),
#   abs, rel, both, rope, alibi, t5, timed paired (scripts/bench/bench_train.py);
# - one self-attention layer at the base model's shape, time and peak memory up to n = 1024
#   (scripts/bench/bench_attention.py);
# - beam-4 decoding of Multi30k test2016 sources at 32 sentences per batch, per mode (scripts/bench/bench_decode.py).
# DATA (default ../shared/data/multi30k: this project's machines) is the Multi30k raw text.
#   scripts/bench/bench_positions.sh      # about 15 minutes on 2 cores; writes docs/results/positions/positions_*_cpu.{md,json}
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-../shared/data/multi30k}
OUT=${OUT:-docs/results/positions}
PY=.venv/bin/python
MODES=(abs rel both rope alibi t5)
$PY scripts/bench/bench_train.py --text-dir "$DATA" --src-lang en --tgt-lang de --spm-model-type bpe \
    --sizes mmt_tiny --positions "${MODES[@]}" --max-padded-tokens 6144 --threads 1 --steps 40 \
    --out "$OUT/positions_train_cpu.json" --md "$OUT/positions_train_cpu.md"
$PY scripts/bench/bench_attention.py --variants abs rel rope alibi t5 --lengths 64 256 1024 \
    --out "$OUT/positions_attention_cpu.json" --md "$OUT/positions_attention_cpu.md"
$PY scripts/bench/bench_decode.py --text-dir "$DATA" --src-lang en --tgt-lang de --split test --n 500 \
    --positions "${MODES[@]}" --max-sentences 32 --d-model 128 --heads 4 --d-ff 256 --layers 4 \
    --out "$OUT/positions_decode_cpu.json" --md "$OUT/positions_decode_cpu.md"
