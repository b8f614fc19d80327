"""relmt-report's tables (relmt/report/, wrapped by scripts/reproduce/paper_tables.py) on fabricated run
directories with known numbers."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from relmt.cli.report import main
from relmt.report.aggregate import aggregate

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "reproduce" / "paper_tables.py"

BUCKETS = ("1-8", "9-16", "17-24", "25-32", "33+")
SENTENCES = (259, 241, 252, 248, 0)
TOK_LABEL = "tokenized BLEU: Moses (en) + compound splitting, tokenize=none (not sacreBLEU)"


def make_run(root: Path, name: str, *, positions: str = "rel", k: int = 16, keys: bool = True, values: bool = True,
             seed: int = 1, valid: float | None = None, test: float = 0.0, test_long: float | None = None,
             buckets: tuple[float, ...] | None = None, status: str = "completed", data: str = "toy",
             d_model: int = 128, tok: float | None = 0.5, checkpoint: str | None = "last",
             rule: str | None = None, cfg_rule: str | None = None) -> Path:
    """A run directory as relmt-train leaves it: config.yaml and metrics.json.

    The tokenized BLEU of each scored split is its sacreBLEU + `tok` (None: an older metrics.json
    without it). The test splits scored checkpoints/`checkpoint`.pt; `rule` is metrics.json's
    test_checkpoint_rule and `cfg_rule` the config's train.test_checkpoint (None: not written)."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {"seed": seed, "data": {"name": data}, "decode": {"beam": 1},
           "model": {"d_model": d_model, "positions": positions, "max_relative_position": k,
                     "relative_keys": keys, "relative_values": values}}
    if cfg_rule is not None:
        cfg["train"] = {"test_checkpoint": cfg_rule}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))

    def scores(bleu: float) -> dict:
        extra = {} if tok is None else {"tokenized_bleu": bleu + tok, "tokenized_label": TOK_LABEL}
        return {"bleu": bleu, "signature": "nrefs:1", "sentences": 500, **extra}

    splits = {"test": scores(test)}
    if test_long is not None:
        splits["test_long"] = scores(test_long)
    metrics = {"status": status, "steps": 400, "final_valid": {"loss": 1.0}, "test": splits}
    if valid is not None:
        metrics["final_valid"].update(scores(valid))
    if checkpoint is not None:
        metrics["test_checkpoint"] = str(run / "checkpoints" / f"{checkpoint}.pt")
    if rule is not None:
        metrics["test_checkpoint_rule"] = rule
    if buckets is not None:
        metrics["by_source_length"] = {"splits": list(splits), "buckets": [
            {"bucket": b, "sentences": n, "bleu": None if n == 0 else v}
            for b, n, v in zip(BUCKETS, SENTENCES, (*buckets, None))]}
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def fabricate_sweep(root: Path) -> None:
    """The layout of scripts/reproduce/reproduce_toy.sh: the shared rel run (k=16, a^K a^V on) lives in positions/.

    Designed outcomes on the test split: rel 81 ≥ abs 79 (held); k=0 11 < 0.5 × 81 (held);
    k ≥ 2 spread 81 − 77 = 4 > 1.5 (did not hold); |a^K only 81 − 81| = 0 ≤ 1 (held);
    test_long rel 30.5 > abs 22 (held); both − rel = 82.5 − 81 = 1.5 > 0.5 (did not hold);
    a^V only 76 is 5 below 81, more than "slightly" (≤ 2; did not hold)."""
    pos = root / "positions"
    for seed, (v, t, tl, b1) in enumerate([(77, 78, 20, 85), (79, 80, 24, 87)], start=1):
        make_run(pos, f"abs_s{seed}", positions="abs", seed=seed, valid=v, test=t, test_long=tl,
                 buckets=(b1, 70, 30, 20))
    for seed, (v, t, tl, b1) in enumerate([(80, 80, 30, 88), (80, 82, 31, 88)], start=1):
        make_run(pos, f"rel_s{seed}", positions="rel", seed=seed, valid=v, test=t, test_long=tl,
                 buckets=(b1, 75, 40, 33))
    for seed, t in enumerate([82, 83], start=1):
        make_run(pos, f"both_s{seed}", positions="both", seed=seed, valid=81, test=t, test_long=31,
                 buckets=(89, 76, 41, 34))
    for k, scores in {0: (10, 12), 1: (70, 72), 2: (76, 78), 64: (80, 81)}.items():
        for seed, t in enumerate(scores, start=1):
            make_run(root / "k", f"k={k},seed={seed}", k=k, seed=seed, valid=t - 1, test=t, test_long=t / 2)
    make_run(root / "k", "k=256,seed=1", k=256, seed=1, valid=1, test=1, status="interrupted")
    for keys, values, scores in ((True, False, (80.5, 81.5)), (False, True, (75, 77)), (False, False, (12, 14))):
        for seed, t in enumerate(scores, start=1):
            make_run(root / f"kv_{keys}_{values}", f"seed={seed}", keys=keys, values=values, seed=seed, test=t,
                     test_long=t / 2)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Runs the script once on the fabricated sweep; returns (markdown, stdout, out dir, sweep dir)."""
    root = tmp_path_factory.mktemp("runs")
    sweep = root / "multirun" / "2024-01-01"
    fabricate_sweep(sweep)
    out = root / "report"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([str(root / "multirun"), f"out={out}", "name=toy", "title=Toy check",
                      "command=scripts/reproduce/reproduce_toy.sh", "kind=tables"])
    assert rc == 0
    return (out / "toy.md").read_text(), buf.getvalue(), out, sweep


def table_row(md: str, first_cells: str) -> str:
    """The one markdown table row that starts with `first_cells`."""
    rows = [line for line in md.splitlines() if line.startswith(f"| {first_cells} |")]
    assert len(rows) == 1, (first_cells, rows)
    return rows[0]


def section(md: str, heading: str) -> str:
    """Text from a heading line to the next heading of the same or higher level."""
    level = heading.split(" ")[0]
    start = md.index(heading + "\n") if (heading + "\n") in md else md.index(heading)
    rest = md[start + len(heading):]
    nxt = re.search(rf"^#{{1,{len(level)}}} ", rest, flags=re.M)
    return rest[: nxt.start()] if nxt else rest


def claim_verdicts(md: str) -> dict[str, str]:
    verdicts = {}
    verdict = "held|did not hold|not significant|inconclusive|not tested"
    for m in re.finditer(rf"^- \*\*(.+?)\*\* \(.+?\): ({verdict})\. Criterion: (.+?)\. Measured:", md, re.M):
        verdicts[m.group(1)] = m.group(2)
    return verdicts


def test_aggregate_is_mean_sample_std_and_n():
    s = aggregate([80.0, 82.0])
    assert (s.mean, s.n) == (81.0, 2) and s.std == pytest.approx(math.sqrt(2))  # ddof=1: sqrt(((-1)^2+1^2)/1)
    assert str(s) == "81.00 ± 1.41 (2)"
    assert str(aggregate([5.0, None])) == "5.00 ± 0.00 (1)"
    assert aggregate([None]) is None


def test_header_names_sources_seeds_command_and_skipped_run(report):
    md, stdout, _, sweep = report
    assert md.startswith("# Toy check\n")
    assert stdout == md
    assert "Read 20 completed runs from" in md and "multirun`" in md
    assert "seeds found: 1, 2." in md
    assert "The runs were produced by: `scripts/reproduce/reproduce_toy.sh`" in md
    assert 'Skipped 1 run that is not "completed"' in md
    assert f"`{sweep / 'k' / 'k=256,seed=1'}` (status \"interrupted\")" in md
    assert "| 256 |" not in md  # the interrupted k=256 run is in no table


def test_table1_positions_with_paper_numbers(report):
    md = report[0]
    assert "### Table 1 analogue: position representations (Shaw et al. 2018, Table 1)" in md
    header = table_row(md, "positions")
    # sacreBLEU in the relmt columns; the paper's newstest2014 column sits beside test tokenized BLEU
    assert header == ("| positions | valid sacreBLEU | test sacreBLEU | test_long sacreBLEU | test tokenized BLEU | "
                      "paper (base, WMT14 EN-DE newstest2014; a different dataset) |")
    # abs: valid (77, 79), test (78, 80), test_long (20, 24): std sqrt(2) and sqrt(8); tokenized = test + 0.5.
    assert table_row(md, "abs") == ("| abs | 78.00 ± 1.41 (2) | 79.00 ± 1.41 (2) | 22.00 ± 2.83 (2) | "
                                    "79.50 ± 1.41 (2) | 26.5 |")
    assert table_row(md, "rel") == ("| rel | 80.00 ± 0.00 (2) | 81.00 ± 1.41 (2) | 30.50 ± 0.71 (2) | "
                                    "81.50 ± 1.41 (2) | 26.8 |")
    assert table_row(md, "both") == ("| both | 81.00 ± 0.00 (2) | 82.50 ± 0.71 (2) | 31.00 ± 0.00 (2) | "
                                     "83.00 ± 0.71 (2) | – |")
    # The kv-ablated rel runs (flags off) and other k are not in Table 1: rel has n = 2, not more.
    assert "k_default = 16" in md
    notes = section(md, "### Table 1 analogue")
    assert "Beside the paper's column is **test tokenized BLEU**" in notes and f"`{TOK_LABEL}`" in notes
    assert "the test columns score last (the weights after the final update)" in notes
    assert "The paper reports the last checkpoint, no averaging." in notes
    assert "Mixed" not in md and "Not the paper's rule" not in md  # every fabricated run scored last.pt


def test_table2_k_rows_and_paper_numbers(report):
    table = section(report[0], "### Table 2 analogue: clipping distance k (Shaw et al. 2018, Table 2)")
    ks = [int(line.split("|")[1]) for line in table.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert ks == [0, 1, 2, 16, 64]
    # the paper's newstest2013 column sits beside valid tokenized BLEU (valid sacreBLEU + 0.5 here)
    assert table_row(table, "k").endswith("| valid tokenized BLEU | paper (base, WMT14 EN-DE newstest2013; "
                                          "a different dataset and model) |")
    assert table_row(table, "0") == ("| 0 | 10.00 ± 1.41 (2) | 11.00 ± 1.41 (2) | 5.50 ± 0.71 (2) | "
                                     "10.50 ± 1.41 (2) | 12.5 |")
    assert table_row(table, "1").endswith("| 25.5 |")
    assert table_row(table, "2").endswith("| 25.8 |")
    # The k = 16 row is the shared rel run of the positions comparison.
    assert table_row(table, "16") == ("| 16 | 80.00 ± 0.00 (2) | 81.00 ± 1.41 (2) | 30.50 ± 0.71 (2) | "
                                      "80.50 ± 0.00 (2) | 25.8 |")
    assert table_row(table, "64").startswith("| 64 | 79.50 ± 0.71 (2) | 80.50 ± 0.71 (2) |")
    assert table_row(table, "64").endswith("| 80.00 ± 0.71 (2) | 25.9 |")
    assert "paper (base, WMT14 EN-DE newstest2013; a different dataset and model)" in table
    assert "Beside the paper's column is **valid tokenized BLEU**" in table


def test_table3_kv_rows_in_paper_order(report):
    table = section(report[0], "### Table 3 analogue: a^K and a^V (Shaw et al. 2018, Table 3)")
    rows = [line for line in table.splitlines() if re.match(r"^\| (yes|no) \| (yes|no) \|", line)]
    assert [r.split("|")[1:3] for r in rows] == [[" yes ", " yes "], [" yes ", " no "], [" no ", " yes "],
                                                  [" no ", " no "]]
    assert rows[0] == "| yes | yes | 80.00 ± 0.00 (2) | 81.00 ± 1.41 (2) | 30.50 ± 0.71 (2) | 80.50 ± 0.00 (2) | 25.8 |"
    # no validation BLEU at all: "–" in both valid columns
    assert rows[1] == "| yes | no | – | 81.00 ± 0.71 (2) | 40.50 ± 0.35 (2) | – | 25.8 |"
    assert rows[2].endswith("| 76.00 ± 1.41 (2) | 38.00 ± 0.71 (2) | – | 25.3 |")
    assert rows[3].endswith("| 12.5 |")
    # runs never validated for BLEU are not "older runs without tokenized BLEU"
    assert "have no tokenized BLEU" not in table and "Beside the paper's column is **valid tokenized BLEU**" in table


def test_length_table(report):
    table = section(report[0], "### BLEU by source length")
    assert table_row(table, "source words") == "| source words | sentences | abs | rel | both |"
    assert table_row(table, "1-8") == "| 1-8 | 259 | 86.00 ± 1.41 (2) | 88.00 ± 0.00 (2) | 89.00 ± 0.00 (2) |"
    assert table_row(table, "25-32") == "| 25-32 | 248 | 20.00 ± 0.00 (2) | 33.00 ± 0.00 (2) | 34.00 ± 0.00 (2) |"
    assert table_row(table, "33+") == "| 33+ | 0 | – | – | – |"
    assert "test + test_long pooled" in table
    assert "Checkpoints: the test splits score last (the weights after the final update)." in table


def test_claims_held_and_failed_as_designed(report):
    md = report[0]
    claims = section(md, "## Claims")
    assert "These margins are our choice, fixed before the numbers, not the paper's." in claims
    # no references: every claim shows its means and is not tested, whatever the means say
    assert claim_verdicts(claims) == dict.fromkeys((
        "rel ≥ abs", "k = 0 collapses", "k ≥ 2 saturates", "a^K alone is about as good as both",
        "a^V alone is slightly lower than both", "rel beats abs on longer sentences than seen in training",
        "both gives no further gain over rel"), "not tested")
    assert ("Criterion: BLEU(k=16) − BLEU(k=0) on test above 0.5 × BLEU(k=16) (k = 0 below half of it). Measured: "
            "k=0 11.00, k=16 81.00, 0.5 × k=16 40.50.") in claims
    assert "BLEU(k) − BLEU(k=16) on test within ±1 for every k ≥ 2 (k = 2, 16, 64)" in claims
    assert "spread 4.00" in claims
    assert "Measured: both 82.50, rel 81.00, both − rel 1.50." in claims
    assert "rel − abs on test_long above 0 (the 95% interval excludes 0 on rel's side). Measured: rel 30.50, abs " \
           "22.00." in claims


def test_plots_written_and_linked(report):
    md, _, out, _ = report
    for name in ("toy_k.png", "toy_length.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"]({name})" in md


def test_json_has_the_aggregates(report):
    _, _, out, sweep = report
    doc = json.loads((out / "toy.json").read_text())
    assert doc["seeds"] == [1, 2] and len(doc["runs"]) == 20
    assert doc["skipped"] == [{"dir": str(sweep / "k" / "k=256,seed=1"), "reason": 'status "interrupted"'}]
    (group,) = doc["groups"]
    assert (group["data"], group["model"], group["k_default"], group["splits"]) == ("toy", "toy", 16,
                                                                                    ["test", "test_long"])
    rel = next(r for r in group["tables"]["positions"]["rows"] if r["positions"] == "rel")
    assert rel["bleu"]["test"]["mean"] == pytest.approx(81.0)
    assert rel["bleu"]["test"]["std"] == pytest.approx(math.sqrt(2))
    assert rel["bleu"]["test"]["n"] == 2 and rel["paper"] == 26.8 and rel["seeds"] == [1, 2]
    assert rel["bleu"]["tok:test"]["mean"] == pytest.approx(81.5)  # the figure beside the paper's 26.8
    tables = group["tables"]
    assert [tables[t]["beside_paper"]["split"] for t in ("positions", "k", "kv")] == ["test", "valid", "valid"]
    assert tables["positions"]["checkpoints"] == {"valid": "last", "test": {"last": 6}, "paper": "last",
                                                  "beside_paper": ["last"], "used": ["last"], "mixed": False,
                                                  "matches_paper": True}
    assert [r["k"] for r in group["tables"]["k"]["rows"]] == [0, 1, 2, 16, 64]
    kv = group["tables"]["kv"]["rows"][1]
    assert (kv["relative_keys"], kv["relative_values"], kv["bleu"]["valid"]) == (True, False, None)
    held = {c["name"]: c["held"] for c in group["claims"]}
    assert not any(held.values())  # not tested: no references
    spread = next(c for c in group["claims"] if c["name"] == "k ≥ 2 saturates")["measured"]["spread"]
    assert spread == pytest.approx(4.0)


def test_groups_by_data_and_model_with_their_paper_cells(tmp_path, capsys):
    make_run(tmp_path, "ende_abs", positions="abs", data="wmt14_en_de", d_model=512, test=26.0, tok=0.7)
    make_run(tmp_path, "ende_rel", positions="rel", data="wmt14_en_de", d_model=512, test=26.2, tok=0.7)
    make_run(tmp_path, "enfr_big_rel", positions="rel", k=8, data="wmt14_en_fr", d_model=1024, test=40.0,
             checkpoint="averaged")
    make_run(tmp_path, "ende_small_rel", positions="rel", data="wmt_t2t_en_de", d_model=256, test=20.0)
    assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=wmt"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Results\n")
    ende = section(md, "## wmt14_en_de (EN-DE), base model (d_model 512)")
    assert "| test tokenized BLEU | paper (base, WMT14 EN-DE newstest2014) |" in ende
    # the paper's column beside the tokenized BLEU (sacreBLEU + 0.7), not beside sacreBLEU
    assert table_row(ende, "abs") == "| abs | – | 26.00 ± 0.00 (1) | 26.70 ± 0.00 (1) | 26.5 |"
    assert table_row(ende, "rel") == "| rel | – | 26.20 ± 0.00 (1) | 26.90 ± 0.00 (1) | 26.8 |"
    assert "The paper reports the last checkpoint, no averaging." in ende and "Not the paper's rule" not in ende
    enfr = section(md, "## wmt14_en_fr (EN-FR), big model (d_model 1024)")
    assert "k_default = 8" in enfr and table_row(enfr, "rel").endswith("| 40.50 ± 0.00 (1) | 41.5 |")
    assert "tensor2tensor states this convention for EN-DE (its get_ende_bleu.sh) and not for EN-FR" in enfr
    assert "the test columns score averaged" in enfr and "The paper reports the average of the last 20" in enfr
    assert "Not the paper's rule" not in enfr and "EN-FR" not in ende.split("### Table 1")[1]
    small = section(md, "## wmt_t2t_en_de (EN-DE), small model (d_model 256)")
    assert "no small model in the paper" in small and table_row(small, "rel").endswith("| – |")
    assert "Table 2 analogue" not in md and "Table 3 analogue" not in md  # no sweeps, no ablation tables
    # Only rel ≥ abs can be checked, and only for EN-DE base; without references it is not tested.
    assert claim_verdicts(md) == {"rel ≥ abs": "not tested"}


def test_empty_directory_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), f"out={tmp_path / 'out'}", "name=x"]) == 2
    err = capsys.readouterr().err
    assert "no run directories" in err and "metrics.json and config.yaml" in err
    assert not (tmp_path / "out").exists()


def test_cli_exit_code_2_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), f"out={tmp_path / 'o'}", "name=x"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "error: no run directories" in proc.stderr and "Traceback" not in proc.stderr


def test_runs_without_tokenized_bleu_show_a_dash_and_say_so(tmp_path, capsys):
    """An older metrics.json has sacreBLEU only: no crash, "–" beside the paper, and a sentence saying why."""
    make_run(tmp_path / "old", "abs", positions="abs", data="wmt14_en_de", d_model=512, test=26.0, tok=None)
    make_run(tmp_path / "old", "rel", positions="rel", data="wmt14_en_de", d_model=512, test=26.2, tok=None)
    assert main([str(tmp_path / "old"), f"out={tmp_path / 'out'}", "name=old"]) == 0
    md = capsys.readouterr().out
    assert table_row(md, "abs") == "| abs | – | 26.00 ± 0.00 (1) | – | 26.5 |"
    assert "No run here has tokenized BLEU (a metrics.json from before relmt stored it)" in md

    make_run(tmp_path / "mixed", "abs_old", positions="abs", data="wmt14_en_de", d_model=512, seed=1, test=26.0,
             tok=None)
    make_run(tmp_path / "mixed", "abs_new", positions="abs", data="wmt14_en_de", d_model=512, seed=2, test=25.0,
             tok=1.0)
    assert main([str(tmp_path / "mixed"), f"out={tmp_path / 'out'}", "name=mixed"]) == 0
    md = capsys.readouterr().out
    assert table_row(md, "abs") == "| abs | – | 25.50 ± 0.71 (2) | 26.00 ± 0.00 (1) | 26.5 |"
    assert "1 of the 2 runs scored on test have no tokenized BLEU (an older metrics.json)" in md


def test_checkpoint_rule_is_read_per_run_and_mixed_rules_are_flagged(tmp_path, capsys):
    # the scored file's name wins (the loop falls back to last.pt when best.pt is missing), then
    # metrics.json's test_checkpoint_rule, then config.yaml's train.test_checkpoint
    make_run(tmp_path, "abs", positions="abs", data="wmt14_en_de", d_model=512, test=26.0, rule="best",
             checkpoint=None)
    make_run(tmp_path, "rel", positions="rel", data="wmt14_en_de", d_model=512, test=26.2, checkpoint="last",
             rule="best", cfg_rule="best")
    make_run(tmp_path, "both", positions="both", data="wmt14_en_de", d_model=512, test=26.4, checkpoint=None,
             cfg_rule="averaged")
    make_run(tmp_path, "none", positions="none", data="wmt14_en_de", d_model=512, test=10.0, checkpoint=None)
    assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=rules"]) == 0
    md = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "rules.json").read_text())
    assert {Path(r["path"]).name: r["test_rule"] for r in doc["runs"]} == {
        "abs": "best", "rel": "last", "both": "averaged", "none": "unknown"}
    table1 = section(md, "### Table 1 analogue")
    assert ("the test columns score averaged in 1 run, best in 1 run, last in 1 run, unknown in 1 run."
            in table1)
    assert "**Mixed checkpoint rules**: this table's columns come from averaged, best, last, unknown." in table1
    assert "**Not the paper's rule**: the column beside the paper scores averaged and best and last and unknown, " \
           "the paper last." in table1
    checkpoints = doc["groups"][0]["tables"]["positions"]["checkpoints"]
    assert checkpoints["mixed"] and not checkpoints["matches_paper"] and checkpoints["paper"] == "last"


def test_ablation_tables_use_the_papers_rule_and_say_so(tmp_path, capsys):
    """Tables 2 and 3 compare valid BLEU (the last checkpoint, the base model's rule in the paper); a run
    whose test splits scored best.pt makes Table 1 differ from the paper and each table mix rules."""
    for k in (2, 16):
        make_run(tmp_path, f"k{k}", k=k, data="wmt14_en_de", d_model=512, valid=25.0 + k / 100, test=26.0,
                 checkpoint="best")
    make_run(tmp_path, "keys_only", values=False, data="wmt14_en_de", d_model=512, valid=25.1, test=26.1,
             checkpoint="best")
    assert main([str(tmp_path), f"out={tmp_path / 'out'}", "name=abl"]) == 0
    md = capsys.readouterr().out
    for heading in ("### Table 2 analogue", "### Table 3 analogue"):
        table = section(md, heading)
        assert "Beside the paper's column is **valid tokenized BLEU**" in table
        assert "the valid columns score the last checkpoint (validation after the final update)" in table
        assert "The paper reports the last checkpoint, no averaging." in table
        assert "Not the paper's rule" not in table
        assert "**Mixed checkpoint rules**: this table's columns come from best, last." in table
    assert table_row(section(md, "### Table 2 analogue"), "16") == (
        "| 16 | 25.16 ± 0.00 (1) | 26.00 ± 0.00 (1) | 25.66 ± 0.00 (1) | 25.8 |")
    table1 = section(md, "### Table 1 analogue")
    assert "**Not the paper's rule**: the column beside the paper scores best, the paper last." in table1
