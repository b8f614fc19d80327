#!/usr/bin/env python
"""Several corpora with weights (issue 61): Multi30k EN-DE and the Europarl slice in one run at weights 1:1 and
3:1, one epoch each, and the share of each corpus in the batches trained (pairs and target tokens) against the
weights. The share depends on the draws and the batches, not on the model, so the runs use the tiny model
(model=tiny) to get through an epoch in minutes on a CPU; --steps cuts them shorter (0: one whole epoch).

    python scripts/reproduce/split_corpus.py ../shared/data/europarl20k_ende data/europarl20k_split --src en --tgt de
    python scripts/reproduce/mix_share.py [--multi30k ../shared/data/multi30k] [--europarl data/europarl20k_split]

The defaults are this project's machines (../shared/data). Writes docs/results/data/mix.md and mix.json; the runs
go to runs/mix/ (resumable: a finished one is read back).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, provenance, write_json

ROOT = Path(__file__).resolve().parents[2]
GOAL_PP = 1.0  # the goal: the realised share within 1 percentage point of the weight's


def run(name: str, weights: tuple[float, float], args: argparse.Namespace) -> dict:
    out = ROOT / "runs" / "mix" / name
    if not (out / "metrics.json").is_file() or json.loads((out / "metrics.json").read_text())["status"] != "completed":
        limit = [f"train.max_steps={args.steps}"] if args.steps else ["train.max_epochs=1", "train.max_steps=0"]
        cmd = [str(Path(sys.executable).parent / "relmt-train"), "data=mix_m30k_europarl", "model=tiny",
               f"data.corpora.0.dir={args.multi30k}", f"data.corpora.1.dir={args.europarl}",
               f"data.corpora.0.weight={weights[0]}", f"data.corpora.1.weight={weights[1]}", *limit,
               "train.valid_bleu=false", "train.eval_every=100000", "train.log_every=50", "train.save_every=100000",
               f"threads={args.threads}", "train.progress=false", "train.resume=true",
               "train.test_checkpoint=last", "decode=greedy", f"hydra.run.dir={out}"]
        subprocess.run(cmd, check=True, cwd=ROOT)  # paths relative to the checkout
    metrics = json.loads((out / "metrics.json").read_text())
    return {"run": name, "weights": list(weights), "steps": metrics["steps"], "epochs": metrics["epochs"],
            "mix": metrics["mix"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--multi30k", default="../shared/data/multi30k")
    p.add_argument("--europarl", default="data/europarl20k_split")
    p.add_argument("--steps", type=int, default=0, help="updates per run (0: one epoch)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "docs/results/data"))
    args = p.parse_args()
    runs = [run("w1_1", (1.0, 1.0), args), run("w3_1", (3.0, 1.0), args)]
    rows = []
    for r in runs:
        total = sum(r["weights"])
        for (name, m), w in zip(r["mix"].items(), r["weights"]):
            gap = 100 * (m["pair_share"] - w / total)
            rows.append({"run": r["run"], "corpus": name, "weight": f"{w:g}", "target": f"{100 * w / total:.1f}%",
                         "pairs": m["pairs"], "pair_share": f"{100 * m['pair_share']:.2f}%", "gap": f"{gap:+.2f} pp",
                         "tokens": m["tgt_tokens"], "token_share": f"{100 * m['token_share']:.1f}%",
                         "met": "yes" if abs(gap) <= GOAL_PP else "no"})
    table = markdown_table(rows, [("run", "run"), ("corpus", "corpus"), ("weight", "weight"),
                                  ("target", "weight's share"), ("pairs", "pairs trained"),
                                  ("pair_share", "share of pairs"), ("gap", "gap"), ("tokens", "target tokens"),
                                  ("token_share", "share of target tokens"), ("met", f"within {GOAL_PP:g} pp")])
    hw = hardware()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "mix.json", {"command": command_line(), "hardware": hw, "runs": runs, "goal_pp": GOAL_PP})
    steps = ", ".join(f"{r['run']}: {r['steps']} updates, {r['epochs']} epoch(s)" for r in runs)
    page = f"""# Several corpora: the mix trained on

Issue 61. Multi30k EN-DE and the Europarl slice (its training split, cut by
`scripts/reproduce/split_corpus.py`) in one run (`configs/data/mix_m30k_europarl.yaml`), at weights 1:1
and 3:1: the share of each corpus in the batches trained, from each run's `metrics.json` (`mix`), against
the weight's share. Goal: within {GOAL_PP:g} percentage point over an epoch. The share depends on the
draws and the batches, not on the model, so the runs train the tiny model (`model=tiny`) for one epoch
({steps}).

{table}

The pairs follow the weights (an epoch draws N w / Σw pairs from each corpus, relmt/data/mix.py); the target
tokens follow them times the corpora's lengths (a Europarl sentence is longer than a Multi30k caption).

{provenance(hw)}"""
    (out / "mix.md").write_text(page)
    print(table)


if __name__ == "__main__":
    main()
