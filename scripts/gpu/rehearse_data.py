#!/usr/bin/env python
"""The data a GPU call carries, made small from the toy corpus (relmt/data/toy.py) for its rehearsal on the CPU
(scripts/gpu/rehearse.sh; issue 73 §1): needs nothing outside the repository.

- DIR/shared: the WMT-like workload's sources in ../shared/data's layout (scripts/bench/bench_train.py WMT_LIKE),
  and DIR/wmt_like built from them by `bench_train.py --prepare-only`, as data/bench/wmt_like is before a call;
- DIR/multi30k: Multi30k's raw-text layout (configs/data/multi30k_text.yaml's splits) for the m30k phase.

    python scripts/gpu/rehearse_data.py /tmp/relmt-rehearsal
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.data.toy import generate  # noqa: E402

M30K_SPLITS = ("train", "valid", "test", "test_2017_flickr", "test_2017_mscoco")


def write(folder: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, side in (("en", 0), ("de", 1)):
        (folder / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--pairs", type=int, default=1200)
    args = ap.parse_args()
    splits = generate(seed=7, n_train=args.pairs, n_valid=40, n_test=40, n_test_long=0, max_words=20)
    train, valid, test = splits["train"], splits["valid"], splits["test"]
    wmt = args.dir / "shared"
    write(wmt / "europarl20k_ende", "train", train[: len(train) // 2])
    write(wmt / "wmt14_ende", "test", train[len(train) // 2:])
    for split in M30K_SPLITS:
        write(args.dir / "multi30k", split, {"train": train, "valid": valid}.get(split, test))
    subprocess.run([sys.executable, str(ROOT / "scripts/bench/bench_train.py"), "--prepare-only", "--shared-data",
                    str(wmt), "--data", str(args.dir / "wmt_like"), "--vocab-size", "400",
                    "--cache-dir", str(args.dir / "cache")], check=True)
    print(f"{args.dir}: shared/ (WMT-like sources), wmt_like/, multi30k/ ({len(train)} training pairs)")


if __name__ == "__main__":
    main()
