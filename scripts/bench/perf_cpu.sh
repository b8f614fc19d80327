#!/usr/bin/env bash
# The CPU performance figures, measured on the peer frameworks' workload (../shared/bench/README.md:
# word-level synthetic corpus, seed 1234; small model, k = 16, fp32), written to docs/results/performance/:
#   1. training tokens/s for abs, rel and both, and the rel/abs step-time ratio (train_cpu.*);
#   2. trained abs and rel models on that corpus (runs/peer/{abs,rel}, STEPS updates each), so that
#      decoding can also run free (EOS allowed), not only at the forced length of 20;
#   3. beam-4 decoding of the 500 test sentences, forced and free, with time per step (decode_cpu_peer.*);
#   4. perf_relmt_cpu.md: both in detail, with issue 7's goals (the side-by-side comparison with the
#      peers is scripts/peers/bench_peers.sh's perf_cpu.md).
# Run nothing else on the machine meanwhile. About 35 minutes on 2 cores (training the models: 20).
#
#   scripts/bench/perf_cpu.sh                 # PEER_GEN=../shared/bench/make_peer_corpus.py STEPS=400
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
PEER_GEN=${PEER_GEN:-../shared/bench/make_peer_corpus.py}
OUT=${OUT:-docs/results/performance}
RUNS=${RUNS:-runs/peer}
STEPS=${STEPS:-400}
CORPUS=data/cache/peer-corpus  # where bench_train.py writes the generated corpus

"$BIN/python" scripts/bench/bench_train.py --peer-corpus "$PEER_GEN" --steps 30 --warmup 5 \
    --out "$OUT/train_cpu.json" --md "$OUT/train_cpu.md"

for pos in abs rel; do
    if [ ! -f "$RUNS/$pos/checkpoints/best.pt" ]; then
        rm -rf "$RUNS/$pos"
        "$BIN/relmt-train" hydra.run.dir="$RUNS/$pos" model=small model.positions=$pos \
            data=text data.name=peer data.dir=$CORPUS data.src=src data.tgt=tgt data.spm_model_type=word \
            train.max_padded_tokens=8192 train.max_steps="$STEPS" train.eval_every="$STEPS" train.save_every="$STEPS" \
            train.progress=false
    fi
done

"$BIN/python" scripts/bench/bench_decode.py --text-dir $CORPUS --spm-model-type word --split test --n 500 \
    --checkpoint-abs "$RUNS/abs/checkpoints/best.pt" --checkpoint-rel "$RUNS/rel/checkpoints/best.pt" \
    --regimes forced free --per-step --plot "$OUT/decode_cpu_peer_steps.png" \
    --out "$OUT/decode_cpu_peer.json" --md "$OUT/decode_cpu_peer.md"

"$BIN/python" scripts/bench/perf_report.py --train "$OUT/train_cpu.json" --decode "$OUT/decode_cpu_peer.json" \
    --command "scripts/bench/perf_cpu.sh (STEPS=$STEPS)" --out "$OUT/perf_relmt_cpu.md"
