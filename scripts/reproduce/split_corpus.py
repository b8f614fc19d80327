#!/usr/bin/env python
"""Hold out valid and test splits from a corpus that has only a training split, by a fixed rule.

Line i (counting from 0) of `{split}.{src}` / `{split}.{tgt}` goes to test when i % every == 0,
to valid when i % every == every // 2, and to train otherwise: a deterministic, evenly spread
split that anyone can recompute. Used for ../shared/data/europarl20k_ende (20,000 pairs, no
held-out data): with every=20 that is 1,000 test, 1,000 valid and 18,000 train pairs.

    python scripts/reproduce/split_corpus.py ../shared/data/europarl20k_ende data/europarl20k_split --src en --tgt de
"""

from __future__ import annotations

import argparse
from pathlib import Path

from relmt.data.sources import read_lines


def split(lines: list[str], every: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for i, line in enumerate(lines):
        name = "test" if i % every == 0 else "valid" if i % every == every // 2 else "train"
        out[name].append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--split", default="train", help="the split of SOURCE to divide")
    ap.add_argument("--every", type=int, default=20)
    args = ap.parse_args()
    if args.every < 3:
        raise SystemExit(f"--every={args.every}: must be >= 3 (test, valid and train lines)")
    sides = {lang: read_lines(args.source / f"{args.split}.{lang}") for lang in (args.src, args.tgt)}
    if len(sides[args.src]) != len(sides[args.tgt]):
        raise SystemExit(f"{args.source}: {args.split}.{args.src} and {args.split}.{args.tgt} differ in length")
    args.out.mkdir(parents=True, exist_ok=True)
    for lang, lines in sides.items():
        for name, part in split(lines, args.every).items():
            (args.out / f"{name}.{lang}").write_text("".join(x + "\n" for x in part), encoding="utf-8")
    sizes = {name: len(part) for name, part in split(sides[args.src], args.every).items()}
    print(f"{args.out}: {sizes} (line i -> test if i % {args.every} == 0, valid if == {args.every // 2})")


if __name__ == "__main__":
    main()
