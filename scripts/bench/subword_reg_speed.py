#!/usr/bin/env python
"""Training speed with subword regularisation (issue 61): target tokens per second of relmt-train on Multi30k at
the CPU recipe (experiment=multi30k_cpu, rel), with data.spm_alpha=0.1 (BPE-dropout) and without, one epoch each
(train.max_epochs=1: with sampling, the next epoch's pieces are encoded in a background thread during it, which
is what it costs), run in turn --repeats times. tok/s is metrics.json's: target tokens over the update steps'
time. Goal: with ÷ without >= 0.95. Run it on a quiet machine: it measures speed.

    python scripts/bench/subword_reg_speed.py [--data ../shared/data/multi30k] [--threads 2] [--repeats 1]

The default --data is this project's machines. Writes docs/results/data/subword_reg_speed.md and .json; the runs
go to runs/subword_reg_speed/ (removed before each run: a resumed run's time would not be one session's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

from relmt.bench import command_line, hardware, markdown_table, provenance, write_json
from relmt.config import compose
from relmt.data.dataset import prepare
from relmt.data.regularise import resample

ROOT = Path(__file__).resolve().parents[2]
GOAL = 0.95


def run(name: str, args: argparse.Namespace, *extra: str) -> dict:
    out = ROOT / "runs" / "subword_reg_speed" / name
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([str(Path(sys.executable).parent / "relmt-train"), "experiment=multi30k_cpu",
                    f"data.dir={args.data}", "model.positions=rel", "train.max_epochs=1", "train.max_steps=0",
                    "train.eval_every=100000", "train.save_every=100000", "train.valid_bleu=false",
                    f"threads={args.threads}", "train.progress=false", "train.test_checkpoint=last",
                    "decode=greedy", "seed=1", f"hydra.run.dir={out}", *extra], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    m = json.loads((out / "metrics.json").read_text())
    return {"steps": m["steps"], "tokens_per_s": m["tokens_per_s"], "train_seconds": m["train_seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="../shared/data/multi30k")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--out", default=str(ROOT / "docs/results/data"))
    args = p.parse_args()
    results: dict[str, list[dict]] = {"without": [], "with": []}
    for i in range(args.repeats):
        for mode in (("without", "with") if i % 2 == 0 else ("with", "without")):
            extra = [f"data.spm_alpha={args.alpha}"] if mode == "with" else []
            results[mode].append(run(f"{mode}_{i}", args, *extra))
            print(mode, results[mode][-1], flush=True)
    speed = {mode: median(r["tokens_per_s"] for r in rs) for mode, rs in results.items()}
    # what the sampling itself costs: one epoch's encoding, timed alone in this process (one thread)
    corpus = prepare(compose(["experiment=multi30k_cpu", f"data.dir={args.data}"]).data)  # the runs' cache
    t0 = time.perf_counter()
    resample(corpus.ids("train"), corpus.tokenizer, args.alpha, -1, 1, 1)
    encode_s = time.perf_counter() - t0
    epoch_s = median(r["train_seconds"] for r in results["with"])
    ratio = speed["with"] / speed["without"]
    rows = [{"mode": f"data.spm_alpha={args.alpha}" if mode == "with" else "without (deterministic pieces)",
             "steps": " / ".join(str(r["steps"]) for r in rs), "tok": f"{speed[mode]:,.0f}",
             "secs": " / ".join(f"{r['train_seconds']:.0f}" for r in rs)} for mode, rs in results.items()]
    table = markdown_table(rows, [("mode", "training"), ("steps", "updates in the epoch"),
                                  ("secs", "update seconds"), ("tok", "target tok/s (median)")])
    hw = hardware()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "subword_reg_speed.json", {"command": command_line(), "hardware": hw, "runs": results,
                                                "tokens_per_s": speed, "ratio": ratio, "goal": GOAL,
                                                "encode_seconds_per_epoch": encode_s})
    page = f"""# Training speed with subword regularisation

Issue 61. relmt-train on Multi30k at the CPU recipe (`experiment=multi30k_cpu`, rel, {args.threads} threads), one
epoch with BPE-dropout (`data.spm_alpha={args.alpha}`) and one without, {args.repeats} time(s) each in turn. With
sampling, each epoch's pieces are encoded anew from the cached ids, the next epoch's in a background thread
while this one trains (relmt/data/regularise.py); the epoch's target sentences are cut into more pieces, so an
epoch holds more tokens and more updates. Target tokens per second of the update steps (metrics.json):

{table}

with ÷ without: **{ratio:.3f}** (goal ≥ {GOAL}: {"met" if ratio >= GOAL else "not met"}).

What the sampling machinery costs: encoding one epoch's training split anew takes {encode_s:.1f} s of one core
(timed alone, after the runs), {100 * encode_s / epoch_s:.1f}% of the sampled epoch's update time, and it runs in
the background. Tokens per update are alike in both runs (the batches are cut to the same padded-token budget);
what makes each update slower is that its sentences are longer in pieces (about 40% more, the log's count):
fewer, longer sequences per batch, and attention's cost per token grows with the length.

{provenance(hw)}"""
    (out / "subword_reg_speed.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
