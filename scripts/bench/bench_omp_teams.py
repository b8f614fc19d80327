#!/usr/bin/env python
"""Decoding in a worker thread, alone or beside a second OpenMP thread team (relmt-serve's design rule).

relmt-serve decodes in one thread and never runs torch in its event loop's thread. This measures why: each case
is a fresh process that decodes --sentences sentences one at a time in a worker thread, either with that thread
the only one to have run torch ("alone"), or after one parallel torch operation in the main thread ("beside a
second team": the main thread then owns an idle OpenMP team of its own). With more OpenMP threads than cores,
GNU OpenMP (torch's CPU wheels) stops spin-waiting between parallel regions, so every parallel operation of the
decoding thread pays a wake-up. Run it alone on the machine.

    python scripts/bench/bench_omp_teams.py --checkpoint runs/serve/peer_rel/checkpoints/last.pt \\
        --src /tmp/relmt-peers/corpus/test.src
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ("alone", "beside a second team")


def worker(opts: argparse.Namespace) -> None:
    """One case, in this process: prints the seconds of each repeat as JSON."""
    import threading

    import torch

    from relmt.decode.translator import Translator
    from relmt.runtime import tune_cpu

    torch.set_num_threads(opts.threads)
    if opts.case == CASES[1]:
        (torch.ones(1 << 22) * 2).sum()  # one parallel operation: the main thread's OpenMP team now exists
    lines = [s for s in Path(opts.src).read_text(encoding="utf-8").splitlines() if s.strip()][:opts.sentences]
    times: list[float] = []

    def decode() -> None:
        tune_cpu()
        translator = Translator.from_checkpoint(opts.checkpoint)
        translator.translate(lines[:4])  # warm-up
        for _ in range(opts.repeats):
            start = time.perf_counter()
            for line in lines:
                translator.translate([line])
            times.append(time.perf_counter() - start)

    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    print(json.dumps(times))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", type=Path, required=True, help="sentences, one a line")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # internal: run one case
    parser.add_argument("--json", type=Path, default=ROOT / "docs/results/performance/omp_teams.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs/results/performance/omp_teams.md")
    opts = parser.parse_args(argv)
    if opts.case:
        worker(opts)
        return {}
    given = argv if argv is not None else sys.argv[1:]
    results = {}
    for case in CASES:
        done = subprocess.run([sys.executable, __file__, *given, "--case", case], capture_output=True, text=True,
                              check=True)
        seconds = json.loads(done.stdout.strip().splitlines()[-1])
        results[case] = {"seconds": seconds, "ms_per_sentence": 1e3 * min(seconds) / opts.sentences}
    from relmt.host import host

    payload = {"command": " ".join(["python scripts/bench/bench_omp_teams.py", *given]), "host": host(),
               "threads": opts.threads, "sentences": opts.sentences, "results": results,
               "slowdown": results[CASES[1]]["ms_per_sentence"] / results[CASES[0]]["ms_per_sentence"]}
    hw = payload["host"]
    lines = ["# Decoding in a worker thread, alone or beside a second OpenMP team", "",
             f"{hw['date']}, {hw['cpu']} ({hw['cpu_count']} cores), torch {hw['torch']}, git {hw['git']}; "
             f"{opts.threads} threads; {opts.sentences} sentences one at a time, the best of {opts.repeats} repeats.",
             "", f"Command: `{payload['command']}`", "",
             "| the decoding thread | ms per sentence |", "|---|---|"]
    lines += [f"| {case} | {r['ms_per_sentence']:.1f} |" for case, r in results.items()]
    lines += ["", f"Beside a second team, decoding takes {payload['slowdown']:.2f} times as long. relmt-serve "
              "therefore loads its model and runs every torch operation in its decoding thread "
              "(relmt/serve/batcher.py).", ""]
    opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    opts.md.write_text("\n".join(lines))
    print("\n".join(lines))
    return payload


if __name__ == "__main__":
    main()
