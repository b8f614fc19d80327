"""The "your own corpus in five commands" page (issue 45 §8): the five commands of docs/own-corpus.md, as
written there and in the README, run end to end on a small local {split}.{lang} folder."""

import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
NOUNS = {"dog": "hund", "cat": "katze", "man": "mann", "woman": "frau", "child": "kind", "bird": "vogel",
         "house": "haus", "tree": "baum", "car": "auto", "ball": "ball"}
VERBS = {"sees": "sieht", "likes": "mag", "finds": "findet", "has": "hat"}


def page_commands(path: Path) -> list[str]:
    """The lines of the first ```bash block after the five-commands heading (or of the page)."""
    text = path.read_text()
    start = text.find("five commands")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def write_corpus(folder: Path, sizes=(("train", 200), ("valid", 20), ("test", 20))) -> None:
    """Short aligned en/de sentences: 'the dog sees the cat' / 'der hund sieht den katze'."""
    rng = random.Random(0)
    folder.mkdir()
    for split, n in sizes:
        pairs = []
        for _ in range(n):
            a, b = rng.sample(sorted(NOUNS), 2)
            v = rng.choice(sorted(VERBS))
            pairs.append((f"the {a} {v} the {b}", f"der {NOUNS[a]} {VERBS[v]} den {NOUNS[b]}"))
        (folder / f"{split}.en").write_text("".join(en + "\n" for en, _ in pairs))
        (folder / f"{split}.de").write_text("".join(de + "\n" for _, de in pairs))


def test_the_readme_shows_the_pages_five_commands():
    commands = page_commands(ROOT / "docs/own-corpus.md")
    assert len(commands) == 5
    assert [c.split()[0] for c in commands] == ["relmt-prepare", "relmt-train", "relmt-translate", "relmt-score",
                                                 "relmt-report"]
    assert page_commands(ROOT / "README.md") == commands


@pytest.mark.slow
def test_the_five_commands_run_on_a_small_corpus(tmp_path):
    write_corpus(tmp_path / "mycorpus")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for command in page_commands(ROOT / "docs/own-corpus.md"):
        argv = shlex.split(command)
        argv[0] = str(BIN / argv[0])
        if argv[0].endswith("relmt-train"):
            argv.append("train.max_steps=20")  # the page trains to the default length; the test does not wait
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert json.loads((tmp_path / "runs/mine/metrics.json").read_text())
    assert len((tmp_path / "hyp.de").read_text().splitlines()) == 20
    assert "sacrebleu" in json.loads((tmp_path / "scores.json").read_text())
    assert "| mine |" in (tmp_path / "reports/mine.md").read_text()
