#!/usr/bin/env python
"""What a rehearsed GPU call brought back (scripts/gpu/rehearse.sh), checked as the real call's will be read: $OUT
holds log.txt, phases.json and results.tgz and nothing else (a call brings back 8 files at most); phases.json
names every phase of the call, in order, each ended by its own command (not its box) with the files it must
write; results.tgz unpacks into those files; and scripts/gpu/gpu_report.py turns them into its page. Exit 1 with
what is wrong.

    python scripts/gpu/rehearse_check.py /tmp/relmt-rehearsal/out1 --call 1
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# each phase: the files it writes into the work folder (scripts/gpu/gpu_checks.sh)
FILES = {"tests": ["tests.txt"], "attn": ["attn.json"], "labels": ["label_sums.json"], "trainflex": ["train43f.json"],
         "train43": ["train43.json", "train43.md"], "big": ["big.json"], "compiled": ["train43c.json"],
         "conv": ["route_convergence.json"], "loss_memory": ["loss_memory_gpu.json"],
         "train_orders": ["train_orders_gpu.json"], "suite": ["suite.txt"],
         "decode": ["decode.json", "decode.md"], "m30k": ["m30k"], "total": []}


def call_phases(call: str) -> list[str]:
    """The phases scripts/gpu/call.sh runs for a call, in gpu_checks.sh's order."""
    env = subprocess.run(["bash", "-c", f"source <(sed -n '/^case/,/^esac/p' {ROOT}/scripts/gpu/call.sh | "
                          f"sed 's/^  \\*).*//') && echo $PHASES", "x", call], capture_output=True, text=True,
                         cwd=ROOT)
    asked = env.stdout.split()
    order = [line.split("want ")[1].split(";")[0].split()[0] for line in
             (ROOT / "scripts/gpu/gpu_checks.sh").read_text().splitlines() if line.startswith("if want ")]
    run = {"issue58": ["conv", "loss_memory", "train_orders"]}
    order = [name for name in order if name != "m30k"] + ["m30k"]  # started first, it ends last
    phases = [p for name in order if name in asked for p in run.get(name, [name])]
    return [p for i, p in enumerate(phases) if p not in phases[:i]] + ["total"]


# the goal rows (scripts/gpu/lease_report.py) each call fills, by a word of their text
# OpenNMT-py: not in a rehearsal's venv
FILLS = {"1": ("step time", "MFU", "flex"), "2": ("CUDA tests", "Multi30k"), "3": ("one call",)}


def call_fills(call: str, what: str) -> bool:
    return any(word in what for word in FILLS.get(call, ()))


def check(out: Path, call: str) -> list[str]:
    problems = []
    names = sorted(p.name for p in out.iterdir())
    if names != ["log.txt", "phases.json", "results.tgz"]:
        problems.append(f"$OUT holds {names}, not log.txt, phases.json and results.tgz")
    if not (out / "phases.json").is_file():
        return problems + ["no phases.json"]
    done = json.loads((out / "phases.json").read_text())
    if not done.get("rehearsal"):
        problems.append("phases.json does not say it is a rehearsal")
    ran = [p["phase"] for p in done["phases"]]
    want = call_phases(call)
    if ran != want:
        problems.append(f"phases run {ran}, the call has {want}")
    work = Path(tempfile.mkdtemp(prefix="rehearsal-results-"))
    with tarfile.open(out / "results.tgz") as tar:
        tar.extractall(work, filter="data")
    for p in done["phases"]:
        if p["exit"] != 0:
            problems.append(f"phase {p['phase']} exited {p['exit']}" + (" (its box)" if p["exit"] == 124 else ""))
        for f in FILES.get(p["phase"], []):
            if f not in p["files"]:
                problems.append(f"phase {p['phase']} wrote no {f}")
            elif not (work / f).exists():
                problems.append(f"results.tgz lacks {f}")
    (work / "phases.json").write_text((out / "phases.json").read_text())  # as the copy step does (README)
    report = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/gpu_report.py"), "--dir", str(work), "--out",
                             str(work / "gpu_report")], capture_output=True, text=True, cwd=ROOT)
    if report.returncode != 0:
        problems.append(f"gpu_report.py failed: {report.stderr.strip().splitlines()[-1:]}")
    elif not (work / "gpu_report.md").is_file():
        problems.append("gpu_report.py wrote no page")
    else:
        page = json.loads((work / "gpu_report.json").read_text())
        blank = [g["what"] for g in page["goals"] if g["measured"] == "not measured" and call_fills(call, g["what"])]
        if blank:
            problems.append(f"the page's goals this call fills are blank: {blank}")
    print(f"{out}: phases {' '.join(ran)}; results in {work}; report: "
          f"{shlex.join(['python', 'scripts/gpu/gpu_report.py', '--dir', str(work)])}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--call", required=True, help="the call of scripts/gpu/call.sh rehearsed")
    args = ap.parse_args()
    problems = check(args.out, args.call)
    for p in problems:
        print(f"rehearsal problem: {p}")
    if problems:
        sys.exit(1)
    print("rehearsal passed")


if __name__ == "__main__":
    main()
