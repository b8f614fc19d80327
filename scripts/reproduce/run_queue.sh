#!/usr/bin/env bash
# Run a queue of training runs, JOBS at a time (one thread each unless the queue says otherwise),
# resumably, and keep each finished run's small artifacts in git (a machine may be replaced between
# sessions; runs/ is not tracked). Two one-thread jobs side by side train 1.16x faster in total than
# one two-thread job on 2 cores (docs/results/performance/threads_cpu.md), so JOBS defaults to the number of
# cores divided by the queue's threads.
#
#   scripts/reproduce/run_queue.sh QUEUE [NAME ...]     # only the named runs of QUEUE when names are given
#
# QUEUE is a text file (see scripts/reproduce/queues/): `common: OVERRIDES...` lines give overrides for every
# run, `out: DIR` and `keep: DIR` where runs and their kept artifacts go, `threads: N` the threads of
# each run (default 1; JOBS then defaults to the cores divided by N), and every other non-empty,
# non-# line is `NAME OVERRIDES...`, one run. A run whose metrics.json says completed, in OUT or in
# KEEP (committed by an earlier machine), is done and skipped; one with a checkpoint (last.pt or
# step_N.pt) is resumed (train.resume=true). When a run finishes, its metrics.json, config.yaml,
# train.log, metrics.jsonl and translations/ are copied to KEEP/NAME/, ready to commit. Two queues
# can run side by side on one queue file (say, two lanes that each finish their own queue first):
# each run is locked while it trains, and the other queue passes over it.
# DATA (default ../shared/data/multi30k, this project's machines) replaces @DATA in the queue.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
DATA=${DATA:-../shared/data/multi30k}
queue=$1; shift
wanted=("$@")

common=() out="" keep="" threads=1 names=() lines=()
while IFS= read -r line || [[ -n $line ]]; do
    line=${line//@DATA/$DATA}
    [[ -z ${line// } || $line == \#* ]] && continue
    case $line in
        common:*) read -ra more <<< "${line#common:}"; common+=("${more[@]}") ;;
        out:*) out=$(echo ${line#out:}) ;;
        keep:*) keep=$(echo ${line#keep:}) ;;
        threads:*) threads=$(echo ${line#threads:}) ;;
        *) name=${line%% *}
           if (( ${#wanted[@]} == 0 )) || [[ " ${wanted[*]} " == *" $name "* ]]; then
               names+=("$name"); lines+=("$line")
           fi ;;
    esac
done < "$queue"
[[ -n $out && -n $keep ]] || { echo "$queue: needs 'out:' and 'keep:' lines" >&2; exit 2; }
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "$queue: 'threads:' must be a positive integer, got '$threads'" >&2; exit 2; }
JOBS=${JOBS:-$(( $(nproc) / threads > 0 ? $(nproc) / threads : 1 ))}
mkdir -p "$out"

completed() {  # completed FILE: FILE is a whole metrics.json (JSON that parses) whose status is completed;
    # a file cut short (written in place by relmt before 2026-11-26) is not a completed run
    [[ -f $1 ]] && "${PYTHON:-python3}" -c 'import json, sys
sys.exit(json.load(open(sys.argv[1])).get("status") != "completed")' "$1" 2> /dev/null
}

run() {  # run LINE: one run of the queue, resumed if cut off; its artifacts kept when it finishes
    local name=${1%% *} overrides dir resume=()
    read -ra overrides <<< "${1#* }"
    [[ $1 == "$name" ]] && overrides=()
    dir="$out/$name"
    # two queues may share runs (two lanes draining one queue): a run another live queue holds is its
    # business; the lock goes with the process that holds it, so a killed queue leaves none behind
    exec {lock}> "$dir.lock"
    if ! flock -n "$lock"; then
        echo "$(date +%H:%M:%S) skipped $name: another queue is running it"; return 0
    fi
    # an interrupted run writes metrics.json too (status interrupted): only a completed one is done
    if completed "$dir/metrics.json"; then
        echo "done already: $name"; return 0
    fi
    # a run kept in git is done too: a fresh machine has no runs/, and training it again would
    # overwrite the committed artifacts with another run's (KEEP_AGAIN=1 trains it anyway)
    if [[ -z ${KEEP_AGAIN:-} ]] && completed "$keep/$name/metrics.json"; then
        echo "kept already: $name ($keep/$name; KEEP_AGAIN=1 trains it again)"; return 0
    fi
    # any checkpoint means a run to resume (one cut off before last.pt resumes from its step_N.pt)
    if [[ -f $dir/checkpoints/last.pt ]] || compgen -G "$dir/checkpoints/step_*.pt" > /dev/null; then
        resume=(train.resume=true)
    fi
    echo "$(date +%H:%M:%S) start $name ${resume[*]}"
    local status=0
    "$BIN/relmt-train" "${common[@]}" "${overrides[@]}" threads="$threads" train.progress=false \
        "${resume[@]}" "hydra.run.dir=$dir" >> "$dir.out" 2>&1 || status=$?
    if completed "$dir/metrics.json"; then
        mkdir -p "$keep/$name"
        cp "$dir/metrics.json" "$dir/config.yaml" "$dir/train.log" "$dir/metrics.jsonl" "$keep/$name/"
        [[ -d $dir/translations ]] && cp -r "$dir/translations" "$keep/$name/"
        echo "$(date +%H:%M:%S) finished $name -> $keep/$name"
    else
        echo "$(date +%H:%M:%S) stopped $name (exit $status; see $dir.out)"
    fi
}

# the data caches, built once before the parallel jobs (they would wait on the lock otherwise): one
# relmt-prepare per distinct data setting among the selected runs (common and per-run overrides)
data_args() { printf '%s\n' "$@" | grep -E '^(~?data[.=]|experiment=)' || true; }
declare -A prepared=()
for line in "${lines[@]}"; do
    read -ra overrides <<< "${line#* }"
    [[ $line == "${line%% *}" ]] && overrides=()
    mapfile -t args < <(data_args "${common[@]}" "${overrides[@]}")
    key="data: ${args[*]}"  # never empty: bash refuses an empty key (runs that name no data)
    [[ -n ${prepared["$key"]:-} ]] && continue
    prepared["$key"]=1
    "$BIN/relmt-prepare" "${args[@]}" > /dev/null
done
for line in "${lines[@]}"; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
    run "$line" &
done
wait
