"""relmt-report on a user's own few runs (issue 45 §7): runs that are not one of the paper's experiments get a
short table (the runs, the settings they differ in, their scores), not the paper's columns, claims and rules."""

import contextlib
import io
import json

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
        assert main([*map(str, sources), "--out", str(tmp_path / "out"), "--name", "mine"]) == 0
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
    assert "--kind tables" in text  # the way to the paper's tables


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
        assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--name", "t", "--kind", "tables"]) == 0
    assert "Table 1 analogue" in out.getvalue() and "## Claims" in out.getvalue()
