"""Every run of every queue in scripts/reproduce/queues/ composes, builds its model and accepts its train.freeze
patterns: a queued run must not fail hours later on a typo in its overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relmt.config import compose
from relmt.model.transformer import build_model
from relmt.train.optim import trainable

QUEUES = sorted((Path(__file__).parents[1] / "scripts" / "reproduce" / "queues").glob("*.txt"))


def queue_runs(path: Path) -> list[tuple[str, list[str]]]:
    """(name, overrides) of each run, with the queue's common overrides first, as run_queue.sh reads it."""
    common, runs = [], []
    for line in path.read_text().splitlines():
        line = line.replace("@DATA", "some/folder").strip()
        if not line or line.startswith("#") or line.startswith(("out:", "keep:", "threads:")):
            continue
        if line.startswith("common:"):
            common += line[len("common:"):].split()
            continue
        name, *overrides = line.split()
        runs.append((name, overrides))
    return [(name, common + overrides) for name, overrides in runs]


RUNS = [(f"{q.stem}:{name}", overrides) for q in QUEUES for name, overrides in queue_runs(q)]


def test_the_queues_are_found():
    assert {q.stem for q in QUEUES} >= {"multi30k_tables", "length", "toy_converged"}
    assert len([r for r in RUNS if r[0].startswith("multi30k_tables:")]) == 18  # issue 12's Tables 1-3


@pytest.mark.parametrize("name,overrides", RUNS, ids=[r[0] for r in RUNS])
def test_every_queued_run_composes_and_builds(name, overrides):
    cfg = compose(overrides)
    model = build_model(cfg.model, vocab_size=32, pad_id=0)
    assert trainable(model, cfg.train.freeze)  # a pattern that matches nothing raises
    seed = re.search(r"_s(\d+)$", name)
    if seed:
        assert cfg.seed == int(seed.group(1))  # a name's seed is its run's
