"""make test's own scheduling (issue 76's review of make test's time): the tests marked `first` are collected ahead
of all others (tests/conftest.py), and `shared_tiny` trains a model once however often, and by however many
workers, it is asked for (tests/tiny_checkpoints.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from tests import tiny_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def test_tests_marked_first_are_collected_before_the_others():
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                             "not exhaustive and not gpu", "tests/test_engines.py", "tests/test_translate.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300).stdout.splitlines()
    tests = [line for line in listed if "::" in line]
    first = [t for t in tests if "per_head_model_as_eager_relmt[aoti]" in t or "int8_on_engine_aoti" in t or
             "aoti_package" in t or "aoti_export_of_other_graphs" in t]
    assert len(first) == 6, tests[:10]
    assert tests[:6] == first  # ahead of test_engines' other tests and of test_translate's, in the module's order
    assert tests[0].endswith("per_head_model_as_eager_relmt[aoti]")  # the one that compiles, then those reusing it
    assert len(tests) > 6 and tests[6].startswith("tests/test_engines.py")


def test_shared_tiny_trains_once_for_every_caller(tmp_path_factory, monkeypatch):
    trained = []

    def fake_train(directory: Path, *overrides: str) -> Path:
        trained.append(overrides)
        last = directory / "run" / "checkpoints" / "last.pt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"checkpoint")
        return last

    monkeypatch.setattr(tiny_checkpoints, "train_tiny", fake_train)
    name = f"order-{uuid.uuid4().hex}"
    first = tiny_checkpoints.shared_tiny(tmp_path_factory, name, "model.relative_share_heads=true")
    again = tiny_checkpoints.shared_tiny(tmp_path_factory, name, "model.relative_share_heads=true")
    assert first == again and first.read_bytes() == b"checkpoint"
    assert trained == [("model.relative_share_heads=true",)]
    (first.parent.parent.parent / "stale").mkdir()  # a folder left by a worker killed while training ...
    first.unlink()
    tiny_checkpoints.shared_tiny(tmp_path_factory, name)  # ... is removed and the model trained again
    assert len(trained) == 2 and not (first.parent.parent.parent / "stale").exists()
