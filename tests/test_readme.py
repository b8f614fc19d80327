"""The README's commands agree with the defaults they run on (issue 32 §4)."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def step_files_of_a_default_run() -> int:
    """How many step_N.pt files `make train` leaves: one every train.save_every updates and one at the last
    update (relmt/train/loop.py), the newest train.keep_last of them kept."""
    from relmt.config import compose

    train = compose([]).train
    saved = train.max_steps // train.save_every + (train.max_steps % train.save_every != 0)
    return min(saved, train.keep_last)


def test_the_averaging_example_fits_a_default_run():
    """`relmt-average dir=... last=N` needs N step_N.pt files: a default run (400 updates, one saved every 200)
    leaves 2 of them, although it would keep train.keep_last=3 (issue 74 §4.7: the README said last=3)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the README and the site's pages
    examples = re.findall(r"relmt-average dir=\S+ last=(\d+)", "".join(p.read_text() for p in pages))
    have = step_files_of_a_default_run()
    assert examples and all(int(n) <= have for n in examples), (examples, have)


def test_averaging_more_checkpoints_than_a_run_kept_says_what_it_found_and_why(tmp_path, capsys):
    """relmt-average last=N over fewer step files names the files there and the run's save_every, max_steps and
    keep_last (from the newest checkpoint's config), and the largest last= that works."""
    from relmt import checkpoint
    from relmt.cli.average import _average
    from relmt.cli.common import EXIT_USER_ERROR, guarded
    from tests.tiny_checkpoints import toy_tokenizer, write_checkpoint

    spm = toy_tokenizer(tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (200, 400):
        write_checkpoint(ckpts, f"step_{step}.pt", spm, seed=step)
    payload = checkpoint.load(ckpts / "step_400.pt")  # as make train's run: 400 updates, one saved every 200
    payload["config"]["train"].update(max_steps=400, save_every=200, keep_last=3)
    checkpoint.save(payload, ckpts, ["step_400.pt"])
    code = guarded("relmt-average", _average, [f"dir={ckpts}", "last=3", f"output={tmp_path / 'avg.pt'}"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and not (tmp_path / "avg.pt").exists()
    for said in ("last=3", "2 step checkpoints (step_200.pt, step_400.pt)", "train.save_every=200",
                 "train.max_steps=400", "train.keep_last=3", "last=2"):
        assert said in err, (said, err)
    # the README's form works on what a default run leaves
    assert guarded("relmt-average", _average, [f"dir={ckpts}", "last=2", f"output={tmp_path / 'avg.pt'}"]) == 0
    assert (tmp_path / "avg.pt").is_file()


# --- issue 57: a new user's first day ---------------------------------------------------------------------

COMMAND_PAGES = ["README.md", "docs/index.md", "docs/own-corpus.md", "docs/getting-started.md"]
ACTIVATE = "source .venv/bin/activate"


def test_the_pages_say_to_activate_the_venv_before_their_first_command():
    """make builds .venv but activates nothing: each page with relmt-* commands says `source
    .venv/bin/activate` before (or as the first line of) its first block of them."""
    for name in COMMAND_PAGES:
        text = (ROOT / name).read_text()
        first = re.search(r"```bash\n(?:source [^\n]*\n)?relmt-", text)
        assert first, name
        assert ACTIVATE in text[:first.end()], f"{name}: say `{ACTIVATE}` before its first relmt-* command"


def install_section() -> str:
    text = (ROOT / "docs/getting-started.md").read_text()
    assert "\n## Install\n" in text, "docs/getting-started.md: an Install section"
    return text.split("\n## Install\n")[1].split("\n## ")[0]


def test_the_install_section_puts_the_makefiles_cpu_torch_first():
    """pip resolves a bare torch from PyPI (a CUDA build on Linux): the section installs the Makefile's pin from
    PyTorch's CPU index, then relmt, and the README links it."""
    pin = re.search(r"pip install --quiet (torch==\S+)", (ROOT / "Makefile").read_text()).group(1)
    section = install_section()
    torch_line = f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu"
    assert torch_line in section and "pip install -e ." in section
    assert section.index(torch_line) < section.index("pip install -e .")
    floor = re.search(r'"(torch>=[0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)  # the tested floor
    assert f"`{floor}`" in section and "CUDA" in section
    assert "](docs/getting-started.md#install)" in (ROOT / "README.md").read_text()


def test_the_install_section_names_every_extra_and_what_it_brings():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", install_section(), re.M)}
    assert set(rows) == set(extras)
    for extra, requirements in extras.items():
        named = [e for e in extras if e != extra and f"`{e}`" in rows[extra]]  # "what `serve` ... bring"
        for requirement in requirements:
            name = re.match(r"[\w.-]+(\[[\w,]+\])?", requirement).group(0)
            assert name in rows[extra] or name.removeprefix("relmt[").rstrip("]") in named or \
                any(requirement in extras[e] for e in named), (extra, requirement)


# --- issue 74 §4.2: after make train, the toy test set as text for relmt-translate and relmt-score ------------

TOY_PAGES = ["README.md", "docs/index.md", "docs/getting-started.md"]


def toy_text_block(name: str) -> list[str]:
    """The lines of the page's ```bash block that holds `make toy-text`."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / name).read_text(), re.S)
    found = [b for b in blocks if "make toy-text" in b]
    assert found, f"{name}: no ```bash block with `make toy-text` (issue 74 §4.2)"
    return [line for line in found[0].splitlines() if line.strip()]


@pytest.mark.slow
def test_the_toy_test_set_as_text_is_one_documented_command_that_translate_and_score_take(tmp_path):
    """`make toy-text` runs scripts/reproduce/toy_corpus.py into data/toy_text, the sentences make train's corpus
    holds; the README's commands after it (the same on the site's home page and Getting started) translate and
    score its test split with a run's checkpoint, as written but for the run directory."""
    import shlex
    import subprocess
    import sys
    from dataclasses import asdict

    from relmt.config import compose
    from relmt.data.toy import generate
    from tests.tiny_checkpoints import toy_tokenizer, write_checkpoint

    block = toy_text_block("README.md")
    assert all(toy_text_block(name) == block for name in TOY_PAGES)
    assert block[0].split("#")[0].split() == ["make", "toy-text"] and block[1] == ACTIVATE
    assert [line.split()[0] for line in block[2:]] == ["RUN=runs/2026-11-29/10-00-00", "relmt-translate",
                                                        "relmt-score"]
    # what make toy-text runs (a dry run: it does not build .venv), run here into tmp_path
    dry = subprocess.run(["make", "-n", "-s", "toy-text"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    recipe = shlex.split([line for line in dry.stdout.splitlines() if "toy_corpus.py" in line][-1])
    assert recipe[0].endswith("python") and recipe[1:] == ["scripts/reproduce/toy_corpus.py", "data/toy_text"]
    done = subprocess.run([sys.executable, str(ROOT / recipe[1]), recipe[2]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = tmp_path / "data/toy_text"
    toy = compose([]).data.toy  # make train's corpus: configs/data/toy.yaml
    splits = generate(**asdict(toy))
    for split in ("train", "valid", "test", "test_long"):
        assert (text / f"{split}.src").read_text().splitlines() == [s for s, _ in splits[split]]
        assert (text / f"{split}.tgt").read_text().splitlines() == [t for _, t in splits[split]]
    for side in ("src", "tgt"):  # an untrained model decodes 30 sentences in a few seconds, 500 in a minute
        lines = (text / f"test.{side}").read_text().splitlines(keepends=True)
        (text / f"test.{side}").write_text("".join(lines[:30]))
    write_checkpoint(tmp_path / "runs/mine/checkpoints", "best.pt", toy_tokenizer(tmp_path), seed=1)
    script = "\n".join(["set -e", *(line.replace("runs/2026-11-29/10-00-00", "runs/mine") for line in block[2:])])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert len((tmp_path / "hyp.tgt").read_text().splitlines()) == 30
    assert "sacreBLEU" in done.stdout and "Moses (tgt, English rules)" in done.stdout, done.stdout
