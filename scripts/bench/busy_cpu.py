#!/usr/bin/env python
"""Training on a busy machine: how much OpenMP threads that spin cost when other processes hold the
cores, and what a passive wait policy costs on a quiet machine (issue 57).

Every arrangement runs `relmt-train` itself (scripts/bench/bench_threads.py's train_jobs) for --steps
updates of the Multi30k CPU recipe, with test decoding off, and reads each job's target tokens/s
from its metrics.json. Three machines:
- quiet: the job alone;
- two jobs: a second relmt-train with the same settings beside it (a sweep, or a colleague's run);
- a spinner: a pure-Python loop holding one core beside it.
and three thread settings for the timed job(s): torch's default threads (one per core) with libgomp's
default wait (threads spin about 300,000 times before they sleep: GOMP_SPINCOUNT=300000, which is
what an unset OMP_WAIT_POLICY gives), the same threads with OMP_WAIT_POLICY=PASSIVE (they sleep at
once), the same threads with a short spin (GOMP_SPINCOUNT=10000, about 0.1 ms), and
threads=1. The arrangements run interleaved, --repeats times; the table gives
medians. Nothing else may run on the machine meanwhile.

The default corpus is ../shared/data/multi30k, this project's machines' copy; pass --data-dir for another.

    python scripts/bench/busy_cpu.py --out docs/results/performance/busy_cpu.json \\
        --md docs/results/performance/busy_cpu.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import ROOT, train_jobs  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, write_json  # noqa: E402

# (setting, threads of the timed job (one per core: torch's default before issue 74's threads=0), environment)
CORES = os.cpu_count() or 1
SETTINGS = [("default threads, spin (libgomp)", CORES, {"GOMP_SPINCOUNT": "300000"}),  # libgomp's default wait
            ("default threads, passive", CORES, {"OMP_WAIT_POLICY": "PASSIVE"}),
            # about 0.1 ms of spinning (libgomp counts 100,000 spins a millisecond)
            ("default threads, short spin", CORES, {"GOMP_SPINCOUNT": "10000"}),
            ("num_threads=1", 1, {"GOMP_SPINCOUNT": "300000"})]
# (machine, jobs side by side with the timed job's settings, pure-Python spinners beside them)
MACHINES = [("quiet", 1, 0), ("two jobs", 2, 0), ("a spinner", 1, 1)]
ARRANGEMENTS = [(machine, setting, threads, jobs, spinners, env)
                for machine, jobs, spinners in MACHINES for setting, threads, env in SETTINGS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/multi30k"))
    ap.add_argument("--experiment", default="multi30k_cpu")
    ap.add_argument("--positions", default="rel")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="each arrangement runs this often, interleaved")
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()

    overrides = [f"experiment={args.experiment}", f"data.dir={args.data_dir}", f"model.positions={args.positions}",
                 "~data.splits.test", "~data.splits.test_2017_flickr", "~data.splits.test_2017_mscoco"]
    subprocess.run([str(Path(sys.executable).parent / "relmt-prepare"), *overrides], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    rows = []
    with tempfile.TemporaryDirectory(prefix="busy_cpu-") as tmp:
        for r in range(args.repeats):
            for i, (machine, setting, threads, jobs, spinners, env) in enumerate(ARRANGEMENTS):
                result = train_jobs(overrides, [threads] * jobs, args.steps, Path(tmp), f"{i}-{r}", env, spinners)
                rows.append({"machine": machine, "setting": setting, "repeat": r, "env": env,
                             "tokens_per_s": result["tokens_per_s_per_job"][0], **result})
                print(f"{machine:>10} | {setting:<32} | {rows[-1]['tokens_per_s']:8,.0f} tgt tok/s (first job; "
                      f"{result['wall_seconds']:.0f}s wall)", flush=True)

    summary = []
    for machine, setting, *_ in ARRANGEMENTS:
        runs = [r["tokens_per_s"] for r in rows if (r["machine"], r["setting"]) == (machine, setting)]
        summary.append({"machine": machine, "setting": setting, "tokens_per_s": statistics.median(runs),
                        "runs": len(runs)})
    quiet = summary[0]["tokens_per_s"]
    for s in summary:
        s["vs_quiet_default"] = s["tokens_per_s"] / quiet
    table = markdown_table(summary, [("machine", "machine"), ("setting", "threads of the timed job"),
                                     ("tokens_per_s", "target tok/s of one job (median)"),
                                     ("vs_quiet_default", "vs quiet, default"), ("runs", "repeats")])
    print(table)
    hw = hardware()
    payload = {"command": command_line(), "hardware": hw, "steps": args.steps, "summary": summary, "runs": rows}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        Path(args.md).write_text(
            "# Training on a busy machine: spinning OpenMP threads and a passive wait\n\n"
            f"`{command_line()}`\n\n{hw['date']}; {hw['cpu']}, {hw['cpu_count']} cores; torch {hw['torch']}.\n\n"
            f"Each row trains `experiment={args.experiment} model.positions={args.positions}` for {args.steps} "
            "updates through `relmt-train` (validation loss included, no test decoding) and gives the target "
            "tokens/s of one job. *two jobs*: a second relmt-train with the same settings runs beside it; "
            "*a spinner*: a pure-Python loop holds one core. *spin (libgomp)*: GOMP_SPINCOUNT=300000, libgomp's "
            "wait when OMP_WAIT_POLICY is unset; *passive*: OMP_WAIT_POLICY=PASSIVE; *short spin*: "
            "GOMP_SPINCOUNT=10000. Median of "
            f"{args.repeats} interleaved repeats.\n\n{table}\n")


if __name__ == "__main__":
    main()
