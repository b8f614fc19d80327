"""relmt-report's controlled experiments (relmt/report/controls.py): the runs outside Tables 1-3 stay
out of them and are set beside the configurations one setting away, with known outcomes."""

from __future__ import annotations

import json
import re

import pytest

from relmt.cli.report import main
from relmt.report.controls import Setting, split_variants, stages_table, tail_range, usual_updates
from relmt.report.runs import find_run_dirs, read_runs
from tests.report_runs import config, corrupt, scores, write_refs, write_run

SPLITS = ("test",)
# name -> (positions, a^K, a^V, updates, frozen, sentences corrupted on test). Every other run trains
# for 4000 updates with nothing frozen; the variants are keys_long, both_keys and values_frozen.
DESIGN = {
    "abs": ("abs", True, True, 4000, [], 20),
    "rel": ("rel", True, True, 4000, [], 0),
    "both": ("both", True, True, 4000, [], 0),
    "keys": ("rel", True, False, 4000, [], 30),
    "values": ("rel", False, True, 4000, [], 10),
    "keys_long": ("rel", True, False, 16000, [], 0),
    "both_keys": ("both", True, False, 4000, [], 5),
    "values_frozen": ("rel", False, True, 4000, ["*.rel.w_v"], 10),
}
SEEDS = (1, 2)


@pytest.fixture
def toy_like(tmp_path):
    refs = write_refs(tmp_path / "refs", SPLITS)["test"]
    for name, (positions, keys, values, updates, frozen, bad) in DESIGN.items():
        for seed in SEEDS:
            cfg = config(seed, positions, keys=keys, values=values, data="toy_like", model="toy")
            cfg["data"]["splits"] = {"train": "train", "valid": "valid", "test": "test"}
            cfg["train"].update(max_steps=updates, freeze=frozen)
            hyps = [corrupt(r) if i < bad else r for i, r in enumerate(refs)]
            final = 90.0 - bad + seed
            # keys_long validates every 1600 updates, the others every 400
            first = 1600 if updates > 4000 else 400
            write_run(tmp_path / "runs" / f"{name}_s{seed}", cfg, {"test": scores(hyps, refs)}, {"bleu": final},
                      curve=[(first, 50.0 - bad + seed), (updates, final)], translations={"test": hyps})
    return tmp_path


def test_settings_name_what_differs_and_split_the_variants_out(toy_like):
    runs, _ = read_runs(find_run_dirs([str(toy_like / "runs")]))
    assert usual_updates(runs) == 4000
    standard, variants = split_variants(runs)
    assert sorted({r.path.name.rsplit("_s", 1)[0] for r in variants}) == ["both_keys", "keys_long", "values_frozen"]
    assert len(standard) == 10
    labels = {r.path.name: Setting.of(r).label(16, 4000) for r in variants if r.seed == 1}
    assert labels == {"keys_long_s1": "rel, a^K only, 16000 updates", "both_keys_s1": "both, a^K only",
                      "values_frozen_s1": "rel, a^V only, frozen `*.rel.w_v`"}
    abs_run = next(r for r in runs if r.positions == "abs")
    assert Setting.of(abs_run).k is None  # k, a^K and a^V change nothing without relative positions


def test_the_report_sets_each_variant_beside_its_controls(toy_like):
    out = toy_like / "out"
    assert main([str(toy_like / "runs"), f"out={out}", "name=toy", f"refs={toy_like / 'refs'}",
                 "bootstrap_samples=200"]) == 0
    doc = json.loads((out / "toy.json").read_text())
    group = doc["groups"][0]
    assert len(group["runs"]) == 10 and len(group["variants"]) == 6
    # Table 3's (no, yes) row is the trained a^V runs only: the frozen ones would pull it down to the same
    # value here, so check the run count, not only the mean.
    kv = {(r["relative_keys"], r["relative_values"]): r for r in group["tables"]["kv"]["rows"]}
    assert kv[(False, True)]["runs"] == 2 and kv[(True, False)]["runs"] == 2
    assert kv[(True, False)]["bleu"]["valid"]["mean"] == pytest.approx(90.0 - 30 + 1.5)  # not keys_long's
    rows = {r["label"]: r for r in group["controls"]["rows"]}
    assert set(rows) == {"rel, a^K only, 16000 updates", "both, a^K only", "rel, a^V only, frozen `*.rel.w_v`"}
    controls = {r: {(c["label"], c["differs_in"]) for c in rows[r]["controls"]} for r in rows}
    assert controls == {"rel, a^K only, 16000 updates": {("rel, a^K only", "updates")},
                        "both, a^K only": {("both", "a^V"), ("rel, a^K only", "positions")},
                        "rel, a^V only, frozen `*.rel.w_v`": {("rel, a^V only", "frozen parameters")}}
    # keys_long translates perfectly where keys corrupts 30 of 40 sentences: significant on both seeds
    long_vs_short = rows["rel, a^K only, 16000 updates"]["controls"][0]["tests"][0]
    assert [t["seed"] for t in long_vs_short["tests"]] == [1, 2]
    assert all(t["p_value"] < 0.05 and t["system"] > t["baseline"] for t in long_vs_short["tests"])
    # frozen a^V gives the same translations as trained a^V: no difference, nothing significant
    frozen = rows["rel, a^V only, frozen `*.rel.w_v`"]["controls"][0]["tests"][0]["tests"]
    assert all(t["system"] == t["baseline"] and t["p_value"] >= 0.05 for t in frozen)
    stages = {r["label"]: r for r in group["stages"]["rows"]}
    assert group["stages"]["first_update"] == 400
    assert stages["rel, a^K only"]["first"]["mean"] == pytest.approx(50.0 - 30 + 1.5)
    assert stages["rel, a^K only, 16000 updates"]["final"]["mean"] == pytest.approx(91.5)
    md = (out / "toy.md").read_text()
    assert "10 runs and 6 runs of controlled experiments (below)" in md
    assert "### Controlled experiments: the runs outside Tables 1-3" in md
    assert "| difference (variant − rel, a^K only) |  | +30.00 |" in md  # valid: 91.5 against 61.5
    assert re.search(r"- against rel, a\^K only: test: all seeds \(2 \+ 2\) \+\d+\.\d\d \[\+\d+\.\d\d, \+\d+\.\d\d\] "
                     r"p = 0\.000; 2 of 2 seed pairs significant \(2 ahead, 0 behind\)", md)
    # the fabricated curves jump from update 400 to the last: one validation in the last 20%, no range
    assert "| rel, a^K only, 16000 updates | 1, 2 | – | 91.50 ± 0.71 (2) | – | – | – |" in md


def test_converged_means_flat_over_the_last_fifth_of_the_updates(tmp_path):
    run = write_run(tmp_path / "r", config(1, "rel"), {"test": {"bleu": 1.0}},
                    curve=[(400, 50.0), (3200, 90.0), (3600, 91.5), (4000, 90.8)])
    (loaded,) = read_runs([run])[0]
    assert tail_range(loaded) == pytest.approx(1.5)  # 3200-4000: updates ≥ 80% of 4000
    stages = stages_table([loaded], 16)
    assert stages["rows"][0]["flat"] is False and stages["rows"][0]["tail_range"] == pytest.approx(1.5)


def test_a_group_of_variants_only_keeps_them_as_its_runs(toy_like):
    runs = [r for r in read_runs(find_run_dirs([str(toy_like / "runs")]))[0] if r.path.name.startswith("both_keys")]
    from relmt.report.build import group_runs

    (group,) = group_runs(runs)
    assert len(group.runs) == 2 and group.variants == []
