#!/usr/bin/env bash
# The checks of GPU.md in one run on a CUDA machine (each phase time-boxed, its output under $OUT):
#   1. correctness: tests/test_cuda.py (make test-gpu), then make test-fast's tests with the device left on
#      auto, so that every test that trains or decodes runs on CUDA in bf16 (the auto precision there);
#   2. quality at speed: the Multi30k recipe (experiment=multi30k_cpu), abs, rel and both, seed 1, with
#      train.device=cuda train.precision=bf16, the three runs side by side on the one GPU (beside phase 1);
#   3. training speed at paper scale: bench_train.py --sizes base big --precision bf16 (alone on the GPU),
#      then bench_attention.py (every positions mode, n up to 1024).
# Usage on the device machine, from the repository root (it has torch, sentencepiece, sacrebleu; the rest
# travels as wheels in .whl/, Multi30k in data/multi30k, the peer-corpus generator in data/bench/):
#   OUT=/some/dir scripts/gpu_checks.sh
#   OUT=/some/dir PHASES="suite bench" scripts/gpu_checks.sh      # some of the phases: tests suite m30k bench
# scripts/gpu_report.py turns what it writes into docs/results/gpu_*.{json,md}.
set -u
OUT=${OUT:?set OUT}
M30K=${M30K:-data/multi30k}
PEER=${PEER:-data/bench/make_peer_corpus.py}
PHASES=" ${PHASES:-tests suite m30k bench} "
want() { [[ "$PHASES" == *" $1 "* ]]; }
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }

# --- set-up: the missing packages from wheels, relmt from this checkout, its console scripts -----------
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { log "wheel install failed"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p /tmp/bin
for entry in prepare:relmt.cli:prepare train:relmt.cli:train average:relmt.cli:average translate:relmt.cli:translate \
             score:relmt.cli:score export:relmt.cli:export report:relmt.report.cli:main; do
  IFS=: read -r name module func <<<"$entry"
  printf '#!/usr/bin/env python3\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' "$module" "$func" "$func" \
    > "/tmp/bin/relmt-$name"
  chmod +x "/tmp/bin/relmt-$name"
done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep "Model name"
  python3 -c "import torch, datasets, hydra, sacrebleu, sentencepiece; print('torch', torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0)); print('datasets', datasets.__version__, 'hydra', hydra.__version__)"
} 2>&1 | tee -a "$OUT/log.txt"

# --- 2. the Multi30k recipe on the GPU, in the background ----------------------------------------------
if want m30k; then
M30K_ARGS=(experiment=multi30k_cpu "data.dir=$M30K" seed=1 train.device=cuda train.precision=bf16 train.num_threads=2
           train.progress=false)
log "prepare Multi30k"
mkdir -p runs/gpu
relmt-prepare "${M30K_ARGS[@]}" > runs/gpu/prepare.out 2>&1 || log "prepare failed"
for pos in abs rel both; do
  ( s=$(date +%s); relmt-train "${M30K_ARGS[@]}" "model.positions=$pos" "out_dir=runs/gpu/m30k_${pos}_s1" \
      > "runs/gpu/m30k_${pos}_s1.out" 2>&1; log "m30k $pos exit $? after $(( $(date +%s) - s ))s" ) &
done
fi

# --- 1. correctness -------------------------------------------------------------------------------------
if want tests; then
  log "tests/test_cuda.py"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/test_cuda.py > "$OUT/test_cuda.txt" 2>&1
  log "test_cuda exit $?: $(tail -1 "$OUT/test_cuda.txt")"
fi
if want suite; then
  # -v names each test as it ends, so a run cut off by its timeout still says which failed
  log "whole suite but the slow end-to-end runs (make test-fast), device auto"
  timeout "${SUITE_TIMEOUT:-200}" python3 -m pytest -v -p no:cacheprovider -m "not slow and not exhaustive and not gpu" \
    -n 12 -rfE --timeout 120 -p no:benchmark > "$OUT/suite.txt" 2>&1
  log "suite exit $?: $(tail -1 "$OUT/suite.txt")"
fi

want m30k && log "waiting for the Multi30k runs"
while [ "$(jobs -r | wc -l)" -gt 0 ] && [ $(( $(date +%s) - T0 )) -lt 400 ]; do sleep 5; done
[ "$(jobs -r | wc -l)" -gt 0 ] && { log "Multi30k runs still going at 400s: stopped"; kill $(jobs -p) 2>/dev/null; \
  pkill -f relmt-train; sleep 3; }
want m30k && tar czf "$OUT/m30k_gpu.tgz" --exclude=checkpoints --exclude=tb runs/gpu 2>/dev/null
want bench || exit 0

# --- 3. speed, the GPU to itself ------------------------------------------------------------------------
log "bench_train base big bf16"
timeout 100 python3 scripts/bench_train.py --peer-corpus "$PEER" --sizes base big --precision bf16 --device cuda \
  --steps 20 --out "$OUT/train_gpu.json" --md "$OUT/train_gpu.md" >> "$OUT/log.txt" 2>&1
log "bench_train exit $?"
timeout 40 python3 scripts/bench_attention.py --device cuda --min-seconds 0.2 --repeats 3 --variants abs rel rope alibi t5 \
  --out "$OUT/attention_gpu.json" --md "$OUT/attention_gpu.md" >> "$OUT/log.txt" 2>&1
log "bench_attention exit $?"
