"""The config reference (issue 57 §3): docs/config.md lists every key of the run config with its type, defaults
and help, and is regenerated from relmt/config.py by scripts/docs/config_reference.py, so it cannot drift."""

import re
from pathlib import Path

from relmt.config import compose, to_dict
from tests.scripts_import import load_script

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs/config.md"


def leaf_keys(values: dict, prefix: str = "") -> set[str]:
    """model.d_model, data.toy.seed, ...: the dotted keys of a nested dict's leaves (an empty dict is a leaf)."""
    out = set()
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out |= leaf_keys(value, f"{prefix}{key}.")
        else:
            out.add(prefix + key)
    return out


def page_rows() -> dict[str, str]:
    """key -> its table row in the committed page."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w.]+)` \|.*$", PAGE.read_text(), re.M)}


def test_the_committed_reference_is_what_the_script_writes():
    page = load_script("config_reference").render()
    assert PAGE.read_text() == page, "docs/config.md is stale: run python scripts/docs/config_reference.py"


def test_every_key_of_the_composed_config_has_a_row():
    keys = leaf_keys(to_dict(compose([])))
    assert keys == set(page_rows()), keys ^ set(page_rows())
    assert {"threads", "train.update_freq", "data.toy.max_words", "seed"} <= keys


def test_a_row_holds_the_type_the_defaults_and_the_comment():
    rows = page_rows()
    # an end-of-line comment; the default relmt-train runs with equals the schema's
    assert rows["seed"].startswith("| `seed` | int | `1` | torch's seed for the initial weights")
    # configs/train/default.yaml overrides the schema's 100000; comment lines above a field are its help too
    assert rows["train.max_steps"].startswith("| `train.max_steps` | int | `400`<br>schema: `100000` |")
    assert "| early stopping: stop after this many validations" in rows["train.patience"]
    assert "| int or null |" in rows["train.patience"]
    # an enum links to its choices; a pipe in a comment is escaped so that the cell does not end there
    assert "| [PosKind](#poskind) | `rel` |" in rows["model.positions"]
    assert r"auto \| cpu \| cuda" in rows["train.device"]


def test_the_own_corpus_page_points_to_it():
    own = (ROOT / "docs/own-corpus.md").read_text()
    assert "(config.md)" in own and "every key is listed in [Training]" not in own
    assert "relmt-train --cfg job" in PAGE.read_text()
