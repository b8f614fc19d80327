#!/usr/bin/env python
"""CTranslate2 and relmt's fastest engine, each at 1 and 2 threads, on the models of a finished bench_peers run.

scripts/peers/bench_peers.sh gives every toolkit 2 intra-op threads. On some machines CTranslate2 decodes slower
with 2 threads than with 1, which would flatter relmt's ratios to it. This script decodes the rel model of
`scripts/peers/bench_peers.sh` (relmt's checkpoint in --scratch/r1/relmt-rel, its CTranslate2 export in
--scratch/ct2-relmt-rel) with CTranslate2 float32 and with relmt engine=aoti, each at 1 and 2 threads, in
bench_peers' regimes (beam 4, every hypothesis forced to --length tokens, 32 per batch and one at a time), the
systems interleaved over --repeats, and writes the medians and each system's best over its thread settings
against the other's. The page is per host (--md): the ratio one sentence at a time has differed between hosts
by more than 2x. Run nothing else meanwhile.

    python scripts/bench/bench_ct2_threads.py --scratch /tmp/relmt-peers \
        --out docs/results/engines/ct2_threads_cpu.json \
        --md docs/results/engines/ct2_threads_cpu.md
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[2]


def seconds(cmd: list) -> float:
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout
    return float(re.findall(r"^SECONDS ([\d.]+)", out, re.M)[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/relmt-peers"))
    ap.add_argument("--decode-n", type=int, default=500)
    ap.add_argument("--latency-n", type=int, default=100)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    src, ct2 = args.scratch / "corpus" / "test.src", args.scratch / "ct2-relmt-rel"
    checkpoint = args.scratch / "r1" / "relmt-rel" / "checkpoints" / "last.pt"
    missing = [p for p in (src, ct2 / "model.bin", checkpoint) if not p.is_file()]
    if missing:
        sys.exit(f"{', '.join(map(str, missing))}: missing; run scripts/peers/bench_peers.sh first (its --scratch)")
    tmp = args.scratch / "ct2_threads"
    tmp.mkdir(exist_ok=True)
    systems = {
        "CTranslate2 float32, 1 thread": [sys.executable, ROOT / "scripts/peers/ct2_decode.py", "--model", ct2,
                                          "--spm", ct2 / "sentencepiece.model", "--threads", 1],
        "CTranslate2 float32, 2 threads": [sys.executable, ROOT / "scripts/peers/ct2_decode.py", "--model", ct2,
                                           "--spm", ct2 / "sentencepiece.model", "--threads", 2],
        **{f"relmt engine=aoti, {n} thread{'s' * (n > 1)}": [
            sys.executable, ROOT / "scripts/peers/bench_peers.py", "relmt-decode", "--checkpoint", checkpoint,
            "--engine", "aoti", "--threads", n] for n in (1, 2)},
    }
    regimes = (("32 per batch", 32, args.decode_n), ("one at a time", 1, args.latency_n))
    times: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for regime, batch, n in regimes:
            for name, cmd in systems.items():
                s = seconds([*cmd, "--src", src, "--out", tmp / "hyp.txt", "--n", n, "--batch", batch, "--length",
                             args.length])
                times.setdefault((name, regime), []).append(n / s)
                print(f"repeat {repeat + 1} {regime}: {name} {n / s:.1f} sentences/s", flush=True)
    rows = [{"system": name, **{regime: statistics.median(times[name, regime]) for regime, _, _ in regimes}}
            for name in systems]
    def best(regime: str, prefix: str) -> float:  # the faster thread setting of one system
        return max(r[regime] for r in rows if r["system"].startswith(prefix))

    ratios = {regime: best(regime, "relmt") / best(regime, "CTranslate2") for regime, _, _ in regimes}
    table = markdown_table(rows, [("system", "system"), *((r, f"{r}, sentences/s") for r, _, _ in regimes)])
    summary = "; ".join(f"{regime} {ratio:.2f}" for regime, ratio in ratios.items())
    print(f"\n{table}\n\nrelmt engine=aoti / CTranslate2, each at its faster thread setting: {summary}")
    hw = hardware()
    if args.out:
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": vars(args) | {
            "out": None, "md": None, "scratch": None}, "rows": rows, "ratios": ratios, "samples": {
            f"{k[0]} | {k[1]}": v for k, v in times.items()}})
    if args.md:
        args.md.write_text(
            "# CTranslate2 beside relmt engine=aoti, each at 1 and 2 threads (CPU)\n\n"
            "The rel model of scripts/peers/bench_peers.sh (3+3 layers, d_model 256, one relative table shared by the "
            "heads), decoded with beam 4, length penalty 0.6, every hypothesis forced to "
            f"{args.length} tokens: {args.decode_n} sentences at 32 per batch, the first {args.latency_n} one at a "
            f"time; medians of {args.repeats} interleaved repeats. relmt engine=aoti against CTranslate2, each at its "
            f"faster thread setting: {summary}.\n\n- command: `{command_line()}`\n- hardware: {hw['cpu']}, "
            f"{hw['cpu_count']} cores, torch {hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n{table}\n")


if __name__ == "__main__":
    main()
