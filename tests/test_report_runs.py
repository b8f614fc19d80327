"""relmt-report's reading of run directories: the model preset's name, learning curves from
metrics.jsonl, the console script, and the report layer's imports."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from relmt.cli.report import main
from relmt.report.aggregate import Stat
from relmt.report.runs import load_run, read_curve
from relmt.report.tables import learning_curves, sampled
from tests.report_runs import config, write_run

ROOT = Path(__file__).parents[1]


def test_every_model_preset_records_its_name():
    for path in sorted((ROOT / "configs" / "model").glob("*.yaml")):
        assert yaml.safe_load(path.read_text())["name"] == path.stem, path


def test_runs_group_by_the_recorded_preset_and_old_runs_say_their_size_is_guessed(tmp_path):
    test = {"test": {"bleu": 30.0}}
    write_run(tmp_path / "new_rel", config(1, "rel"), test)  # model.name: mmt_tiny, d_model 128
    write_run(tmp_path / "new_abs", config(1, "abs"), {"test": {"bleu": 29.0}})
    write_run(tmp_path / "old_rel", config(1, "rel", model=None), test)  # config.yaml from before model.name
    assert (load_run(tmp_path / "new_rel").model, load_run(tmp_path / "new_rel").model_guessed) == ("mmt_tiny", False)
    assert (load_run(tmp_path / "old_rel").model, load_run(tmp_path / "old_rel").model_guessed) == ("toy", True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=x", "kind=tables"]) == 0
    md = buf.getvalue()
    new = md[md.index("## multi30k_text, mmt_tiny model (d_model 128)"):md.index("## multi30k_text, toy model")]
    old = md[md.index("## multi30k_text, toy model (d_model 128)"):md.index("## Claims")]
    assert "guessed" not in new and "2 runs;" in new
    assert 'The model preset "toy" is guessed from d_model: these runs\' config.yaml predates model.name.' in old
    # a toy run that records its preset joins the guessed one, and the note counts the guessed runs
    write_run(tmp_path / "named_toy", config(2, "rel", model="toy"), test)
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=x", "kind=tables", "overwrite=true"]) == 0
    assert ('For 1 of the 2 runs the model preset "toy" is guessed from d_model (their config.yaml predates '
            'model.name).') in buf.getvalue()


def test_read_curve_keeps_the_last_valid_record_of_each_update(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 100, "tag": "train", "loss": 3.0}\n'
                    '{"step": 500, "tag": "valid", "bleu": 10.0}\n'
                    '{"step": 1000, "tag": "valid", "loss": 2.0}\n'  # validation without BLEU (train.valid_bleu=false)
                    '{"step": 1000, "tag": "valid", "bleu": 12.0}\n'
                    '{"step": 500, "tag": "valid", "bleu": 11.0}\n'  # logged again by a resumed run
                    '[1, 2]\n'
                    '{"step": 15')  # cut short by a kill
    assert read_curve(path) == [(500, 11.0), (1000, 12.0)]
    assert read_curve(tmp_path / "missing.jsonl") == []


def test_learning_curves_average_seeds_at_each_update(tmp_path):
    runs = []
    for seed, curve in ((1, [(500, 10.0), (1000, 20.0)]), (2, [(500, 12.0)])):  # seed 2 stopped early
        runs.append(load_run(write_run(tmp_path / f"rel{seed}", config(seed, "rel"), {}, curve=curve)))
    runs.append(load_run(write_run(tmp_path / "abs1", config(1, "abs"), {}, curve=[(1000, 5.0)])))
    curves = learning_curves(runs)
    assert curves["columns"] == ["abs", "rel"] and curves["seeds"] == {"abs": [1], "rel": [1, 2]}
    assert [r["step"] for r in curves["rows"]] == [500, 1000]
    assert curves["rows"][0]["bleu"] == {"abs": None, "rel": Stat(11.0, pytest.approx(2 ** 0.5), 2)}
    assert curves["rows"][1]["bleu"] == {"abs": Stat(5.0, 0.0, 1), "rel": Stat(20.0, 0.0, 1)}
    assert learning_curves([load_run(write_run(tmp_path / "none", config(1, "rel"), {}))]) is None


def test_sampled_rows_keep_the_first_and_the_last():
    rows = [{"step": i} for i in range(20)]
    picked = [r["step"] for r in sampled(rows, 8)]
    assert len(picked) == 8 and picked[0] == 0 and picked[-1] == 19 and picked == sorted(picked)
    assert sampled(rows[:5], 8) == rows[:5]


def test_console_script_points_at_main():
    # tomllib is Python 3.11+; the project supports 3.10, so the [project.scripts] line is read as text
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    assert 'relmt-report = "relmt.cli.report:main"' in scripts.splitlines()
    proc = subprocess.run([sys.executable, "-m", "relmt.cli.report", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("relmt-report RUN_DIR... out=DIR name=NAME ")
    assert "refs=DIR" in proc.stdout and "overwrite=true" in proc.stdout


def test_report_layer_imports_no_trainer_cli_or_bench():
    """STYLE.md §3: report sits above evaluate and below cli; it reads run directories, never the trainer."""
    for path in sorted((ROOT / "relmt" / "report").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("relmt.train", "relmt.cli", "relmt.bench")), (path.name, name)


def test_length_filtered_runs_form_a_group_of_their_own(tmp_path):
    for name, seed, extra in (("full", 1, {}), ("filtered", 1, {"train_max_src_words": 14}),
                              ("off", 2, {"train_max_src_words": 0})):
        write_run(tmp_path / name, config(seed, "rel", **extra), {"test": {"bleu": 30.0}})
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=x", "kind=tables"]) == 0
    md = buf.getvalue()
    assert "## multi30k_text, mmt_tiny model (d_model 128)\n\n2 runs;" in md  # 0 = no filter
    assert "## multi30k_text, mmt_tiny model (d_model 128; training sources ≤ 14 words)\n\n1 run;" in md


def test_a_run_resumed_before_wall_time_summed_sessions_counts_its_update_time(tmp_path):
    """Such a run's wall_seconds is its last session only; its train_seconds (update steps, summed
    over sessions) is the better figure, and the report takes the larger."""
    run = write_run(tmp_path / "r", config(1, "rel"), {"test": {"bleu": 30.0}})
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "wall_seconds": 1800.0, "train_seconds": 5400.0}))
    assert load_run(run).minutes == 90
    (run / "metrics.json").write_text(json.dumps({**metrics, "wall_seconds": 7200.0, "train_seconds": 5400.0}))
    assert load_run(run).minutes == 120
    (run / "metrics.json").write_text(json.dumps({**metrics, "wall_seconds": 1800.0, "train_seconds": 1700.0,
                                                  "test_seconds": 120.0}))
    assert load_run(run).minutes == 32  # the final test decoding counts where the run recorded it


def test_the_report_names_the_sacrebleu_signatures_and_says_when_runs_differ(tmp_path):
    """Issue 12 asks for sacreBLEU with its signature: each group lists the signatures its figures were
    computed with, once when the runs agree and with run counts when they do not."""
    old, new = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1", "nrefs:1|case:mixed|tok:13a|version:2.6.0"
    chrf = "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
    for seed, sig in ((1, old), (2, new), (3, new)):
        write_run(tmp_path / f"rel_s{seed}", config(seed, "rel"),
                  {"test": {"bleu": 30.0, "signature": sig, "chrf": 50.0, "chrf_signature": chrf}},
                  valid={"bleu": 29.0, "signature": sig})
    assert load_run(tmp_path / "rel_s1").signatures == {"bleu": (old,), "chrf": (chrf,), "tokenized_bleu": ()}
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=x", "kind=tables"]) == 0
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("Signatures: "))
    assert line == (f"Signatures: sacreBLEU `{new}` (2 runs), `{old}` (1 run); chrF `{chrf}`.")


def test_the_report_modules_import_each_other_without_a_circle():
    """Every `relmt.report` import of every report module, TYPE_CHECKING blocks included, forms no cycle."""
    graph = {}
    for path in (ROOT / "relmt" / "report").glob("*.py"):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("relmt.report"):
                module = node.module
                names = [module] if module != "relmt.report" else [f"relmt.report.{a.name}" for a in node.names]
                targets.update(n.split(".")[2] for n in names)
        graph[path.stem] = targets

    def cycle(module: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        if module in seen:
            return (*seen[seen.index(module):], module)
        return next((c for t in sorted(graph.get(module, ())) if (c := cycle(t, (*seen, module)))), None)

    assert [c for m in sorted(graph) if (c := cycle(m, ()))] == []


def test_translations_and_references_split_on_newlines_only(tmp_path):
    """A U+2028 or U+0085 inside a line (the data loader keeps them) does not split it: the seed pairs are
    still tested, on as many translations as references."""
    refs_dir = tmp_path / "refs"
    refs_dir.mkdir()
    refs = [f"ein satz nummer {i} mit\u2028trenner" if i % 3 == 0 else f"ein satz nummer {i}\x85" for i in range(30)]
    (refs_dir / "test.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    for positions, seed in (("abs", 1), ("rel", 1)):
        hyps = [r if positions == "rel" or i % 2 else "falsch" for i, r in enumerate(refs)]
        write_run(tmp_path / "runs" / f"{positions}{seed}", config(seed, positions), {"test": {"bleu": 50.0}},
                  translations={"test": hyps})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=x", f"refs={refs_dir}",
                     "bootstrap_samples=100"]) == 0
    doc = json.loads((tmp_path / "out" / "x.json").read_text())
    (test,) = [c for c in doc["groups"][0]["significance"] if (c["baseline"], c["system"]) == ("abs", "rel")]
    assert test["missing"] == [] and len(test["tests"]) == 1 and test["sentences"] == 30


def test_runs_average_as_seeds_only_when_every_other_setting_agrees(tmp_path):
    """Issue 32 §3: a rel run with shared heads and one with per-head tables, both seed 1, were averaged as
    'rel (2)' with 'seeds 1'. Now the report warns, naming the setting and its values; a second run with
    the same seed and settings is a duplicate, left out and named; a run from before a setting existed
    agrees with one that has its default."""
    test = {"test": {"bleu": 30.0}}
    write_run(tmp_path / "runs" / "a", config(1, "rel"), test)
    shared = config(1, "rel")
    shared["model"]["relative_share_heads"] = True
    write_run(tmp_path / "runs" / "b", shared, {"test": {"bleu": 10.0}})
    copy = config(1, "rel")
    copy["data"]["lowercase"] = False  # today's default, which run a's config.yaml predates
    write_run(tmp_path / "runs" / "c", copy, test)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path / "runs"), f"out={out}", "name=r", "kind=tables"]) == 0
    page = (out / "r.md").read_text()
    assert f"**Warning:** `{tmp_path / 'runs' / 'a'}`, `{tmp_path / 'runs' / 'b'}` are averaged as seeds of one " \
           "configuration but differ in model.relative_share_heads: false, true." in page
    assert f"Left out 1 duplicate run: `{tmp_path / 'runs' / 'c'}` (a duplicate of {tmp_path / 'runs' / 'a'}: " \
           "seed 1, the same settings)." in page
    doc = json.loads((out / "r.json").read_text())
    assert len(doc["warnings"]) == 1 and len(doc["runs"]) == 2 and "settings" not in doc["runs"][0]


def test_rope_alibi_and_t5_are_tested_against_abs_and_rel(tmp_path):
    """Beyond the paper (issue 31): a method's runs get a Table 1 row, seed-pair tests against abs and against
    rel, and a directional claim each way. By design (report_runs.hypotheses) rope equals the references on
    test, as rel does: ahead of abs there (held), level with rel (not significant)."""
    from tests.report_runs import SPLITS, hypotheses, scores, write_refs

    refs = write_refs(tmp_path / "refs")
    for positions in ("abs", "rel", "rope"):
        for seed in (1, 2, 3):
            hyps = {s: hypotheses(s, positions, seed, refs[s]) for s in SPLITS}
            write_run(tmp_path / "runs" / f"{positions}_s{seed}", config(seed, positions),
                      {s: scores(hyps[s], refs[s]) for s in SPLITS}, {"bleu": 30.0}, translations=hyps)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path / "runs"), f"out={out}", "name=p", f"refs={tmp_path / 'refs'}",
                     "bootstrap_samples=200"]) == 0
    doc = json.loads((out / "p.json").read_text())
    group = doc["groups"][0]
    assert [r["positions"] for r in group["tables"]["positions"]["rows"]] == ["abs", "rel", "rope"]
    tested = {(c["baseline"], c["system"]) for c in group["significance"]}
    assert {("abs", "rope"), ("rel", "rope")} <= tested
    verdicts = {(c["name"], c["split"]): c["verdict"] for c in group["claims"]}
    assert verdicts[("rope ≥ abs", "test")] == "held"
    assert verdicts[("rope ≥ rel", "test")] == "not significant"
    assert verdicts[("rope ≥ rel", "test_2017_mscoco")] == "held"  # rel corrupts mscoco by design
    assert not any("alibi" in name for name, _ in verdicts)  # no runs, no claims


def test_each_position_kind_gets_its_training_speed_and_the_cpu_it_ran_on(tmp_path):
    """Issue 31 §5 asks for each method's training tokens/s: from metrics.json, with the CPU its host entry
    names (runs from before relmt recorded it say so)."""
    speeds = {("abs", 1): (3000.0, "CPU A"), ("abs", 2): (4000.0, "CPU B"), ("rope", 1): (5000.0, None)}
    for (positions, seed), (speed, cpu) in speeds.items():
        run = write_run(tmp_path / "runs" / f"{positions}_s{seed}", config(seed, positions), {"test": {"bleu": 30.0}})
        metrics = json.loads((run / "metrics.json").read_text())
        metrics["tokens_per_s"] = speed
        if cpu:
            metrics["host"] = {"cpu": cpu}
        (run / "metrics.json").write_text(json.dumps(metrics))
    write_run(tmp_path / "runs" / "rel_s1", config(1, "rel"), {"test": {"bleu": 30.0}})  # no speed: no row
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path / "runs"), f"out={out}", "name=p", "kind=tables"]) == 0
    md = (out / "p.md").read_text()
    section = md[md.index("### Training speed"):]
    assert "| abs | 2 | 3,500 ± 707 | 1 | CPU A (1); CPU B (1) |" in section
    assert "| rope | 1 | 5,000 ± 0 | 1 | not recorded (1) |" in section
    assert "| rel |" not in section.split("\n\n##")[0]


def test_a_list_of_corpora_is_flattened_into_cells_of_its_own():
    """Issue 69 §2.13: relmt-report put the whole data.corpora JSON (the toy generator's settings too) in one cell."""
    from relmt.report.runs import flatten

    flat = flatten({"data": {"corpora": [{"name": "a", "weight": 1.0, "splits": {"train": "t"}},
                                         {"name": "b", "weight": 3.0}], "splits": {"train": "train"}}},
                   leaves=("splits",))
    assert flat == {"data.corpora.0.name": "a", "data.corpora.0.weight": 1.0, "data.corpora.0.splits": {"train": "t"},
                    "data.corpora.1.name": "b", "data.corpora.1.weight": 3.0, "data.splits": {"train": "train"}}
