"""docs/gpu.md's computed plan (issue 58): the table in the page is what scripts/docs/gpu_plan.py computes from
docs/results/gpu/gpu_issue43.json and the configs, and its rules are the documented ones. Needs no GPU and
reads nothing outside the repository."""

import json

import pytest

from tests.scripts_import import ROOT, load_script


def test_the_table_in_the_page_is_up_to_date():
    plan = load_script("gpu_plan")
    committed = (ROOT / "docs/gpu.md").read_text()
    assert committed == plan.page(committed), "docs/gpu.md's cost table is stale: run python scripts/docs/gpu_plan.py"


def test_the_table_says_which_measurement_rel_is_and_sets_the_forecast_beside_it():
    """rel's step time is 2026-11-27's code: the table names that day, what 2026-11-28 measured in between and
    the roofline forecast for today's code, each from its committed results file."""
    plan = load_script("gpu_plan")
    rows = plan.plans()
    s = plan.since(rows)
    measured = json.loads(plan.MEASURED.read_text())
    assert s["measured_base"] == next(r["over_abs_step_time"] for r in measured["train"] if r["system"] == "relmt"
                                      and r["size"] == "base" and r["positions"] == "rel")
    assert s["later_date"] == "2026-11-28" and s["later"] > s["measured_base"]  # the scans: slower, not faster
    assert s["forecast_size"] == "base" and s["forecast"]["abs"] == 1.0 and s["roofline_before"] > s["forecast"]["rel"]
    text = plan.table(rows)
    assert measured["hardware"]["date"] in text and "forecast, not measured" in text
    row = next(line for line in text.splitlines() if line.startswith("| base | rel |"))
    assert f"| {s['measured_base']:.2f} | {s['forecast']['rel']:.2f} |" in row
    assert next(line for line in text.splitlines() if line.startswith("| big | rel |")).count("| — |") == 1
    for figure in (s["measured_base"], s["later"], s["roofline_before"]):
        assert f"{figure:.2f}x" in text


def test_the_page_block_replaces_only_what_lies_between_its_markers():
    block = load_script("page_block")
    begin, end = block.markers("scripts/x.py")
    page = f"# Page\n\nbefore\n\n{begin}\nold\n{end}\n\nafter\n"
    assert block.replaced(page, "scripts/x.py", "| a |\n|---|\n") == (
        f"# Page\n\nbefore\n\n{begin}\n\n| a |\n|---|\n\n{end}\n\nafter\n")
    for broken in ("# Page\n", page.replace(end, ""), page + begin + "\n", f"{end}\n{begin}\n"):
        with pytest.raises(ValueError, match="needs one"):
            block.replaced(broken, "scripts/x.py", "x")


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
