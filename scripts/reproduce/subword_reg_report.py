#!/usr/bin/env python
"""Subword regularisation on Multi30k (issue 61): the paired verdict of rel with BPE-dropout (data.spm_alpha=0.1;
scripts/reproduce/queues/subword_reg.txt) against rel without it (the committed t1_rel_s1 and t1_rel_s2 of
multi30k_tables.txt: the same recipe and seeds), on each test set. The verdict is the project's: the bootstrap over
the test sentences and both systems' seeds together (relmt.evaluate.metrics.multi_seed_bootstrap, Clark et al.
2011; docs/reproducing.md), with each seed pair's own paired test beside it, deciding nothing.

    python scripts/reproduce/subword_reg_report.py [--refs ../shared/data/multi30k]

The default --refs is this project's machines. Reads the committed runs' translations/; writes
docs/results/reproduction/subword_reg.md and .json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from relmt.bench import command_line, markdown_table, write_json
from relmt.data.sources import read_lines
from relmt.evaluate.metrics import multi_seed_bootstrap, paired_bootstrap

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("test", "test_2017_flickr", "test_2017_mscoco")
WITHOUT = ROOT / "docs/results/reproduction/multi30k/runs"
WITH = ROOT / "docs/results/reproduction/subword_reg/runs"


def hyps(run: Path, split: str) -> list[str] | None:
    path = run / "translations" / f"{split}.de"
    return read_lines(path) if path.is_file() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--refs", default="../shared/data/multi30k")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--out", default=str(ROOT / "docs/results/reproduction"))
    args = p.parse_args()
    seeds = [s for s in (1, 2) if (WITH / f"sr_rel_s{s}" / "metrics.json").is_file()]
    if not seeds:
        raise SystemExit(f"no finished run in {WITH}: run scripts/reproduce/queues/subword_reg.txt first")
    rows, pairs, out_json = [], [], {"command": command_line(), "seeds": seeds, "splits": {}}
    for split in SPLITS:
        refs = read_lines(Path(args.refs) / f"{split}.de")
        base = [hyps(WITHOUT / f"t1_rel_s{s}", split) for s in seeds]
        system = [hyps(WITH / f"sr_rel_s{s}", split) for s in seeds]
        test = multi_seed_bootstrap(base, system, refs, n_samples=args.samples)
        verdict = ("held: sampling better" if test["low"] > 0 else "did not hold: sampling worse" if test["high"] < 0
                   else "not significant")
        rows.append({"split": split, "without": f"{test['baseline']:.2f}", "with": f"{test['system']:.2f}",
                     "diff": f"{test['difference']:+.2f}", "ci": f"[{test['low']:+.2f}, {test['high']:+.2f}]",
                     "p": f"{test['p_value']:.3f}", "verdict": verdict})
        per_seed = []
        for s, b, h in zip(seeds, base, system):
            t = paired_bootstrap(b, h, refs, n_samples=args.samples)
            per_seed.append(t)
            pairs.append({"split": split, "seed": s, "without": f"{t['baseline']:.2f}", "with": f"{t['system']:.2f}",
                          "diff": f"{t['difference']:+.2f}", "ci": f"[{t['low']:+.2f}, {t['high']:+.2f}]",
                          "p": f"{t['p_value']:.3f}"})
        out_json["splits"][split] = {"multi_seed": test, "per_seed": per_seed, "verdict": verdict}
    cols = [("split", "test set"), ("without", "rel, mean BLEU"), ("with", "rel + BPE-dropout 0.1, mean BLEU"),
            ("diff", "difference"), ("ci", "95% interval"), ("p", "p"), ("verdict", "verdict")]
    table = markdown_table(rows, cols)
    seed_table = markdown_table(pairs, [("split", "test set"), ("seed", "seed"), ("without", "without"),
                                        ("with", "with"), ("diff", "difference"), ("ci", "95% interval"),
                                        ("p", "p")])
    epochs = {name: [json.loads((root / f"{prefix}{s}" / "metrics.json").read_text())["epochs"] for s in seeds]
              for name, root, prefix in (("without", WITHOUT, "t1_rel_s"), ("with", WITH, "sr_rel_s"))}
    out_json["epochs"] = epochs
    out = Path(args.out)
    write_json(out / "subword_reg.json", out_json)
    page = f"""# Subword regularisation on Multi30k

Issue 61. rel at the Multi30k CPU recipe (`experiment=multi30k_cpu`) with BPE-dropout (`data.spm_alpha=0.1`,
Provilkov et al. 2020; each epoch's training pieces sampled anew, relmt/data/regularise.py) against the same
recipe without it (the committed `t1_rel_s*` runs of multi30k_tables.txt), seeds {", ".join(map(str, seeds))}.
sacreBLEU (cased, 13a) of each run's test translations.

The verdict is the bootstrap over the test sentences and both systems' seeds together (Clark et al. 2011;
docs/reproducing.md, "One verdict from all the seeds"): the claim "BPE-dropout improves BLEU" is held when the
95% interval of the difference lies above 0, did not hold when below, and is not significant otherwise.

{table}

Both train the recipe's 3,000 updates of the same padded-token budget. With sampling, the sentences are cut into
about 40% more pieces, so those updates hold fewer sentences: epochs completed, without {epochs["without"]}, with
{epochs["with"]} (seed by seed). Seeds: {", ".join(map(str, seeds))} of 1 and 2 (a seed still training in the lane
joins the page when it ends).

Each seed pair's own paired bootstrap, beside it (deciding nothing):

{seed_table}

- Runs: `scripts/reproduce/run_queue.sh scripts/reproduce/queues/subword_reg.txt` (docs/results/reproduction/
  subword_reg/runs/), beside docs/results/reproduction/multi30k/runs/t1_rel_s*
- Command: `{command_line()}`
"""
    (out / "subword_reg.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
