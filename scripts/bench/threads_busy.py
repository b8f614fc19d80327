#!/usr/bin/env python
"""Every command's default threads on a shared machine (issue 74 §2): relmt-train, relmt-translate and relmt-serve
each at their default (threads=0: the cores free at start, relmt/runtime.py choose_threads) and at every explicit
thread count, quiet and beside a pure-Python loop that holds one core (another user's job). Run it alone.

- train: `make train`'s job (the toy corpus, relative positions) for --steps updates: target tokens/s from its
  metrics.json (scripts/bench/bench_threads.py's train_jobs);
- translate: relmt-translate of the toy test set (--lines) with --checkpoint: sentences/s of the whole command;
- serve: relmt-serve with --checkpoint, 32 clients for --seconds (bench_serve's drive): sentences/s.
The settings run interleaved, --repeats times; medians. The goal: beside the spinner, each default within 1.3x of
that command's best setting (best ÷ default <= 1.3).

    python scripts/bench/threads_busy.py --checkpoint runs/toy/checkpoints/best.pt \\
        --out docs/results/performance/threads_busy.json --md docs/results/performance/threads_busy.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import drive  # noqa: E402
from bench_threads import ROOT, train_jobs  # noqa: E402
from serve_fairness import Server  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, write_json  # noqa: E402

CORES = os.cpu_count() or 1
ENV = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RELMT_SERVE_API_KEY")}


def spinners(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(1.0)  # running before the command starts and counts the free cores
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def train(threads: int, args, work: Path, tag: str) -> float:
    overrides: list[str] = []  # make train's job: configs/config.yaml
    return train_jobs(overrides, [threads], args.steps, work, tag)["tokens_per_s_total"]


def translate(threads: int, args, work: Path, tag: str) -> float:
    out = work / f"{tag}.out"
    cmd = [str(Path(sys.executable).parent / "relmt-translate"), f"checkpoint={args.checkpoint}",
           f"input={args.input}", f"output={out}", f"threads={threads}", "progress=false"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return args.lines / (time.perf_counter() - t)


def serve(threads: int, args, work: Path, tag: str) -> float:
    server = Server(args.checkpoint, threads, work / f"{tag}.log", "queue_size=512")
    try:
        sentences = Path(args.input).read_text().splitlines()
        asyncio.run(drive(server.url, sentences, 4, 20, 5))  # warm-up
        return asyncio.run(drive(server.url, sentences, 32, 10 ** 6, args.seconds))["sent_per_s"]
    finally:
        server.stop()


COMMANDS = {"relmt-train (target tok/s)": train, "relmt-translate (sentences/s)": translate,
            "relmt-serve, 32 clients (sentences/s)": serve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "runs/toy/checkpoints/best.pt")
    ap.add_argument("--input", type=Path, help="sentences to translate and serve (default: the toy test set)")
    ap.add_argument("--lines", type=int, default=500)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--commands", nargs="+", default=list(COMMANDS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="threads-busy-"))
    if args.input is None:
        from relmt.data.toy import generate

        test = generate(seed=1, n_train=0, n_valid=0, n_test=args.lines, n_test_long=0)["test"]
        args.input = work / "test.src"
        args.input.write_text("".join(src + "\n" for src, _ in test), encoding="utf-8")
    args.lines = len(args.input.read_text().splitlines())
    settings = [0, *range(1, CORES + 1)]
    figures: dict[tuple, list[float]] = {}
    for r in range(args.repeats):
        for machine, spin in (("quiet", 0), ("a spinner holds one core", 1)):
            for name in args.commands:
                for threads in settings:
                    procs = spinners(spin)
                    try:
                        value = COMMANDS[name](threads, args, work, f"r{r}-{spin}-{threads}-{len(figures)}")
                    finally:
                        stop(procs)
                    figures.setdefault((machine, name, threads), []).append(value)
                    print(f"{machine:26s} {name:40s} threads={threads}: {value:,.1f}", flush=True)
    rows = []
    for machine in ("quiet", "a spinner holds one core"):
        for name in args.commands:
            med = {t: statistics.median(figures[(machine, name, t)]) for t in settings}
            best = max(med.values())
            for t in settings:
                rows.append({"machine": machine, "command": name, "threads": "0 (default: free cores)" if t == 0
                             else str(t), "value": med[t], "best_over_this": best / med[t],
                             "repeats": len(figures[(machine, name, t)])})
    goal = [r for r in rows if r["machine"] != "quiet" and r["threads"].startswith("0")]
    met = all(r["best_over_this"] <= 1.3 for r in goal)
    table = markdown_table(rows, [("machine", "machine"), ("command", "command"), ("threads", "threads"),
                                  ("value", "median"), ("best_over_this", "best ÷ this"), ("repeats", "repeats")])
    hw = hardware()
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "rows": rows,
               "goal_met": met}
    print(table)
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            f"# Every command's default threads on a shared machine (issue 74 §2)\n\n- command: "
            f"`{payload['command']}`\n- hardware: {hw.get('cpu')}, {hw.get('cpu_count')} cores, torch "
            f"{hw.get('torch')}, git {hw.get('git')}\n- date: {hw.get('date')}\n\nThreads 0 is every command's "
            "default: the cores other processes leave free at start. The goal: beside the spinner, each default "
            f"within 1.3x of the command's best setting (best ÷ this <= 1.3): **{'met' if met else 'missed'}**."
            f"\n\n{table}\n")


if __name__ == "__main__":
    main()
