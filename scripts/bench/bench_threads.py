#!/usr/bin/env python
"""Throughput of sweeps on one machine: one training job with all cores, or one job per core?

Runs `relmt-train` itself (data loading, logging and validation loss included) for --steps updates,
first as one job with --threads threads, then as --threads jobs of one thread each side by side
(seeds 1, 2, ...). Target tokens per second come from each run's metrics.json (`tokens_per_s`, the
time spent in updates); the side-by-side figure is the sum over its jobs, which is what a sweep of
many runs gets. Test decoding is switched off (the test splits are removed) so that only training
is timed. Nothing else may run on the machine meanwhile.

The default workload is the Multi30k CPU recipe (experiment=multi30k_cpu) on ../shared/data/multi30k,
the benchmark corpus of this project's machines; pass --data-dir for another copy.

    python scripts/bench/bench_threads.py --out docs/results/performance/threads_cpu.json \
        --md docs/results/performance/threads_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[2]


def train_jobs(overrides: list[str], threads: list[int], steps: int, work: Path, tag: str, env: dict | None = None,
               spinners: int = 0) -> dict:
    """Start one relmt-train per entry of `threads` at once (`env` added to their environment), beside
    `spinners` processes that each hold one core in a pure-Python loop; wait; return their figures."""
    bin_dir = Path(sys.executable).parent
    procs, dirs = [], []
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    t0 = time.perf_counter()
    for i, n in enumerate(threads):
        run_dir = work / f"{tag}-{i}"
        dirs.append(run_dir)
        cmd = [str(bin_dir / "relmt-train"), *overrides, f"seed={i + 1}", f"threads={n}",
               f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}",
               f"train.log_every={max(steps // 4, 1)}", "train.valid_bleu=false", "train.progress=false",
               f"hydra.run.dir={run_dir}"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **(env or {})}))
    try:
        for p, run_dir in zip(procs, dirs):
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"relmt-train in {run_dir} failed ({p.returncode}):\n{err[-3000:]}")
    finally:
        for p in spin:
            p.kill()
            p.wait()
    wall = time.perf_counter() - t0
    metrics = [json.loads((d / "metrics.json").read_text()) for d in dirs]
    per_job = [m["tokens_per_s"] for m in metrics]
    return {"jobs": len(threads), "threads_per_job": threads[0], "tokens_per_s_per_job": per_job,
            "tokens_per_s_total": sum(per_job), "wall_seconds": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/multi30k"))
    ap.add_argument("--experiment", default="multi30k_cpu")
    ap.add_argument("--positions", nargs="+", default=["rel"])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2, help="cores to share out")
    ap.add_argument("--repeats", type=int, default=2, help="each arrangement runs this often, interleaved")
    ap.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_threads-") as tmp:
        for positions in args.positions:
            overrides = [f"experiment={args.experiment}", f"data.dir={args.data_dir}", f"model.positions={positions}",
                         "~data.splits.test", "~data.splits.test_2017_flickr", "~data.splits.test_2017_mscoco",
                         *args.extra]
            # build the data cache once, outside the timed runs
            subprocess.run([str(Path(sys.executable).parent / "relmt-prepare"), *overrides], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            for r in range(args.repeats):
                for arrangement in ([args.threads], [1] * args.threads):
                    tag = f"{positions}-{len(arrangement)}x{arrangement[0]}-{r}"
                    result = train_jobs(overrides, arrangement, args.steps, Path(tmp), tag)
                    result.update(positions=positions, repeat=r,
                                  arrangement=f"{len(arrangement)} job(s) x {arrangement[0]} thread(s)")
                    rows.append(result)
                    print(f"{result['arrangement']:>24} {positions}: {result['tokens_per_s_total']:,.0f} tgt tok/s "
                          f"in total ({result['wall_seconds']:.0f}s wall)", flush=True)

    summary = []
    for positions in args.positions:
        for arrangement in sorted({r["arrangement"] for r in rows}):
            runs = [r["tokens_per_s_total"] for r in rows if r["positions"] == positions
                    and r["arrangement"] == arrangement]
            summary.append({"positions": positions, "arrangement": arrangement,
                            "tokens_per_s": statistics.median(runs), "runs": len(runs)})
    for positions in args.positions:
        one = next(s for s in summary if s["positions"] == positions and s["arrangement"].startswith("1 "))
        for s in summary:
            if s["positions"] == positions:
                s["vs_one_job"] = s["tokens_per_s"] / one["tokens_per_s"]
    table = markdown_table(summary, [("positions", "positions"), ("arrangement", "arrangement"),
                                     ("tokens_per_s", "target tok/s, all jobs (median)"),
                                     ("vs_one_job", "vs one job"), ("runs", "repeats")])
    print(table)
    hw = hardware()
    payload = {"command": command_line(), "hardware": hw, "steps": args.steps, "summary": summary, "runs": rows}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        Path(args.md).write_text(
            "# Sweep throughput: one job with every core, or one job per core\n\n"
            f"`{command_line()}`\n\n{hw['date']}; {hw['cpu']}, {hw['cpu_count']} cores; torch {hw['torch']}.\n\n"
            f"Each arrangement trains `experiment={args.experiment}` for {args.steps} updates through `relmt-train` "
            "(validation loss included, no test decoding); target tokens/s are the updates' own, summed over "
            f"the jobs running side by side; median of {args.repeats} interleaved repeats.\n\n{table}\n")


if __name__ == "__main__":
    main()
