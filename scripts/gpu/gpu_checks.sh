#!/usr/bin/env bash
# The GPU checks (../shared/GPU.md, issue 43) in one run on a CUDA machine. Each phase is time-boxed, and the
# boxes shrink to fit TOTAL seconds (default 540: the default set ends inside 9 minutes on an H100 or H200).
# Phases (PHASES, default "tests attn trainflex train43"):
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
#   m30k     the Multi30k recipe on the GPU (M30K_POSITIONS, default "abs rel both"), in the background beside
#            the phases above (issue 31; needs data/multi30k), stopped at M30K_BOX seconds (default 400)
# Carry (the run tool's carry list; ignored paths that must travel with the checkout, about 25 MB together):
#   .whl                 wheels of the packages the GPU machine lacks: scripts/gpu/gpu_wheels.sh fills it
#   data/bench/wmt_like  the WMT-like workload: python scripts/bench/bench_train.py --prepare-only (on a CPU)
#   data/multi30k        for m30k only (data/get_multi30k.sh)
# The call (the device tool's run):
#   command: bash scripts/gpu/gpu_checks.sh     carry: [".whl", "data/bench/wmt_like"]     timeout_s: 600
# It writes to $OUT log.txt, tests.txt, attn.json, attn.md, train43f.json, train43.json, train43.md, train43c.json, suite.txt
# and extra.tgz (OpenNMT-py's logs and configs, the Multi30k runs): a call brings back 8 files at most, so the
# suite goes in a call of its own.
# python scripts/gpu/gpu_report.py --dir DIR turns them into docs/results/gpu/gpu_*.md.
set -u
OUT=${OUT:?set OUT}
TOTAL=${TOTAL:-540}
M30K=${M30K:-data/multi30k}
WMT=${WMT:-data/bench/wmt_like}
PHASES=" ${PHASES:-tests attn trainflex train43} "
want() { [[ "$PHASES" == *" $1 "* ]]; }
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }
# the box of a phase: its own, cut to what is left of TOTAL (10 s kept for packing up)
box() { local left=$(( TOTAL - ($(date +%s) - T0) - 10 )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
EXTRA=/tmp/gpu_extra
mkdir -p "$EXTRA"

# --- set-up: the missing packages from wheels, relmt from this checkout, its console scripts -----------
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { log "wheel install failed"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site:$PWD/scripts/gpu PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1
# The console scripts go beside the interpreter too: the tests run them as Path(sys.executable).parent/relmt-*,
# as in a venv (the 2026-11-27 suite lost every test_train_cli, lifecycle and patience test to their absence).
PYBIN=$(python3 -c "import os, sys; print(os.path.dirname(sys.executable))")
mkdir -p /tmp/bin
for entry in prepare:relmt.cli.prepare:main train:relmt.cli.train:main average:relmt.cli.average:main \
             translate:relmt.cli.translate:main score:relmt.cli.score:main export:relmt.cli.export:main \
             report:relmt.cli.report:main; do
  IFS=: read -r name module func <<<"$entry"
  printf '#!/usr/bin/env python3\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' "$module" "$func" "$func" \
    > "/tmp/bin/relmt-$name"
  chmod +x "/tmp/bin/relmt-$name"
  cp "/tmp/bin/relmt-$name" "$PYBIN/" 2>/dev/null || log "cannot write relmt-$name into $PYBIN"
done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep "Model name"
  git log -1 --format="git %h %cI" 2>/dev/null
  python3 -c "import torch, datasets, hydra, sacrebleu, sentencepiece; print('torch', torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0)); print('datasets', datasets.__version__, 'hydra', hydra.__version__)"
} 2>&1 | tee -a "$OUT/log.txt"

# --- m30k: the Multi30k recipe on the GPU, in the background -------------------------------------------
if want m30k; then
  M30K_ARGS=(experiment=multi30k_cpu "data.dir=$M30K" seed=1 train.device=cuda train.precision=bf16 train.num_threads=2
             train.progress=false)
  log "prepare Multi30k"
  mkdir -p runs/gpu
  relmt-prepare "${M30K_ARGS[@]}" > runs/gpu/prepare.out 2>&1 || log "prepare failed"
  for pos in ${M30K_POSITIONS:-abs rel both}; do
    ( s=$(date +%s); relmt-train "${M30K_ARGS[@]}" "model.positions=$pos" "out_dir=runs/gpu/m30k_${pos}_s1" \
        > "runs/gpu/m30k_${pos}_s1.out" 2>&1; log "m30k $pos exit $? after $(( $(date +%s) - s ))s" ) &
  done
fi

# --- tests: the CUDA tests ------------------------------------------------------------------------------
if want tests; then
  t=$(box 150); log "CUDA tests (pytest -m gpu), box ${t}s"
  # 4 workers, so that the kernels' compilations overlap; test_cuda.py and test_labels.py first: on 2026-11-27
  # the flex tests' compilations took the whole box alone
  timeout "$t" python3 -m pytest -v -n 4 -p no:cacheprovider -p pytest_instant --tb=short -m gpu -rfE --timeout 100 \
    --continue-on-collection-errors tests/test_cuda.py tests/test_labels.py tests/test_compiled_training.py \
    tests/test_attention_routes.py tests > "$OUT/tests.txt" 2>&1
  log "tests exit $?: $(tail -1 "$OUT/tests.txt")"
fi

# --- attn: attention by route and length ------------------------------------------------------------------
if want attn; then
  t=$(box 60); log "attention routes, box ${t}s"
  if [ -f scripts/bench/bench_attention_routes.py ]; then
    # shellcheck disable=SC2086
    timeout "$t" python3 scripts/bench/bench_attention_routes.py --device cuda --dropout 0 --repeats 3 --min-seconds 0.2 \
      --lengths 1024 128 512 \
      --cases ${ATTN_CASES:-abs rel:flex rel:chunked rel:reference rel:reference+scatter t5:flex t5:reference} \
      --out "$OUT/attn.json" --md "$OUT/attn.md" >> "$OUT/log.txt" 2>&1
  else
    timeout "$t" python3 scripts/bench/bench_attention.py --device cuda --min-seconds 0.2 --repeats 3 \
      --variants abs rel rope alibi t5 --out "$OUT/attn.json" --md "$OUT/attn.md" >> "$OUT/log.txt" 2>&1
  fi
  log "attn exit $?"
fi

# --- labels: the sums per label each way (issue 68 §3) ------------------------------------------------------
if want labels; then
  t=$(box 40); log "sums per label, box ${t}s"
  timeout "$t" python3 scripts/bench/bench_label_sums.py --device cuda --out "$OUT/label_sums.json" \
    --md "$OUT/label_sums.md" >> "$OUT/log.txt" 2>&1
  log "labels exit $?"
fi

# --- trainflex: training through FlexAttention, dropout included ------------------------------------------
if want trainflex; then
  t=$(box 120); log "bench_train WMT-like base abs rel bf16 --route flex, box ${t}s"
  timeout "$t" python3 scripts/bench/bench_train.py --data "$WMT" --sizes base --positions abs rel --precision bf16 \
    --device cuda --tgt-tokens "${TGT_TOKENS:-25000}" --steps 5 --warmup 2 --route flex --out "$OUT/train43f.json" \
    --md "$EXTRA/train43f.md" >> "$OUT/log.txt" 2>&1
  log "trainflex exit $?"
fi

# --- train43: training throughput, relmt beside OpenNMT-py ---------------------------------------------
if want train43; then
  t=$(box 400); log "bench_train WMT-like base big bf16, OpenNMT-py abs rel, box ${t}s"
  timeout "$t" python3 scripts/bench/bench_train.py --data "$WMT" --sizes base big --precision bf16 --device cuda \
    --tgt-tokens "${TGT_TOKENS:-25000}" --steps "${STEPS:-10}" --warmup 2 --profile-steps 3 --onmt ${ONMT:-abs rel} --onmt-sizes base --onmt-steps 40 \
    --onmt-warmup 20 --onmt-timeout 90 --onmt-work "$EXTRA/onmt" --out "$OUT/train43.json" --md "$OUT/train43.md" \
    >> "$OUT/log.txt" 2>&1
  log "train43 exit $?"
fi

# --- compiled: the compiled training step ----------------------------------------------------------------
if want compiled; then
  t=$(box 300); log "bench_train WMT-like base abs rel bf16 compiled, box ${t}s"
  timeout "$t" python3 scripts/bench/bench_train.py --data "$WMT" --sizes base --positions abs rel --precision bf16 \
    --device cuda --tgt-tokens "${TGT_TOKENS:-25000}" --steps "${STEPS:-10}" --warmup 2 --compile \
    --out "$OUT/train43c.json" --md "$EXTRA/train43c.md" >> "$OUT/log.txt" 2>&1
  log "compiled exit $?"
fi

# --- issue58: convergence and determinism through flex, the chunked loss's batch, batch orders -----------------
if want issue58; then
  t=$(box 150); log "route_convergence base rel flex vs reference, 300 bf16 updates, box ${t}s"
  timeout "$t" python3 scripts/bench/route_convergence.py --data "$WMT" --device cuda --size base --positions rel \
    --routes flex reference --updates "${CONV_UPDATES:-300}" --out "$OUT/route_convergence.json" \
    --md "$OUT/route_convergence.md" >> "$OUT/log.txt" 2>&1
  log "route_convergence exit $?"
  t=$(box 150); log "loss_memory big rel, whole vs chunked, largest batch, box ${t}s"
  timeout "$t" python3 scripts/bench/loss_memory.py --data "$WMT" --device cuda --size big --positions rel \
    --tgt-tokens 25000 --steps 3 --warmup 1 --repeats 1 --largest --out "$OUT/loss_memory_gpu.json" \
    --md "$OUT/loss_memory_gpu.md" >> "$OUT/log.txt" 2>&1
  log "loss_memory exit $?"
  t=$(box 150); log "bench_train base rel, loss whole/chunked x batch_by source/longest, box ${t}s"
  timeout "$t" python3 scripts/bench/bench_train.py --data "$WMT" --sizes base --positions abs rel --precision bf16 \
    --device cuda --tgt-tokens "${TGT_TOKENS:-25000}" --steps "${STEPS:-10}" --warmup 2 --loss whole chunked \
    --batch-by source longest --out "$OUT/train_orders_gpu.json" --md "$OUT/train_orders_gpu.md" >> "$OUT/log.txt" 2>&1
  log "train_orders exit $?"
fi

# --- suite: the rest of the suite on CUDA, -v so that a cut-off run still names its failures -----------
if want suite; then
  t=$(box "${SUITE_TIMEOUT:-420}"); log "whole suite but the slow end-to-end runs (make test-fast), device auto, box ${t}s"
  timeout "$t" python3 -m pytest -v -p no:cacheprovider -p pytest_instant --tb=short \
    -m "not slow and not exhaustive and not gpu" -n 14 -rfE --timeout 120 -p no:benchmark > "$OUT/suite.txt" 2>&1
  log "suite exit $?: $(tail -1 "$OUT/suite.txt")"
fi

if want m30k; then
  log "waiting for the Multi30k runs"
  while [ "$(jobs -r | wc -l)" -gt 0 ] && [ $(( $(date +%s) - T0 )) -lt "${M30K_BOX:-400}" ]; do sleep 5; done
  if [ "$(jobs -r | wc -l)" -gt 0 ]; then
    log "Multi30k runs still going at ${M30K_BOX:-400}s: stopped"
    for job in $(jobs -p); do pkill -P "$job"; kill "$job" 2>/dev/null; done
    sleep 3
  fi
  cp -r runs/gpu "$EXTRA/m30k"
fi
find "$EXTRA" -name "*.pt" -delete
tar czf "$OUT/extra.tgz" --exclude=checkpoints --exclude=tb --exclude=text -C "$EXTRA" . 2>/dev/null
log "done"
