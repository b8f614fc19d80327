#!/usr/bin/env python
"""Fine-tuning onto a new vocabulary (issue 61): a Multi30k model (rel, the CPU recipe) fine-tuned on Multi30k
plus the Europarl slice (configs/data/mix_m30k_europarl.yaml, 1:1), whose joint sentencepiece model is trained
on both corpora and so differs from the checkpoint's. train.init_from carries the embedding (and tied output)
rows of the pieces both vocabularies hold, and the rest start as a fresh model's (relmt/train/init.py). Beside
it, a fresh model on the same data, settings and seed: the validation loss (Multi30k valid) after the first
--eval updates, and after --steps, of each; goal: fine-tuned ÷ fresh < 1 at the first validation.

    python scripts/reproduce/new_vocab.py --checkpoint runs/decoding/m30k_rel_s1/checkpoints/best.pt \\
        [--multi30k ../shared/data/multi30k] [--europarl data/europarl20k_split]

The checkpoint comes from scripts/reproduce/queues/decoding.txt (m30k_rel_s1); the defaults are this project's
machines. The runs go to runs/new_vocab/ (resumable); writes docs/results/data/new_vocab.md and new_vocab.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, provenance, write_json

ROOT = Path(__file__).resolve().parents[2]


def run(name: str, args: argparse.Namespace, *extra: str) -> Path:
    out = ROOT / "runs" / "new_vocab" / name
    done = out / "metrics.json"
    if not done.is_file() or json.loads(done.read_text())["status"] != "completed":
        subprocess.run([str(Path(sys.executable).parent / "relmt-train"), "data=mix_m30k_europarl", "model=mmt_tiny",
                        "model.positions=rel", "model.dropout=0.1", "train=multi30k_cpu",
                        f"data.corpora.0.dir={args.multi30k}", f"data.corpora.1.dir={args.europarl}",
                        f"train.max_steps={args.steps}", f"train.eval_every={args.eval}", "train.valid_bleu=false",
                        f"train.save_every={args.steps}", f"threads={args.threads}", "train.progress=false",
                        "train.resume=true", "train.test_checkpoint=last", "decode=greedy", "seed=1",
                        f"hydra.run.dir={out}", *extra], check=True, cwd=ROOT)
    return out


def valid_losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["tag"] == "valid"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="runs/decoding/m30k_rel_s1/checkpoints/best.pt")
    p.add_argument("--multi30k", default="../shared/data/multi30k")
    p.add_argument("--europarl", default="data/europarl20k_split")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "docs/results/data"))
    args = p.parse_args()
    tuned = run("finetuned", args, f"train.init_from={args.checkpoint}")
    fresh = run("fresh", args)
    kept = json.loads((tuned / "metrics.json").read_text())["init_from"]["vocabulary"]
    a, b = valid_losses(tuned), valid_losses(fresh)
    rows = [{"step": s, "tuned": f"{a[s]:.3f}", "fresh": f"{b[s]:.3f}", "ratio": f"{a[s] / b[s]:.3f}"}
            for s in sorted(a) if s in b]
    first = min(a)
    table = markdown_table(rows, [("step", "updates"), ("tuned", "valid loss, fine-tuned"),
                                  ("fresh", "valid loss, fresh model"), ("ratio", "fine-tuned ÷ fresh")])
    hw = hardware()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "new_vocab.json", {"command": command_line(), "hardware": hw, "checkpoint": args.checkpoint,
                                        "vocabulary": kept, "valid_loss": {"finetuned": a, "fresh": b},
                                        "first_ratio": a[first] / b[first]})
    page = f"""# Fine-tuning onto a new vocabulary

Issue 61. A Multi30k model (`{args.checkpoint}`: rel, the CPU recipe) fine-tuned with `train.init_from` on
Multi30k plus the Europarl slice at 1:1 (`configs/data/mix_m30k_europarl.yaml`), whose joint sentencepiece model,
trained on both corpora, differs from the checkpoint's. The embedding rows, and so the tied output rows, of the
pieces both vocabularies hold are the checkpoint's ({kept['kept']} of the new vocabulary's {kept['rows']} rows;
the checkpoint had {kept['checkpoint_rows']}); the others, and the optimizer, start fresh. Beside it, a fresh
model with the same data, settings and seed. The validation loss (label-smoothed, Multi30k valid) after each
{args.eval} updates:

{table}

Goal: fine-tuned ÷ fresh < 1 at the first validation: {a[first] / b[first]:.3f} after {first} updates.

{provenance(hw)}"""
    (out / "new_vocab.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
