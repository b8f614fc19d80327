#!/usr/bin/env python
"""int8 against float32 on engine=aoti (issue 62): sacreBLEU on Multi30k test2016 of one checkpoint decoded by
engine=aoti in float32 and with quantization=int8 (relmt/export/quantize.py), at the checkpoint's decode settings
(beam 4 for the CPU recipe), with the paired bootstrap of int8 against float32, and how many outputs differ.
Goal: int8 − float32 >= −0.3 BLEU. Quality only: the speed is bench_ct2_threads.py's.

    python scripts/bench/int8_bleu.py --checkpoint runs/decoding/m30k_rel_s1/checkpoints/best.pt \\
        [--data ../shared/data/multi30k]

The checkpoint is the CPU recipe's rel seed 1 (scripts/reproduce/queues/decoding.txt); the default --data is this
project's machines. Writes docs/results/engines/int8_bleu.md and .json. The first use of each engine compiles it
(minutes), next to the checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from relmt.bench import hardware, markdown_table, provenance, write_json
from relmt.data.sources import read_lines
from relmt.decode.translator import Translator
from relmt.evaluate.metrics import paired_bootstrap

ROOT = Path(__file__).resolve().parents[2]
GOAL = -0.3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="runs/decoding/m30k_rel_s1/checkpoints/best.pt")
    p.add_argument("--data", default="../shared/data/multi30k")
    p.add_argument("--split", default="test")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "docs/results/engines"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sources = read_lines(Path(args.data) / f"{args.split}.en")
    refs = read_lines(Path(args.data) / f"{args.split}.de")
    outputs = {q: Translator.from_checkpoint(args.checkpoint, engine="aoti", quantization=q).translate(sources)
               for q in ("float32", "int8")}
    test = paired_bootstrap(outputs["float32"], outputs["int8"], refs)
    differ = sum(a != b for a, b in zip(outputs["float32"], outputs["int8"]))
    rows = [{"weights": q, "bleu": f"{test['baseline' if q == 'float32' else 'system']:.2f}"}
            for q in ("float32", "int8")]
    table = markdown_table(rows, [("weights", "engine=aoti weights"), ("bleu", f"sacreBLEU, {args.split}")])
    diff = test["difference"]
    hw = hardware()
    out = Path(args.out)
    write_json(out / "int8_bleu.json", {"checkpoint": args.checkpoint, "split": args.split, "test": test,
                                        "outputs_differ": differ, "sentences": len(sources), "hardware": hw})
    page = f"""# int8 against float32 on engine=aoti

Issue 62. `{args.checkpoint}` (the Multi30k CPU recipe, rel) decoded on Multi30k {args.split} by engine=aoti
with float32 weights and with `quantization=int8` (torchao's dynamic int8 linear maps: per-channel weights,
per-row activation scales; relmt/export/quantize.py), at the checkpoint's decode settings. sacreBLEU (cased, 13a):

{table}

int8 − float32: **{diff:+.2f}** BLEU, 95% interval [{test['low']:+.2f}, {test['high']:+.2f}] (paired bootstrap,
p {test['p_value']:.3f}); goal ≥ {GOAL}: {"met" if diff >= GOAL else "not met"}. {differ} of {len(sources)} outputs
differ.

{provenance(hw)}"""
    (out / "int8_bleu.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
