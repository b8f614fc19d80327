#!/usr/bin/env python
"""Write the toy corpus as text files, {split}.src and {split}.tgt, for relmt-translate, relmt-score and
relmt-report refs=, with its gold word alignments, {split}.align and {split}.align_possible (Pharaoh "i-j"
lines; see relmt/data/toy.py).

The toy corpus is generated from a seed (relmt/data/toy.py) and never stored; its runs translate
the test and test_long splits. relmt-translate and relmt-score, and the report's paired tests and its
repeated-word analysis, read sources and references from files, so this writes them with the defaults
of configs/data/toy.yaml (or the sizes given): the sentences `make train` trains and scores on.

    python scripts/reproduce/toy_corpus.py data/toy_text    # = make toy-text; relmt-report ... refs=data/toy_text
"""

from __future__ import annotations

import argparse
from pathlib import Path

from relmt.config import ToyConfig
from relmt.data.toy import generate, write_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    defaults = ToyConfig()
    for name in ("seed", "n_train", "n_valid", "n_test", "n_test_long", "max_words"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    args = ap.parse_args()
    splits = generate(seed=args.seed, n_train=args.n_train, n_valid=args.n_valid, n_test=args.n_test,
                      n_test_long=args.n_test_long, max_words=args.max_words)
    write_text(splits, args.out)
    print(f"{args.out}: " + ", ".join(f"{s} {len(p)}" for s, p in splits.items()))


if __name__ == "__main__":
    main()
