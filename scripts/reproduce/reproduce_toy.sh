#!/usr/bin/env bash
# The paper's claims, reproduced on the toy corpus on CPU (under 45 minutes on 2 cores):
#   Table 1: abs, rel and both;  Table 2: k in {0, 1, 2, 4, 16, 64, 256};  Table 3: a^K / a^V on/off;
#   length generalisation: BLEU by source length on test (1-16 words) and test_long (17-32 words).
# Every setting runs with seeds 1 and 2, two jobs side by side with one thread each. The rel run
# (k = 16, a^K and a^V on) is shared by all three tables, so the k and (a^K, a^V) sweeps leave it out.
# Then scripts/reproduce/paper_tables.py writes docs/results/reproduction/toy_400updates.md with the tables, the claims and
# the plots: 400 updates, a quick check of the pipeline. docs/results/reproduction/toy.md holds the runs trained to
# convergence (scripts/reproduce/queues/toy_converged.txt).
#
#   scripts/reproduce/reproduce_toy.sh             # OUT=runs/reproduce_toy JOBS=2 by default
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/reproduce_toy}
JOBS=${JOBS:-2}
THREADS=$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))
SEEDS=${SEEDS:-1,2}
common=(hydra/launcher=parallel "hydra.launcher.n_jobs=$JOBS" "threads=$THREADS" train.progress=false
        train.eval_every=400 train.save_every=400 "seed=$SEEDS")

start=$(date +%s)
rm -rf "$OUT"
"$BIN/relmt-prepare" > /dev/null  # the toy data cache, built once before the parallel jobs

"$BIN/relmt-train" -m "${common[@]}" experiment=toy_abs,toy_rel,toy_both hydra.sweep.dir="$OUT/positions"
"$BIN/relmt-train" -m "${common[@]}" experiment=k_ablation "model.max_relative_position=0,1,2,4,64,256" \
    hydra.sweep.dir="$OUT/k"
for kv in "true false" "false true" "false false"; do
    set -- $kv
    "$BIN/relmt-train" -m "${common[@]}" experiment=kv_ablation "model.relative_keys=$1" "model.relative_values=$2" \
        hydra.sweep.dir="$OUT/kv_$1_$2"
done

minutes=$(( ($(date +%s) - start + 59) / 60 ))
"$BIN/python" scripts/reproduce/paper_tables.py "$OUT" out=docs/results/reproduction name=toy_400updates \
    "title=Toy corpus reproduction (CPU)" overwrite=true \
    "command=scripts/reproduce/reproduce_toy.sh (JOBS=$JOBS, SEEDS=$SEEDS; training took $minutes min wall)"
