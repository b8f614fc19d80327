"""docs/gpu.md's computed plan (issue 58): the committed snippet is what scripts/docs/gpu_plan.py computes from
docs/results/gpu/gpu_issue43.json and the configs, and its rules are the documented ones. Needs no GPU and
reads nothing outside the repository."""

import json

import pytest

from tests.scripts_import import ROOT, load_script


def test_the_committed_snippet_is_up_to_date():
    plan = load_script("gpu_plan")
    committed = (ROOT / "docs/snippets/gpu_plan.md").read_text()
    assert committed == plan.snippet(), "docs/snippets/gpu_plan.md is stale: run python scripts/docs/gpu_plan.py"
    assert '--8<-- "gpu_plan.md"' in (ROOT / "docs/gpu.md").read_text()


def test_the_batch_rule_keeps_the_update_at_49152_padded_tokens():
    """docs/training.md's shell arithmetic: update_freq = ceil(6 / N), max_padded_tokens = 49152 / (N x it),
    rounded down to a multiple of 8."""
    rule = load_script("gpu_plan").batch_rule
    assert [rule(n, 6, 49152) for n in (1, 2, 3, 4, 5, 6, 8, 16)] == [
        (6, 8192), (3, 8192), (2, 8192), (2, 6144), (2, 4912), (1, 8192), (1, 6144), (1, 3072)]
    for n in (1, 2, 3, 4, 6, 8, 16):
        freq, tokens = rule(n, 6, 49152)
        assert n * freq * tokens == 49152


def test_the_plan_reads_the_base_run_from_the_configs_and_the_measurement():
    plan = load_script("gpu_plan")
    rows = plan.plans()
    base = next(r for r in rows if r["size"] == "base" and r["positions"] == "rel")
    assert (base["train"].max_steps, base["train"].max_padded_tokens, base["train"].update_freq) == (100_000, 8192, 6)
    assert base["vocab"] == 32768 and 60e6 < base["params"] < 62e6  # the base Transformer with 32k shared pieces
    f = plan.figures(base)
    m = base["measured"]
    assert f["update"] == 49152
    assert f["hours_1"] * 3600 == pytest.approx(m["step_ms"] / 1e3 * 49152 / m["max_padded_tokens"] * 100_000)
    assert f["hours_n"] == pytest.approx(f["hours_1"] / 8)
    assert f["memory_1"] < f["peak_gib"]  # a micro-batch of 8192 padded tokens needs less than the measured 81,858
    one, files, total = plan.checkpoints(base)
    assert (one, files, total) == (base["params"] * 12, 21, base["params"] * 12 * 21)


def test_measure_cache_counts_the_train_split_and_the_vocabulary(tmp_path):
    entry = tmp_path / "wmt_like-abc"
    (entry / "ids").mkdir(parents=True)
    (entry / "encoded/train").mkdir(parents=True)
    (entry / "encoded/valid").mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps({"splits": {"train": {"pairs": 12, "kept": 10}}}))
    (entry / "spm.model").write_bytes(b"s" * 7)
    (entry / "ids/train.src.npy").write_bytes(b"x" * 100)
    (entry / "ids/train.src_offsets.npy").write_bytes(b"x" * 20)
    (entry / "ids/valid.src.npy").write_bytes(b"x" * 1000)  # not the train split
    (entry / "encoded/train/data-00000-of-00001.arrow").write_bytes(b"x" * 300)
    (entry / "encoded/valid/data-00000-of-00001.arrow").write_bytes(b"x" * 1000)
    assert load_script("gpu_plan").measure_cache(entry) == {"pairs": 10, "train_bytes": 420, "fixed_bytes": 7}
