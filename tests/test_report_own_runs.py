"""relmt-report on a user's own few runs (issue 45 §7): runs that are not one of the paper's experiments get a
short table (the runs, the settings they differ in, their scores), not the paper's columns, claims and rules."""

import contextlib
import io
import json

import pytest

from relmt.cli.report import main
from tests.report_runs import config, write_run

SCORES = {"test": {"bleu": 81.42}, "test_long": {"bleu": 25.54}}


def own_run(root, name, positions="rel", seed=1, speed=10651.5):
    cfg = config(seed, positions, data="toy", model="toy")
    cfg["train"]["max_steps"] = 400
    run = write_run(root / name, cfg, SCORES, {"bleu": 81.34}, curve=[(200, 60.0), (400, 81.34)])
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "tokens_per_s": speed}))
    return run


def report(tmp_path, *sources) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([*map(str, sources), f"out={tmp_path / 'out'}", "name=mine"]) == 0
    assert (tmp_path / "out" / "mine.md").read_text() == out.getvalue()
    return out.getvalue()


def assert_glanceable(text: str, max_lines: int) -> None:
    assert len(text.splitlines()) <= max_lines, text
    for paper_only in ("± 0.00 (1)", "paper (", "Checkpoint rules", "Not the paper's rule", "Verdicts.",
                       "No claim could be checked", "Table 1 analogue"):
        assert paper_only not in text, paper_only


def test_one_run_is_a_short_table(tmp_path):
    text = report(tmp_path, own_run(tmp_path / "runs", "one"))
    assert_glanceable(text, 15)
    assert "| run | valid sacreBLEU | test sacreBLEU | test_long sacreBLEU | updates | target tok/s |" in text
    assert "| one | 81.34 | 81.42 | 25.54 | 400 | 10,652 |" in text
    assert "`kind=tables`" in text and "--kind" not in text  # the way to the paper's tables


def test_three_runs_differing_in_positions_show_that_setting(tmp_path):
    for positions, speed in (("abs", 12000.0), ("rel", 10000.0), ("both", 9000.0)):
        own_run(tmp_path / "runs", positions, positions, speed=speed)
    text = report(tmp_path, tmp_path / "runs")
    assert_glanceable(text, 18)
    assert "| run | model.positions | valid sacreBLEU |" in text
    assert "| abs | abs | 81.34 | 81.42 | 25.54 | 400 | 12,000 |" in text
    assert "| both | both |" in text and "| rel | rel |" in text


def test_the_papers_tables_stay_one_flag_away(tmp_path):
    for positions in ("abs", "rel"):
        own_run(tmp_path / "runs", positions, positions)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=t", "kind=tables"]) == 0
    assert "Table 1 analogue" in out.getvalue() and "## Claims" in out.getvalue()


# --- issue 74 §4.10: key=value as every other command, and no report replaced silently -------------------------

def test_report_takes_key_value_and_refuses_to_replace_a_report_unless_told(tmp_path, capsys):
    run = own_run(tmp_path / "runs", "one")
    out = tmp_path / "reports"
    assert main([str(run), f"out={out}", "name=mine", "title=Mine: a first look", "kind=runs"]) == 0
    page = (out / "mine.md").read_text()
    assert page.startswith("# Mine: a first look\n") and (out / "mine.json").is_file()
    capsys.readouterr()
    # the same name again: refused, naming the file, and the report there is kept
    (out / "mine.md").write_text("kept\n")
    assert main([str(run), f"out={out}", "name=mine"]) == 2
    err = capsys.readouterr().err
    assert f"relmt-report: error: {out / 'mine.md'}: a report named mine is there already" in err
    assert "overwrite=true" in err and (out / "mine.md").read_text() == "kept\n"
    assert main([str(run), f"out={out}", "name=mine", "overwrite=true"]) == 0
    assert "| one |" in (out / "mine.md").read_text()
    # the options of before still work, with a note; a typo or a bare option gets relmt's own message
    capsys.readouterr()
    assert main([str(run), "--out", str(out), "--name", "old"]) == 0 and (out / "old.md").is_file()
    assert "relmt-report: note: --out, --name are deprecated; write out=..., name=..." in capsys.readouterr().err
    assert main([str(run), f"out={out}", "nmae=x"]) == 2
    assert "nmae: no such argument (did you mean name?)" in capsys.readouterr().err
    assert main([str(run), f"out={out}", "name=k", "kind=tabels"]) == 2
    assert "kind=tabels: not a report kind (did you mean tables?)" in capsys.readouterr().err
    assert main([f"out={out}", "name=x"]) == 2 and "no run directories" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["model.positions=rel", "sweep/seed=2"])
def test_a_run_directory_named_key_value_is_a_run_directory(tmp_path, monkeypatch, word):
    """A sweep job's directory is named key=value (model.positions=rel): a word whose key is no plain name (a dot,
    a slash) or that is an existing path is a run directory, not an argument."""
    monkeypatch.chdir(tmp_path)
    own_run(tmp_path, word)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([word, "out=reports", "name=r"]) == 0
    assert "81.42" in (tmp_path / "reports/r.md").read_text()
