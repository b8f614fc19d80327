"""The README's commands agree with the defaults they run on (issue 32 §4)."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]


def test_the_averaging_example_fits_a_default_run():
    """`relmt-average dir=... last=N` needs N step_N.pt files: a default run keeps train.keep_last of them."""
    keep_last = yaml.safe_load((ROOT / "configs/train/default.yaml").read_text())["keep_last"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the README and the site's pages
    examples = re.findall(r"relmt-average dir=\S+ last=(\d+)", "".join(p.read_text() for p in pages))
    assert examples and all(int(n) <= keep_last for n in examples), (examples, keep_last)


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
