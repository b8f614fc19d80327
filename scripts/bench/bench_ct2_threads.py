#!/usr/bin/env python
"""CTranslate2 and relmt's fastest engine, float32 and int8, each at 1 and 2 threads, and relmt-serve on that engine,
on the models of a bench_peers run: every row of issue 62's goals in one run.

scripts/peers/bench_peers.sh gives every toolkit 2 intra-op threads. On some machines CTranslate2 decodes slower
with 2 threads than with 1, which would flatter relmt's ratios to it. This script decodes the rel model of
`scripts/peers/bench_peers.sh` (relmt's checkpoint in --scratch/r1/relmt-rel, its CTranslate2 export in
--scratch/ct2-relmt-rel, made here when missing) with CTranslate2 float32 and int8 and with relmt engine=aoti
float32 and int8 (quantization=int8), each at 1 and 2 threads, and engine=aoti on the per-head rel-heads model too,
in bench_peers' regimes (beam 4, every hypothesis forced to --length tokens, 32 per batch and one at a time), the
systems interleaved over --repeats; then scripts/bench/bench_serve.py with engine=aoti and continuous batching at 1
and 32 clients. It writes the medians and each relmt system's best over its thread settings against CTranslate2's
best at the same precision. The page is per host (--md): the ratio one sentence at a time has differed between
hosts by more than 2x. Run nothing else meanwhile.

    # the models alone (no peers, no decoding) are enough here: a few minutes
    python scripts/peers/bench_peers.py --peers --no-compiled --no-onnx --no-aoti --no-decode --repeats 1 \
        --json /tmp/peers_setup.json --md /tmp/peers_setup.md
    python scripts/bench/bench_ct2_threads.py --scratch /tmp/relmt-peers \
        --out docs/results/engines/ct2_threads_cpu.json \
        --md docs/results/engines/ct2_threads_cpu.md
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[2]


# issue 76's targets (issues 62 and 70 asked 1.0 of each ratio, 0.8 and 1.2 of the server's); a page rebuilt from an
# older run's JSON (--page-from) keeps the targets that run was measured against
TARGETS = {("one at a time", "float32"): "≥ 1.2", ("one at a time", "int8"): "≥ 1.0",
           ("32 per batch", "float32"): "≥ 1.1", ("32 per batch", "int8"): "≥ 1.1"}
SERVE_TARGETS = {"32 clients sentences/s ÷ offline": "≥ 0.85", "1 client p50 ÷ offline": "≤ 1.1"}


def serve_goals(rows: list) -> list[tuple[str, str, str]]:
    """bench_serve's goal rows that this page carries, under issue 76's targets where it sets one (a goal's name
    begins with SERVE_TARGETS' key)."""
    return [(f"relmt-serve engine=aoti continuous: {goal}" if "echo" not in goal else f"relmt-serve: {goal}",
             next((t for key, t in SERVE_TARGETS.items() if goal.startswith(key)), target), value)
            for goal, target, value in rows
            if "32 clients sentences/s" in goal or "1 client p50" in goal or "echo" in goal]


def gemm_gflops(threads: int = 2) -> float:
    """scripts/peers/bench_peers.py's calibration: a 1024^3 float32 GEMM's GFLOP/s in a process of its own."""
    out = subprocess.run([sys.executable, ROOT / "scripts/peers/bench_peers.py", "gemm", "--threads", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


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
    ap.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True,
                    help="also CTranslate2 int8 and relmt engine=aoti quantization=int8 (issue 62)")
    ap.add_argument("--per-head", action=argparse.BooleanOptionalAction, default=True,
                    help="also engine=aoti on bench_peers' rel-heads model (one table per head), which CTranslate2 "
                         "cannot hold")
    ap.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True,
                    help="also scripts/bench/bench_serve.py with engine=aoti and continuous batching, 1 and 32 clients")
    ap.add_argument("--serve-requests", type=int, default=400)
    ap.add_argument("--page-from", type=Path, help="write --md from a run's JSON (--out) and measure nothing")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.page_from:
        args.md.write_text(page(json.loads(args.page_from.read_text())))
        return
    src, ct2 = args.scratch / "corpus" / "test.src", args.scratch / "ct2-relmt-rel"
    checkpoint = args.scratch / "r1" / "relmt-rel" / "checkpoints" / "last.pt"
    heads = args.scratch / "r1" / "relmt-rel-heads" / "checkpoints" / "last.pt"
    missing = [p for p in (src, checkpoint, *[heads] * args.per_head) if not p.is_file()]
    if missing:
        sys.exit(f"{', '.join(map(str, missing))}: missing; run scripts/peers/bench_peers.sh first (its --scratch)")
    if not (ct2 / "model.bin").is_file():  # bench_peers.sh exports it; a run with --no-decode does not
        subprocess.run([Path(sys.executable).parent / "relmt-export", f"checkpoint={checkpoint}", "format=ctranslate2",
                        f"output={ct2}"], check=True)
    tmp = args.scratch / "ct2_threads"
    tmp.mkdir(exist_ok=True)
    precisions = ("float32", "int8") if args.int8 else ("float32",)
    systems: dict[str, tuple[str, str, list]] = {}  # name -> (family, precision, command)
    for precision in precisions:
        for n in (1, 2):
            threads = f"{n} thread{'s' * (n > 1)}"
            systems[f"CTranslate2 {precision}, {threads}"] = ("CTranslate2", precision, [
                sys.executable, ROOT / "scripts/peers/ct2_decode.py", "--model", ct2, "--spm",
                ct2 / "sentencepiece.model", "--threads", n, "--compute-type", precision])
            for family, ck in (("relmt engine=aoti", checkpoint), *[("relmt engine=aoti, per-head", heads)] *
                               args.per_head):
                systems[f"{family} {precision}, {threads}"] = (family, precision, [
                    sys.executable, ROOT / "scripts/peers/bench_peers.py", "relmt-decode", "--checkpoint", ck,
                    "--engine", "aoti", "--quantization", precision, "--threads", n])
    regimes = (("32 per batch", 32, args.decode_n), ("one at a time", 1, args.latency_n))
    times: dict[tuple[str, str], list[float]] = {}
    calibration: list[float] = []  # the host's speed: a 1024^3 float32 GEMM's GFLOP/s on 2 threads, before each repeat
    for repeat in range(args.repeats):
        calibration.append(gemm_gflops())
        print(f"repeat {repeat + 1}: calibration GEMM {calibration[-1]:.1f} GFLOP/s", flush=True)
        for regime, batch, n in regimes:
            for name, (_, _, cmd) in systems.items():
                s = seconds([*cmd, "--src", src, "--out", tmp / "hyp.txt", "--n", n, "--batch", batch, "--length",
                             args.length])
                times.setdefault((name, regime), []).append(n / s)
                print(f"repeat {repeat + 1} {regime}: {name} {n / s:.1f} sentences/s", flush=True)
    rows = [{"system": name, **{regime: statistics.median(times[name, regime]) for regime, _, _ in regimes}}
            for name in systems]

    def best(regime: str, family: str, precision: str) -> float:  # the faster thread setting of one system
        return max(r[regime] for r in rows if systems[r["system"]][:2] == (family, precision))

    ratios = {f"{regime}, {precision}": best(regime, "relmt engine=aoti", precision) /
              best(regime, "CTranslate2", precision) for precision in precisions for regime, _, _ in regimes}
    goals = [(f"{regime}: aoti {p} ÷ CTranslate2 {p}", TARGETS.get((regime, p), "≥ 1.0"),
              f"{ratios[f'{regime}, {p}']:.2f}") for p in precisions for regime, _, _ in regimes]
    by_name = {r["system"]: r for r in rows}
    two_over_one = {(p, regime): by_name[f"CTranslate2 {p}, 2 threads"][regime] /
                    by_name[f"CTranslate2 {p}, 1 thread"][regime] for p in precisions for regime, _, _ in regimes}
    ct2_threads = [(f"{regime}: CTranslate2 {p}, 2 threads ÷ 1 thread", "", f"{ratio:.2f}")
                   for (p, regime), ratio in two_over_one.items()]
    serve = None
    if args.serve:  # the server on the fastest engine, in the same run (bench_serve.py's own goals)
        serve_json = tmp / "serve.json"
        subprocess.run([sys.executable, ROOT / "scripts/bench/bench_serve.py", "--checkpoint", checkpoint,
                        "--engine", "aoti", "--src", src, "--clients", "1", "32", "--batching", "continuous",
                        "--fixed-length", str(args.length), "--beam", "4", "--requests", str(args.serve_requests),
                        "--max-seconds", "60", "--echo", "--json", serve_json, "--md", tmp / "serve.md"], check=True)
        serve = json.loads(serve_json.read_text())
        goals += serve_goals(serve["goals"])
    hw = hardware()
    payload = {"command": command_line(), "hardware": hw, "settings": vars(args) | {
        "out": None, "md": None, "scratch": None}, "rows": rows, "ratios": ratios, "goals": goals,
        "serve": serve, "samples": {f"{k[0]} | {k[1]}": v for k, v in times.items()},
        "calibration_gflops": calibration, "ct2_threads": ct2_threads, "goals_of": "issue 76"}
    text = page(payload)
    print(text)
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(text)


def page(payload: dict) -> str:
    """The Markdown page of a run, from what main() measured (its JSON: --page-from rebuilds a page from one)."""
    settings, hw, serve = payload["settings"], payload["hardware"], payload["serve"]
    regimes = [k for k in payload["rows"][0] if k != "system"]
    table = markdown_table(payload["rows"], [("system", "system"), *((r, f"{r}, sentences/s") for r in regimes)])
    goal_table = "| goal | target | measured |\n|---|---|---|\n" + "\n".join(
        f"| {g} | {t} | {v} |" for g, t, v in payload["goals"] + payload.get("ct2_threads", []))
    calibration = payload.get("calibration_gflops") or []
    host_speed = (f"calibration GEMM (1024^3 float32, 2 threads) before each repeat: median "
                  f"{statistics.median(calibration):.1f} GFLOP/s, range {min(calibration):.1f}-{max(calibration):.1f}"
                  if calibration else "not measured")
    summary = "; ".join(f"{regime} {ratio:.2f}" for regime, ratio in payload["ratios"].items())
    serve_text = ""
    if serve is not None:
        def step(r: dict) -> str:  # the echo rows decode nothing: no step sizes
            return f"{r['mean_batch']:.1f}" if "mean_batch" in r else "—"

        levels = "\n".join(f"| {r['batching']} | {r['clients']} | {r['requests']} | {r['sent_per_s']:.1f} | "
                           f"{1000 * r['p50_s']:.2f} | {1000 * r['p99_s']:.2f} | {step(r)} |" for r in serve["levels"])
        ref = serve["offline"]
        serve_text = (
            "\n## relmt-serve, engine=aoti, continuous batching\n\n`scripts/bench/bench_serve.py` (its command: "
            f"`{serve['command']}`), the rel model over loopback, each client sending one sentence per request; "
            f"offline references in the same run: {ref['batch32_sent_per_s']:.1f} sentences/s at 32 per batch, "
            f"p50 {1000 * ref['single_p50_s']:.1f} ms one at a time. The echo rows are the server's own floor: "
            "relmt-serve whose translator answers at once (scripts/bench/serve_echo.py).\n\n"
            "| server | clients | requests | sentences/s | p50 ms | p99 ms | sentences per step |\n"
            "|---|---|---|---|---|---|---|\n"
            f"{levels}\n")
    return ("# CTranslate2 beside relmt engine=aoti, float32 and int8, each at 1 and 2 threads (CPU)\n\n"
            "The rel model of scripts/peers/bench_peers.sh (3+3 layers, d_model 256, one relative table shared by the "
            "heads), decoded with beam 4, length penalty 0.6, every hypothesis forced to "
            f"{settings['length']} tokens: {settings['decode_n']} sentences at 32 per batch, the first "
            f"{settings['latency_n']} one at a time; medians of {settings['repeats']} interleaved repeats. CTranslate2 "
            "decodes relmt's export of the model (relmt-export format=ctranslate2), int8 by its compute type; relmt "
            "engine=aoti quantization=int8 is relmt/export/quantize.py's."
            + (" The per-head rows are bench_peers' rel-heads model (one table per head), which CTranslate2 cannot "
               "hold." if settings.get("per_head") else "")
            + f" Ratios take each system at its faster thread setting: {summary}.\n\n"
            f"- command: `{payload['command']}`\n- hardware: {hw['cpu']}, {hw['cpu_count']} cores, torch "
            f"{hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n- host speed: {host_speed}\n\n"
            f"## Goals ({payload.get('goals_of', 'issues 62 and 70')})\n\n{goal_table}\n\n## Decoding\n\n{table}\n"
            f"{serve_text}")

if __name__ == "__main__":
    main()
