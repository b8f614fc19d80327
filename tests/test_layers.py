"""The import layers of STYLE.md §3 hold: no module of relmt imports from a layer above its own
(scripts/import_layers.py draws them), and translating never imports the trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts_import import load_script

ROOT = Path(__file__).parents[1]
layers = load_script("import_layers")


def test_no_module_imports_from_a_higher_layer():
    found = layers.package_imports(ROOT)
    assert len(found) > 50  # the walk sees the package's imports at all
    bad = layers.upward(found)
    assert not bad, "imports that go up a layer:\n" + "\n".join(map(str, bad))


def test_every_module_has_a_layer():
    for path in (ROOT / "relmt").rglob("*.py"):
        assert layers.layer(layers.module_name(path, ROOT)) >= 1


@pytest.mark.parametrize("module,source,target", [
    ("relmt.decode.translator", "from relmt.train import checkpoint", "relmt.train.checkpoint"),
    ("relmt.config", "def f():\n    from relmt.model.positions import PosKind", "relmt.model.positions"),
    ("relmt.data.prepare", "import relmt.bench", "relmt.bench"),
    ("relmt.evaluate.metrics", "from ..train import loss", "relmt.train.loss"),
    ("relmt.report.tables", "from relmt.train.loop import train", "relmt.train.loop"),
])
def test_a_fabricated_upward_import_is_flagged_with_module_and_target(module, source, target):
    known = {"relmt.train.checkpoint", "relmt.train.loss", "relmt.train.loop", "relmt.model.positions"}
    found = layers.imports(source, module, False, known)
    assert [(imp.module, imp.target) for imp in layers.upward(found)] == [(module, target)]
    assert f"{module} (layer" in str(layers.upward(found)[0]) and target in str(layers.upward(found)[0])


def test_imports_from_the_same_or_a_lower_layer_pass():
    known = {"relmt.checkpoint", "relmt.runtime", "relmt.train.loss"}
    source = "from relmt import checkpoint\nfrom relmt.runtime import resolve_device\nfrom .loss import x"
    found = layers.imports(source, "relmt.train.validate", False, known)
    assert [imp.target for imp in found] == ["relmt.checkpoint", "relmt.runtime", "relmt.train.loss"]
    assert layers.upward(found) == []


def test_the_script_reports_the_layers_and_exits_0():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_layers.py")], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| 3 | checkpoint | relmt.checkpoint |" in done.stdout and "0 upward import(s)" in done.stdout


def test_translating_does_not_import_the_trainer():
    """A user who only translates needs neither the training loop nor its dependencies: nor the data
    pipeline's `datasets` (with pandas, two seconds of every relmt-translate's start)."""
    code = ("import relmt.decode.translator, sys; "
            "bad = sorted(m for m in sys.modules if m.startswith(('relmt.train', 'relmt.data.dataset', 'datasets'))); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
