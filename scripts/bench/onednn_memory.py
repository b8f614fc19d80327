#!/usr/bin/env python
"""Resident memory and speed of CPU training with oneDNN's primitive caches bounded (relmt's default), unbounded
(oneDNN's and ideep's default of 1,024 primitives each) and with MKL's products (RELMT_CPU_GEMM=mkl).

relmt/model/linear.py says why: a cached oneDNN primitive keeps its scratchpad, which holds the weight operand in
oneDNN's layout (g^T for dW, as large as the logits' gradient for the output layer), and token-budget batches
bring a new shape nearly every update. Each variant runs `relmt-train` on Multi30k at Wu et al.'s recipe
(experiment=multi30k_wu2021, the issue 46 runs, one thread) for --steps updates without validation, one after
the other; the script samples the process's resident memory (VmRSS) every 0.2 s. Needs a quiet machine, and
memory for the unbounded variant (about 0.16 GB an update). Reads ../shared/data/multi30k by default.

    python scripts/bench/onednn_memory.py --out docs/results/performance/onednn_memory.json \
        --md docs/results/performance/onednn_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.model.linear import CACHES

VARIANTS = {  # name -> the environment it adds
    "oneDNN, caches bounded (relmt's default)": {},
    "oneDNN, caches unbounded (1,024 each, oneDNN's default)": dict.fromkeys(CACHES, "1024"),
    "MKL (RELMT_CPU_GEMM=mkl)": {"RELMT_CPU_GEMM": "mkl"},
}
STEP = re.compile(r"\] - step (\d+) \|")


def rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), None)


def train(index: int, name: str, env: dict, args: argparse.Namespace, work: Path) -> dict:
    """One relmt-train run, its resident memory sampled: the peak, and the MiB per update from the first logged
    update on (after the first updates' allocations)."""
    run, log = work / f"run{index}", work / f"run{index}.log"
    cmd = [str(Path(sys.executable).parent / "relmt-train"), "experiment=multi30k_wu2021", f"data.dir={args.data}",
           f"model.positions={args.positions}", "threads=1", "train.progress=false",
           f"train.max_steps={args.steps}", "train.eval_every=100000", "train.save_every=100000",
           f"train.log_every={args.log_every}", "train.test_checkpoint=last", "train.average_last=0",
           "~data.splits.test", "~data.splits.test_2017_flickr", "~data.splits.test_2017_mscoco",
           f"hydra.run.dir={run}", *args.set]
    full_env = {**{k: v for k, v in os.environ.items() if k not in CACHES}, **env, "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        samples: list[tuple[int, float]] = []  # (last logged update, MiB)
        while proc.poll() is None:
            steps = STEP.findall(log.read_text())
            if (mib := rss_mib(proc.pid)) is not None:
                samples.append((int(steps[-1]) if steps else 0, mib))
            time.sleep(0.2)
    if proc.returncode:
        raise SystemExit(f"{name}: relmt-train exited {proc.returncode}; see {log}")
    metrics = json.loads((run / "metrics.json").read_text())
    first = min((s for s, _ in samples if s), default=None)
    start = min((m for s, m in samples if s == first), default=None)
    peak = max(m for _, m in samples)
    growth = (peak - start) / (args.steps - first) if first is not None and args.steps > first else None
    return {"variant": name, "env": env, "steps": args.steps, "tokens_per_s": metrics["tokens_per_s"],
            "peak_rss_mib": peak, "rss_at_first_log_mib": start, "first_logged_update": first,
            "mib_per_update": growth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/multi30k", help="Multi30k as {split}.{en,de} text")
    ap.add_argument("--positions", default="rel")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more relmt-train overrides")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [train(i, name, env, args, Path(work)) for i, (name, env) in enumerate(VARIANTS.items())]
    payload = {"command": command_line(), "hardware": hardware(), "rows": rows}
    write_json(args.out, payload)
    hw, overrides = payload["hardware"], "".join(f" {o}" for o in args.set)
    table = markdown_table(rows, [("variant", "linear maps"), ("tokens_per_s", "target tok/s"),
                                  ("peak_rss_mib", "peak resident MiB"), ("mib_per_update", "MiB per update")])
    args.md.write_text(
        "# CPU training's resident memory with oneDNN's primitive caches\n\n"
        f"`relmt-train experiment=multi30k_wu2021 model.positions={args.positions}{overrides}`, {args.steps} "
        "updates without validation, one thread, each variant in turn (relmt/model/linear.py says why the caches "
        "grow). MiB per update: the peak resident memory less the memory at the first logged update, per update "
        "since.\n\n"
        f"- command: `{payload['command']}`\n- hardware: {hw['cpu']}, {hw['cpu_count']} cores, torch {hw['torch']}\n"
        f"- date: {hw['date']} (git {hw['git']})\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
