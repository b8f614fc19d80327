"""The README's commands agree with the defaults they run on (issue 32 §4)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]


def test_the_averaging_example_fits_a_default_run():
    """`relmt-average dir=... last=N` needs N step_N.pt files: a default run keeps train.keep_last of them."""
    keep_last = yaml.safe_load((ROOT / "configs/train/default.yaml").read_text())["keep_last"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the README and the site's pages
    examples = re.findall(r"relmt-average dir=\S+ last=(\d+)", "".join(p.read_text() for p in pages))
    assert examples and all(int(n) <= keep_last for n in examples), (examples, keep_last)
