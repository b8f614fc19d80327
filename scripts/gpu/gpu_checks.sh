#!/usr/bin/env bash
# The GPU checks (../shared/GPU.md, issue 43) in one run on a CUDA machine. Each phase is time-boxed, and the
# boxes shrink to fit TOTAL seconds (default 540: the default set ends inside 9 minutes on an H100 or H200).
# Phases (PHASES, default "tests attn trainflex train43"; scripts/gpu/call.sh holds the next lease's calls):
#   tests    every CUDA test, -v (make test-gpu: tests/test_cuda.py, the attention routes', the compiled
#            training step's), device cuda; box 150 s
#   attn     the attention routes, one layer forward + backward by length, n = 1024 first and the memory of each
#            case written as it is measured (scripts/bench/bench_attention_routes.py;
#            scripts/bench/bench_attention.py where it is absent), ATTN_CASES; box 60 s
#   trainflex  base abs and rel on the WMT-like workload with RELMT_ATTENTION=flex (bench_train.py --route flex):
#            FlexAttention in training, attention dropout by the hashed mask; 5 timed steps; box 120 s (each mode
#            compiles its kernels first, and the page is written once both are measured: t5 another time)
#   train43  issue 43 §4: scripts/bench/bench_train.py on the WMT-like workload (real en-de text, 32k BPE, batches
#            of TGT_TOKENS=25000 target tokens, the paper's), base then big, bf16, abs rel both rope alibi t5,
#            STEPS=10 timed steps, every timed shape warm, then 3 profiled (each mode's top kernels, to say where rel's
#            time goes); after base OpenNMT-py 3.5.1 abs and rel on the
#            same workload (--onmt); a size that runs out of GPU memory is measured again at 2/3 the batch;
#            the JSON is rewritten after each part, so a cut-off run keeps what finished; box: the rest
#   big      the big model, abs and rel alone (MFU), STEPS timed steps: big.json; box 70 s
#   conv     route_convergence.py alone (issue58's first part): flex against the reference, CONV_UPDATES bf16
#            updates (default 300) of CONV_TOKENS target tokens (default 8000); box 150 s
#   compiled train43's relmt part with train.compile's torch.compile (symbolic sizes), base, abs and rel, to set
#            beside train43's eager figures (its Markdown goes into extra.tgz); box 300 s
#   suite    the whole suite but the slow end-to-end runs (make test-fast), -v, device auto (CUDA, bf16): a call
#            of its own (GPU.md), e.g. PHASES=suite TOTAL=420; box SUITE_TIMEOUT or the rest of TOTAL
#   issue58  issue 58: route_convergence.py (flex vs reference from one initialisation, 300 bf16 updates, and
#            flex twice: determinism), loss_memory.py --largest (big rel, whole vs chunked loss) and bench_train
#            with --loss whole chunked --batch-by source longest; boxes 150 s each
#   labels   issue 68 §3: the sums per label each way (scripts/bench/bench_label_sums.py: the product with the tail
#            masks relmt now takes, masked sums, the scans it took until 2026-11-28, scatter_add), base and n = 1024
#            shapes, bf16; box 40 s
#   decode   issue 76 §4: one sentence at a time and 32 per batch, beam 4, base rel, relmt's search with a Python
#            step per token against the whole search in one AOTInductor call (scripts/bench/decode_gpu.py);
#            decode.json is written after the per-step rows, so a box that ends in the loop's compile keeps them;
#            box 150 s
#   m30k     the Multi30k recipe on the GPU (M30K_POSITIONS, default "abs rel both"), in the background beside
#            the phases above (issue 31; needs data/multi30k), stopped at M30K_BOX seconds (default 400)
# Carry (the run tool's carry list; ignored paths that must travel with the checkout, about 25 MB together):
#   .whl                 wheels of the packages the GPU machine lacks: scripts/gpu/gpu_wheels.sh fills it
#   data/bench/wmt_like  the WMT-like workload: python scripts/bench/bench_train.py --prepare-only (on a CPU)
#   data/multi30k        for m30k only (data/get_multi30k.sh)
# The call (the device tool's run):
#   command: bash scripts/gpu/gpu_checks.sh     carry: [".whl", "data/bench/wmt_like"]     timeout_s: 600
# Every phase writes into a work folder (W, default /tmp/gpu_call): tests.txt, attn.json/.md, label_sums.json/.md,
# train43f.json, train43.json/.md, train43c.json, route_convergence.json, loss_memory_gpu.json, train_orders_gpu.json,
# suite.txt, OpenNMT-py's logs and the Multi30k runs. $OUT holds three files (a call brings back 8 at most):
#   log.txt       what each phase did, with times
#   phases.json   each phase's exit status, seconds, box and the files it wrote, rewritten as each phase ends
#   results.tgz   the work folder, packed again as each phase ends and every PACK_EVERY seconds (default 20)
#                 while one runs: a call cut off by its timeout keeps what the last pack held
# Unpack results.tgz into docs/results/gpu/<date>/ and run python scripts/gpu/gpu_report.py --dir there.
#
# REHEARSE=1 (scripts/gpu/rehearse.sh, make rehearse-gpu; issue 73 §1): the same call on a CPU-only machine, every
# phase at tiny shapes inside the device lane (RELMT_LANE=1: scripts/gpu/lane/sitecustomize.py puts every Python
# process in tests/fake_cuda.py's fake CUDA), the wheels checked against the GPU image's packages instead of
# installed (scripts/gpu/wheels_check.py), relmt's console scripts written beside W instead of the interpreter.
set -u
OUT=${OUT:?set OUT}
TOTAL=${TOTAL:-540}
M30K=${M30K:-data/multi30k}
WMT=${WMT:-data/bench/wmt_like}
PHASES=" ${PHASES:-tests attn trainflex train43} "
W=${W:-/tmp/gpu_call}
REHEARSE=${REHEARSE:-}
want() { [[ "$PHASES" == *" $1 "* ]]; }
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }
# the box of a phase: its own, cut to what is left of TOTAL (10 s kept for packing up)
box() { local left=$(( TOTAL - ($(date +%s) - T0) - 10 )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
rm -rf "$W"; mkdir -p "$W"
EXTRA=$W  # the older name of the work folder in the phases below
# results.tgz from the work folder, written whole or not at all (a pack cut off by the call's end leaves the last one)
pack() { tar czf "$OUT/.results.tgz" --exclude=checkpoints --exclude=tb --exclude=text --exclude="*.pt" -C "$W" . \
           2>/dev/null && mv -f "$OUT/.results.tgz" "$OUT/results.tgz"; }
# phase_end NAME EXIT SECONDS BOX FILE...: a line of phases.json (rewritten whole), then a pack
PHASES_JSON=()
phase_end() {
  local name=$1 code=$2 secs=$3 bx=$4; shift 4
  local files="" f
  for f in "$@"; do [ -s "$W/$f" ] && files+="\"$f\","; done
  PHASES_JSON+=("{\"phase\": \"$name\", \"exit\": $code, \"seconds\": $secs, \"box\": $bx, \"files\": [${files%,}]}")
  local IFS=,; printf '{"rehearsal": %s, "phases": [%s]}\n' "$([ -n "$REHEARSE" ] && echo true || echo false)" \
    "${PHASES_JSON[*]}" > "$OUT/phases.json"
  pack
}
# run_phase NAME BOX FILE... -- COMMAND...: the command under its box, its output into log.txt, then phase_end
run_phase() {
  local name=$1 bx=$2; shift 2
  local files=()
  while [ "$1" != "--" ]; do files+=("$1"); shift; done; shift
  local s; s=$(date +%s)
  timeout "$bx" "$@" >> "$OUT/log.txt" 2>&1
  local code=$?
  log "$name exit $code"
  phase_end "$name" "$code" $(( $(date +%s) - s )) "$bx" "${files[@]}"
}
( while sleep "${PACK_EVERY:-20}"; do pack; done ) &
PACKER=$!
trap 'kill $PACKER 2>/dev/null' EXIT

# --- set-up: the missing packages from wheels, relmt from this checkout, its console scripts -----------
BIN=/tmp/bin
if [ -n "$REHEARSE" ]; then
  # the wheels the call would install, checked against the GPU image's packages (what an install there would miss)
  python3 scripts/gpu/wheels_check.py .whl >> "$OUT/log.txt" 2>&1 || { log "wheel check failed"; exit 1; }
  export PYTHONPATH=$PWD:$PWD/scripts/gpu:$PWD/scripts/gpu/lane RELMT_LANE=1
  BIN=$W/bin
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { log "wheel install failed"; exit 1; }
  export PYTHONPATH=$PWD:/tmp/site:$PWD/scripts/gpu
fi
export PATH=$BIN:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# The console scripts go beside the interpreter too: the tests run them as Path(sys.executable).parent/relmt-*,
# as in a venv (the 2026-11-27 suite lost every test_train_cli, lifecycle and patience test to their absence). A
# rehearsal's interpreter is a venv's, which has them.
PYBIN=$(python3 -c "import os, sys; print(os.path.dirname(sys.executable))")
[ -n "$REHEARSE" ] && PYBIN=$BIN
mkdir -p "$BIN"
for entry in prepare:relmt.cli.prepare:main train:relmt.cli.train:main average:relmt.cli.average:main \
             translate:relmt.cli.translate:main score:relmt.cli.score:main export:relmt.cli.export:main \
             report:relmt.cli.report:main serve:relmt.serve.main:main; do
  IFS=: read -r name module func <<<"$entry"
  printf '#!/usr/bin/env python3\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' "$module" "$func" "$func" \
    > "$BIN/relmt-$name"
  chmod +x "$BIN/relmt-$name"
  [ "$PYBIN" = "$BIN" ] || cp "$BIN/relmt-$name" "$PYBIN/" 2>/dev/null || log "cannot write relmt-$name into $PYBIN"
done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  lscpu | grep "Model name"
  git log -1 --format="git %h %cI" 2>/dev/null
  python3 -c "import torch, datasets, hydra, sacrebleu, sentencepiece, fastapi, uvicorn; print('torch', torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0)); print('datasets', datasets.__version__, 'hydra', hydra.__version__)"
} 2>&1 | tee -a "$OUT/log.txt"
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || { log "no CUDA device: stop"; exit 1; }

# --- the shapes: the GPU's, or a rehearsal's (tiny, the same code paths) ----------------------------------
if [ -n "$REHEARSE" ]; then
  TGT_TOKENS=${TGT_TOKENS:-400}; STEPS=${STEPS:-2}; BASE=${BASE:-tiny}; BIG=${BIG:-toy}; CONV_TOKENS=300
  ATTN_SHAPE=(--lengths 32 16 --tokens 512 --d-model 32 --heads 2 --k 4)
  LABEL_SHAPES=(--shapes 8x2x16x16 2x2x64x64 --repeats 1)
  CONV_UPDATES=4
  M30K_EXTRA=(model=tiny train.max_steps=4 train.eval_every=4 train.save_every=4 decode.beam=2)
  PYTEST_GPU=(tests/test_labels.py)  # the CUDA tests that run under the lane (the rest compile: out of its reach)
  PYTEST_SUITE=(tests/test_labels.py tests/test_layers.py)
  ONMT_ARGS=()  # OpenNMT-py is not in the rehearsal's venv
  PEAK=(--peak-n 256)  # the matmul peak on the CPU at 8192 would take minutes
  # the loop's compile fails on the lane, which runs it eagerly instead
  DECODE_SHAPE=(--vocab 100 --sentences 4 --batch 2 --length 5 --repeats 1 --eager-check)
else
  TGT_TOKENS=${TGT_TOKENS:-25000}; STEPS=${STEPS:-10}; BASE=${BASE:-base}; BIG=${BIG:-big}
  ATTN_SHAPE=(--lengths 1024 128 512)
  LABEL_SHAPES=()
  M30K_EXTRA=()
  PYTEST_GPU=(tests/test_cuda.py tests/test_labels.py tests/test_compiled_training.py tests/test_attention_routes.py tests)
  PYTEST_SUITE=()
  PEAK=()
  DECODE_SHAPE=()
  # shellcheck disable=SC2206
  ONMT_ARGS=(--onmt ${ONMT:-abs rel} --onmt-sizes base --onmt-steps 40 --onmt-warmup 20 --onmt-timeout 90
             --onmt-work "$W/onmt")
fi

# SIZES_KIND=base (scripts/gpu/call.sh 1): train43 at the base size alone, big in its own phase
[ "${SIZES_KIND:-}" = base ] && SIZES=${SIZES:-$BASE} || SIZES=${SIZES:-$BASE $BIG}
CONV=(--updates "${CONV_UPDATES:-300}" --tgt-tokens "${CONV_TOKENS:-8000}")

# --- m30k: the Multi30k recipe on the GPU, in the background -------------------------------------------
if want m30k; then
  M30K_ARGS=(experiment=multi30k_cpu "data.dir=$M30K" seed=1 train.device=cuda train.precision=bf16 threads=2
             train.progress=false "${M30K_EXTRA[@]}")
  log "prepare Multi30k"
  mkdir -p "$W/m30k"
  relmt-prepare "${M30K_ARGS[@]}" > "$W/m30k/prepare.out" 2>&1 || log "prepare failed"
  M30K_PIDS=()
  for pos in ${M30K_POSITIONS:-abs rel both}; do
    ( s=$(date +%s); relmt-train "${M30K_ARGS[@]}" "model.positions=$pos" "out_dir=$W/m30k/m30k_${pos}_s1" \
        > "$W/m30k/m30k_${pos}_s1.out" 2>&1; log "m30k $pos exit $? after $(( $(date +%s) - s ))s" ) &
    M30K_PIDS+=($!)
  done
fi

# --- tests: the CUDA tests ------------------------------------------------------------------------------
if want tests; then
  t=$(box 150); log "CUDA tests (pytest -m gpu), box ${t}s"
  # 4 workers, so that the kernels' compilations overlap; test_cuda.py and test_labels.py first: on 2026-11-27
  # the flex tests' compilations took the whole box alone
  s=$(date +%s)
  timeout "$t" python3 -m pytest -v -n 4 -p no:cacheprovider -p pytest_instant --tb=short -m gpu -rfE --timeout 100 \
    --continue-on-collection-errors "${PYTEST_GPU[@]}" > "$W/tests.txt" 2>&1
  code=$?; log "tests exit $code: $(tail -1 "$W/tests.txt")"
  phase_end tests "$code" $(( $(date +%s) - s )) "$t" tests.txt
fi

# --- attn: attention by route and length ------------------------------------------------------------------
if want attn; then
  t=$(box 60); log "attention routes, box ${t}s"
  # shellcheck disable=SC2086
  run_phase attn "$t" attn.json attn.md -- python3 scripts/bench/bench_attention_routes.py --device cuda --dropout 0 \
    --repeats 3 --min-seconds 0.2 "${ATTN_SHAPE[@]}" \
    --cases ${ATTN_CASES:-abs rel:flex rel:chunked rel:reference rel:reference+scatter t5:flex t5:reference} \
    --out "$W/attn.json" --md "$W/attn.md"
fi

# --- labels: the sums per label each way (issue 68 §3) ------------------------------------------------------
if want labels; then
  t=$(box 40); log "sums per label, box ${t}s"
  run_phase labels "$t" label_sums.json label_sums.md -- python3 scripts/bench/bench_label_sums.py --device cuda \
    "${LABEL_SHAPES[@]}" --out "$W/label_sums.json" --md "$W/label_sums.md"
fi

# --- trainflex: training through FlexAttention, dropout included ------------------------------------------
if want trainflex; then
  t=$(box 120); log "bench_train WMT-like $BASE abs rel bf16 --route flex, box ${t}s"
  run_phase trainflex "$t" train43f.json train43f.md -- python3 scripts/bench/bench_train.py --data "$WMT" \
    --sizes "$BASE" --positions abs rel --precision bf16 --device cuda "${PEAK[@]}" --tgt-tokens "$TGT_TOKENS" --steps 5 --warmup 2 \
    --route flex --out "$W/train43f.json" --md "$W/train43f.md"
fi

# --- train43: training throughput, relmt beside OpenNMT-py ---------------------------------------------
if want train43; then
  t=$(box 400); log "bench_train WMT-like $SIZES bf16, OpenNMT-py ${ONMT:-abs rel}, box ${t}s"
  # shellcheck disable=SC2086
  run_phase train43 "$t" train43.json train43.md -- python3 scripts/bench/bench_train.py --data "$WMT" --sizes $SIZES \
    ${POSITIONS:+--positions $POSITIONS} --precision bf16 --device cuda "${PEAK[@]}" --tgt-tokens "$TGT_TOKENS" --steps "$STEPS" \
    --warmup 2 --profile-steps "${PROFILE_STEPS:-3}" "${ONMT_ARGS[@]}" --out "$W/train43.json" --md "$W/train43.md"
fi

# --- big: the big model, abs and rel (MFU) ------------------------------------------------------------------
if want big; then
  t=$(box 70); log "bench_train WMT-like $BIG abs rel bf16, box ${t}s"
  run_phase big "$t" big.json big.md -- python3 scripts/bench/bench_train.py --data "$WMT" --sizes "$BIG" \
    --positions abs rel --precision bf16 --device cuda "${PEAK[@]}" --tgt-tokens "$TGT_TOKENS" --steps "$STEPS" --warmup 2 \
    --out "$W/big.json" --md "$W/big.md"
fi

# --- compiled: the compiled training step ----------------------------------------------------------------
if want compiled; then
  t=$(box 300); log "bench_train WMT-like $BASE abs rel bf16 compiled, box ${t}s"
  run_phase compiled "$t" train43c.json train43c.md -- python3 scripts/bench/bench_train.py --data "$WMT" \
    --sizes "$BASE" --positions abs rel --precision bf16 --device cuda "${PEAK[@]}" --tgt-tokens "$TGT_TOKENS" --steps "$STEPS" \
    --warmup 2 --compile --out "$W/train43c.json" --md "$W/train43c.md"
fi

# --- issue58: convergence and determinism through flex, the chunked loss's batch, batch orders -----------------
if want conv || want issue58; then
  t=$(box 150); log "route_convergence $BASE rel flex vs reference, bf16, box ${t}s"
  run_phase conv "$t" route_convergence.json route_convergence.md -- python3 \
    scripts/bench/route_convergence.py --data "$WMT" --device cuda --size "$BASE" --positions rel \
    --routes flex reference "${CONV[@]}" --out "$W/route_convergence.json" --md "$W/route_convergence.md"
fi
if want issue58; then
  t=$(box 150); log "loss_memory $BIG rel, whole vs chunked, largest batch, box ${t}s"
  run_phase loss_memory "$t" loss_memory_gpu.json loss_memory_gpu.md -- python3 scripts/bench/loss_memory.py \
    --data "$WMT" --device cuda --size "$BIG" --positions rel --tgt-tokens "$TGT_TOKENS" --steps 3 --warmup 1 \
    --repeats 1 --largest --out "$W/loss_memory_gpu.json" --md "$W/loss_memory_gpu.md"
  t=$(box 150); log "bench_train $BASE rel, loss whole/chunked x batch_by source/longest, box ${t}s"
  run_phase train_orders "$t" train_orders_gpu.json train_orders_gpu.md -- python3 scripts/bench/bench_train.py \
    --data "$WMT" --sizes "$BASE" --positions abs rel --precision bf16 --device cuda "${PEAK[@]}" --tgt-tokens "$TGT_TOKENS" \
    --steps "$STEPS" --warmup 2 --loss whole chunked --batch-by source longest --out "$W/train_orders_gpu.json" \
    --md "$W/train_orders_gpu.md"
fi

# --- decode: a Python step per token against the whole search in one call (issue 76 §4) ---------------------
if want decode; then
  t=$(box 150); log "decode_gpu $BASE rel, per step vs one call, box ${t}s"
  run_phase decode "$t" decode.json decode.md -- python3 scripts/bench/decode_gpu.py --device cuda --size "$BASE" \
    "${DECODE_SHAPE[@]}" --out "$W/decode.json" --md "$W/decode.md"
fi

# --- suite: the rest of the suite on CUDA, -v so that a cut-off run still names its failures -----------
if want suite; then
  t=$(box "${SUITE_TIMEOUT:-420}"); log "whole suite but the slow end-to-end runs (make test-fast), device auto, box ${t}s"
  s=$(date +%s)
  timeout "$t" python3 -m pytest -v -p no:cacheprovider -p pytest_instant --tb=short \
    -m "not slow and not exhaustive and not gpu" -n "${SUITE_WORKERS:-14}" -rfE --timeout 120 -p no:benchmark \
    "${PYTEST_SUITE[@]}" > "$W/suite.txt" 2>&1
  code=$?; log "suite exit $code: $(tail -1 "$W/suite.txt")"
  phase_end suite "$code" $(( $(date +%s) - s )) "$t" suite.txt
fi

if want m30k; then
  log "waiting for the Multi30k runs"
  s=$(date +%s)
  running() { local p; for p in "${M30K_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
  while running && [ $(( $(date +%s) - T0 )) -lt "${M30K_BOX:-400}" ]; do sleep 2; done
  code=0
  for job in "${M30K_PIDS[@]}"; do
    if kill -0 "$job" 2>/dev/null; then
      code=124; log "Multi30k run $job still going at ${M30K_BOX:-400}s: stopped"; pkill -P "$job"; kill "$job" 2>/dev/null
    fi
  done
  sleep 1
  phase_end m30k "$code" $(( $(date +%s) - s )) "${M30K_BOX:-400}" m30k
fi
log "done"
phase_end total 0 $(( $(date +%s) - T0 )) "$TOTAL"
