#!/usr/bin/env python
"""relmt-serve on engine=aoti with libgomp's default spin and with a short one (issue 76's serving rows): a lead
from scripts/bench/omp_spin.py, where the compiled kernels' OpenMP workers keep a second core busy between parallel
regions. On a machine whose cores the server shares with its HTTP side and its clients, that spin is taken from
them. Run it alone on the machine.

    python scripts/bench/serve_spin.py --checkpoint runs/deploy_toy/checkpoints/best.pt --src data/toy_text/test.src \\
        --out docs/results/performance/serve_spin.json --md docs/results/performance/serve_spin.md

Each repeat runs scripts/bench/bench_serve.py (continuous batching, 1 and 32 clients) once per setting, the settings
interleaved; a setting's environment goes to relmt-serve's process alone (--server-env), so the offline references
(decoded in bench_serve's own process) run with libgomp's defaults in every run. Reported per setting, the median
over the repeats: sentences/s and p50 at 1 and 32 clients, and bench_serve's two ratios to offline decoding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import command_line, hardware, markdown_table, page_head, write_json  # noqa: E402

SETTINGS = {"libgomp's defaults": [], "GOMP_SPINCOUNT=1000": ["GOMP_SPINCOUNT=1000"]}


def one_run(args: argparse.Namespace, env: list[str], out: Path) -> dict:
    command = [sys.executable, str(ROOT / "scripts/bench/bench_serve.py"), "--checkpoint", str(args.checkpoint),
               "--engine", args.engine, "--src", str(args.src), "--clients", "1", "32", "--requests",
               str(args.requests), "--max-seconds", str(args.max_seconds), "--batching", "continuous", "--threads",
               str(args.threads), "--json", str(out), "--md", str(out.with_suffix(".md")),
               *(["--server-env", *env] if env else [])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(f"bench_serve exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    level = {lv["clients"]: lv for lv in result["levels"]}
    offline = result["offline"]
    return {"one_sent_s": level[1]["sent_per_s"], "one_p50_ms": 1e3 * level[1]["p50_s"],
            "many_sent_s": level[32]["sent_per_s"], "many_p50_ms": 1e3 * level[32]["p50_s"],
            "many_over_offline": level[32]["sent_per_s"] / offline["batch32_sent_per_s"],
            "one_p50_over_offline": level[1]["p50_s"] / offline["single_p50_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("runs/deploy_toy/checkpoints/best.pt"))
    ap.add_argument("--src", type=Path, default=Path("data/toy_text/test.src"), help="`make toy-text` writes it")
    ap.add_argument("--engine", default="aoti")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--max-seconds", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="serve-spin-") as tmp:
        for repeat in range(args.repeats):
            for i, (name, env) in enumerate(SETTINGS.items()):
                runs[name].append(one_run(args, env, Path(tmp) / f"{repeat}_{i}.json"))
    rows = [{"setting": name, **{k: statistics.median(r[k] for r in rs) for k in rs[0]}} for name, rs in runs.items()]
    hw = hardware()
    table = markdown_table(rows, [("setting", "relmt-serve's environment"), ("one_sent_s", "1 client: sentences/s"),
                                  ("one_p50_ms", "1 client: p50 ms"),
                                  ("one_p50_over_offline", "1 client p50 ÷ offline"),
                                  ("many_sent_s", "32 clients: sentences/s"), ("many_p50_ms", "32 clients: p50 ms"),
                                  ("many_over_offline", "32 clients ÷ offline")])
    print(table)
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "engine": args.engine,
               "threads": args.threads, "rows": rows, "runs": runs}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            page_head("relmt-serve with libgomp's default spin and a short one (issue 76)", hw, payload["command"]) +
            f"- server: engine={args.engine}, threads={args.threads}, continuous batching; {args.checkpoint}; the "
            f"medians of {args.repeats} interleaved repeats of scripts/bench/bench_serve.py (1 and 32 clients, at most "
            f"{args.requests} requests or {args.max_seconds:g} s a level)\n\n{table}\n\nThe offline references run in "
            "bench_serve's process with libgomp's defaults in every run; the setting is relmt-serve's alone.\n")


if __name__ == "__main__":
    main()
