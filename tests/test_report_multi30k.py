"""relmt-report on fabricated Multi30k-like runs: per-test-set tables in three metrics, the paired
bootstrap seed by seed, learning curves, and the verdicts held / did not hold / not significant."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import pytest
from sacrebleu.metrics import BLEU

from relmt.cli.report import main
from tests.report_runs import SPLITS, fabricate_multi30k, hypotheses, write_refs


def run_report(args: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return buf.getvalue()


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    """The report with refs=; returns (markdown, JSON, out dir, runs dir, refs by split)."""
    root = tmp_path_factory.mktemp("m30k")
    refs = write_refs(root / "refs")
    fabricate_multi30k(root / "runs", refs)
    out = root / "out"
    md = run_report([str(root / "runs"), f"out={out}", "name=multi30k", f"refs={root / 'refs'}",
                     "title=Multi30k EN-DE (CPU)", "command=scripts/multi30k.sh"])
    assert md == (out / "multi30k.md").read_text()
    return md, json.loads((out / "multi30k.json").read_text()), out, root / "runs", refs


def section(md: str, heading: str) -> str:
    """From `heading` to the next heading of the same or a higher level."""
    level = len(heading.split(" ")[0])
    rest = md[md.index(heading) + len(heading):]
    nxt = re.search(rf"^#{{1,{level}}} ", rest, flags=re.M)
    return rest[: nxt.start()] if nxt else rest


def block(text: str, label: str) -> str:
    """The metric block that starts with the bold `label` up to the next bold label or heading."""
    rest = text[text.index(f"**{label}"):]
    nxt = re.search(r"^(\*\*|#)", rest[2:], flags=re.M)
    return rest[: nxt.start() + 2] if nxt else rest


def row(text: str, first_cells: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"| {first_cells} |")]
    assert len(rows) == 1, (first_cells, rows)
    return rows[0]


def bleu(hyps: list[str], refs: list[str]) -> float:
    return BLEU().corpus_score(hyps, [refs]).score


def test_header_names_command_host_and_the_preset(multi30k):
    md = multi30k[0]
    assert md.startswith("# Multi30k EN-DE (CPU)\n")
    assert "Read 16 completed runs from" in md and "seeds found: 1, 2, 3." in md
    assert "The runs were produced by: `scripts/multi30k.sh`" in md
    assert re.search(r"This report: \d{4}-\d\d-\d\d \d\d:\d\d UTC, on .+ \(\d+ cores\), torch ", md)
    assert "## multi30k_text, mmt_tiny model (d_model 128)" in md  # model.name, not the d_model guess ("toy")
    assert "guessed from d_model" not in md
    assert ("Wall time per run: 120 min (training and validation; test decoding not included; "
            "threads 1).") in md


def test_table1_has_three_labelled_metrics_per_test_set_and_no_paper_column(multi30k):
    md, _, _, _, refs = multi30k
    table = section(md, "### Table 1 analogue")
    assert "paper (" not in table  # no column of WMT numbers beside Multi30k ones
    assert "rel − abs = +0.3 BLEU (base) and +1.3 (big) on WMT14 EN-DE newstest2014" in table
    sacre = block(table, "sacreBLEU (detokenized, tokenizer 13a, cased)")
    assert row(sacre, "positions") == ("| positions | valid sacreBLEU | test sacreBLEU | test_2017_flickr sacreBLEU | "
                                       "test_2017_mscoco sacreBLEU |")
    # rel equals the references on test, abs on mscoco; valid = 32 + seed for rel, 30 + seed for abs
    assert row(sacre, "rel").startswith("| rel | 34.00 ± 1.00 (3) | 100.00 ± 0.00 (3) |")
    assert row(sacre, "abs").endswith("| 100.00 ± 0.00 (3) |")
    abs_test = [bleu(hypotheses("test", "abs", s, refs["test"]), refs["test"]) for s in (1, 2, 3)]
    assert f"| abs | 32.00 ± 1.00 (3) | {sum(abs_test) / 3:.2f} ± " in sacre
    chrf = block(table, "chrF")
    assert row(chrf, "both") == ("| both | 52.00 ± 1.00 (3) | 100.00 ± 0.00 (3) | 100.00 ± 0.00 (3) | "
                                 "100.00 ± 0.00 (3) |")
    lc = block(table, "lowercased tokenized BLEU")
    assert "the metric most Multi30k papers print; not sacreBLEU" in lc
    assert row(lc, "positions").startswith("| positions | valid lc-tok BLEU | test lc-tok BLEU |")
    assert "`lowercased tokenized BLEU: Moses (de) + lowercased, tokenize=none (not sacreBLEU)`" in table


def test_table2_k_rows_and_table3_borrows_k0_for_no_no(multi30k):
    md = multi30k[0]
    t2 = section(md, "### Table 2 analogue")
    sacre = block(t2, "sacreBLEU")
    assert [int(line.split("|")[1]) for line in sacre.splitlines() if re.match(r"^\| \d+ \|", line)] == [
        0, 1, 2, 4, 16, 64]
    assert row(sacre, "0") == "| 0 | 5.00 ± 0.00 (1) | 10.00 ± 0.00 (1) | 10.00 ± 0.00 (1) | 10.00 ± 0.00 (1) |"
    assert row(sacre, "16").startswith("| 16 | 34.00 ± 1.00 (3) | 100.00 ± 0.00 (3) |")  # Table 1's rel runs
    # the k sweep has sacreBLEU only: the other blocks keep the k = 16 row and say why the rest are missing
    assert "(5 rows left out: their runs lack chrF)" in t2 and row(block(t2, "chrF"), "16")
    t3 = section(md, "### Table 3 analogue")
    rows = [line for line in block(t3, "sacreBLEU").splitlines() if re.match(r"^\| (yes|no) \| (yes|no) \|", line)]
    assert [r.split("|")[1:3] for r in rows] == [[" yes ", " yes "], [" yes ", " no "], [" no ", " yes "],
                                                  [" no ", " no "]]
    assert rows[3] == "| no | no | 5.00 ± 0.00 (1) | 10.00 ± 0.00 (1) | 10.00 ± 0.00 (1) | 10.00 ± 0.00 (1) |"
    assert "The (no, no) row is the k = 0 runs of Table 2" in t3


def test_significance_seed_by_seed_with_counts(multi30k):
    md, _, _, _, refs = multi30k
    sig = section(md, "### Significance: all seeds at once, and seed by seed")
    detail, summary = sig.split("| comparison | test set | seed pairs |")
    assert len(re.findall(r"^\| (rel vs abs|both vs rel) \| ", detail, flags=re.M)) == 2 * 3 * (1 + 3)
    # two comparisons, three test sets, the test over all seeds and three seed pairs
    assert row(detail, "rel vs abs | test | all (3 + 3)").startswith("| rel vs abs | test | all (3 + 3) | ")
    assert row(detail, "both vs rel | test | all (3 + 3)") == (
        "| both vs rel | test | all (3 + 3) | 100.00 | 100.00 | +0.00 | [+0.00, +0.00] | 1.000 |")
    # seed 2 on test: rel equals the references, abs does not
    abs2 = bleu(hypotheses("test", "abs", 2, refs["test"]), refs["test"])
    assert row(detail, "rel vs abs | test | 2").startswith(
        f"| rel vs abs | test | 2 | {abs2:.2f} | 100.00 | {100 - abs2:+.2f} | [+")
    assert row(detail, "rel vs abs | test | 2").endswith("] | 0.000 |")
    # identical systems: no difference, an interval of [0, 0], p = 1
    assert row(detail, "both vs rel | test | 1") == (
        "| both vs rel | test | 1 | 100.00 | 100.00 | +0.00 | [+0.00, +0.00] | 1.000 |")
    # seed pairs, significant, of which the system is ahead, behind
    assert row(summary, "rel vs abs | test") == "| rel vs abs | test | 3 | 3 | 3 | 0 |"
    assert row(summary, "rel vs abs | test_2017_flickr") == "| rel vs abs | test_2017_flickr | 3 | 0 | 0 | 0 |"
    assert row(summary, "rel vs abs | test_2017_mscoco") == "| rel vs abs | test_2017_mscoco | 3 | 3 | 0 | 3 |"
    assert row(summary, "both vs rel | test_2017_mscoco") == "| both vs rel | test_2017_mscoco | 3 | 3 | 3 | 0 |"
    # the ablations' claims are tested too, against the rel runs of the same seed
    assert row(summary, "k=16 vs k=0 | test") == "| k=16 vs k=0 | test | 1 | 1 | 1 | 0 |"
    assert row(detail, "k=2 vs k=16 | test | 1") == (
        "| k=2 vs k=16 | test | 1 | 100.00 | 100.00 | +0.00 | [+0.00, +0.00] | 1.000 |")
    assert "1000 resamples" in sig and "rel vs abs on" not in sig
    assert "k=16 vs k=0 on test: seeds 2, 3: k=16 only" in sig


def test_claim_verdicts_reach_every_verdict(multi30k):
    md, doc, _, _, _ = multi30k
    verdicts = {(c["name"], c["split"]): c["verdict"] for c in doc["groups"][0]["claims"]}
    assert {s: verdicts[("rel ≥ abs", s)] for s in SPLITS} == {
        "test": "held", "test_2017_flickr": "not significant", "test_2017_mscoco": "did not hold"}
    assert {s: verdicts[("both gives no further gain over rel", s)] for s in SPLITS} == {
        "test": "held", "test_2017_flickr": "inconclusive", "test_2017_mscoco": "did not hold"}
    # the ablations have translations of test only: held or did not hold there, not tested elsewhere
    assert {name: verdicts[(name, "test")] for name in (
        "k = 0 collapses", "k ≥ 2 saturates", "a^K alone is about as good as both",
        "a^V alone is slightly lower than both")} == {
        "k = 0 collapses": "held", "k ≥ 2 saturates": "held", "a^K alone is about as good as both": "held",
        "a^V alone is slightly lower than both": "did not hold"}  # a^V alone is far lower, not slightly
    assert verdicts[("k ≥ 2 saturates", "test_2017_flickr")] == "not tested"
    claims = section(md, "## Claims")
    assert ("- **rel ≥ abs** (Table 1): not significant. Criterion: rel − abs on test_2017_flickr above 0 (the 95% "
            "interval excludes 0 on rel's side).") in claims
    assert ("Tests: rel − abs over all seeds (3 + 3) +1.90 [-4.07, +7.47] p = 0.510, per seed pair (decides nothing; "
            "0 of 3 significant): seed 1 +0.55 [+") in claims
    assert "within a margin of ±1 BLEU" in claims and "**not tested**: no run could be tested" in claims
    assert ("Criterion: BLEU(a^K yes, a^V yes) − BLEU(a^K no, a^V yes) on test above 0 and below 2.") in claims
    # the paper's finding is stated once per claim, as a difference, not as a number to compare with
    assert claims.count("Paper: rel − abs = +0.3 BLEU (base) and +1.3 (big)") == 1


def test_swapping_the_systems_turns_held_into_did_not_hold(multi30k, tmp_path):
    """abs and rel trade runs: "rel ≥ abs" held becomes did not hold and back; not significant stays, where
    rel is now behind on the means (which once gave "did not hold")."""
    _, _, _, runs, refs = multi30k
    swapped = tmp_path / "runs"
    shutil.copytree(runs / "positions", swapped)
    for run in swapped.iterdir():
        text = (run / "config.yaml").read_text()
        for a, b in (("positions: abs", "positions: XX"), ("positions: rel", "positions: abs"),
                     ("positions: XX", "positions: rel")):
            text = text.replace(a, b)
        (run / "config.yaml").write_text(text)
    run_report([str(swapped), f"out={tmp_path / 'out'}", "name=m", f"refs={runs.parent / 'refs'}"])
    doc = json.loads((tmp_path / "out" / "m.json").read_text())
    claims = {c["split"]: c for c in doc["groups"][0]["claims"] if c["name"] == "rel ≥ abs"}
    assert {s: c["verdict"] for s, c in claims.items()} == {
        "test": "did not hold", "test_2017_flickr": "not significant", "test_2017_mscoco": "held"}
    assert claims["test_2017_flickr"]["measured"]["rel"] < claims["test_2017_flickr"]["measured"]["abs"]


def test_learning_curve_table_and_length_table(multi30k):
    md = multi30k[0]
    curves = section(md, "### Learning curves")
    # valid BLEU = step / 100 + offset + seed over seeds 1-3: abs +2, rel +4, both +5 on average
    assert row(curves, "update") == "| update | abs | rel | both |"
    assert row(curves, "500") == "| 500 | 7.00 ± 1.00 (3) | 9.00 ± 1.00 (3) | 10.00 ± 1.00 (3) |"
    assert row(curves, "3000") == "| 3000 | 32.00 ± 1.00 (3) | 34.00 ± 1.00 (3) | 35.00 ± 1.00 (3) |"
    assert "Highest mean: abs 32.00 at update 3000; rel 34.00 at update 3000; both 35.00 at update 3000." in curves
    length = section(md, "### BLEU by source length")
    assert row(length, "21-30") == "| 21-30 | 40 | 32.00 ± 1.00 (3) | 42.00 ± 1.00 (3) | 41.00 ± 1.00 (3) |"


def test_pngs_written_and_linked(multi30k):
    md, _, out, _, _ = multi30k
    for name in ("multi30k_k.png", "multi30k_length.png", "multi30k_curves.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"]({name})" in md


def test_without_refs_every_claim_is_not_tested(multi30k, tmp_path):
    runs = multi30k[3]
    md = run_report([str(runs), f"out={tmp_path}", "name=m", "kind=tables"])
    assert "Not tested: the report was built without `refs=DIR`" in md
    doc = json.loads((tmp_path / "m.json").read_text())
    verdicts = {(c["name"], c["split"]): c["verdict"] for c in doc["groups"][0]["claims"]}
    assert set(verdicts.values()) == {"not tested"}  # the means alone decide nothing


def test_missing_translations_and_unpaired_seeds_are_listed(multi30k, tmp_path):
    _, _, _, runs, _ = multi30k
    copy = tmp_path / "runs"
    shutil.copytree(runs / "positions", copy)
    (copy / "abs_s2" / "translations" / "test.de").unlink()
    shutil.rmtree(copy / "rel_s3")
    md = run_report([str(copy), f"out={tmp_path / 'out'}", "name=m", f"refs={runs.parent / 'refs'}",
                     "bootstrap_samples=200"])
    sig = section(md, "### Significance")
    assert f"rel vs abs on test: seed 2: no translations {copy / 'abs_s2' / 'translations' / 'test.de'}" in sig
    assert "rel vs abs on test: seed 3: abs only" in sig and "both vs rel on test: seed 3: both only" in sig
    assert row(sig.split("| seed pairs |")[1], "rel vs abs | test") == "| rel vs abs | test | 1 | 1 | 1 | 0 |"
    assert "200 resamples" in sig


def test_bleu_with_and_without_a_repeated_source_word(multi30k):
    """The fabricated sources ("word word ... .") all repeat a word; on test, rel equals the references."""
    from relmt.report.repeats import has_repeat

    assert has_repeat("the dog saw The cat") and not has_repeat("a dog saw the cat")
    md = multi30k[0]
    text = section(md, "### BLEU with and without a repeated source word")
    table = text[text.index("test:"):text.index("test_2017_flickr:")]
    assert "| configuration | repeated word (40 sentences) | no repeated word (0 sentences) |" in table
    assert re.search(r"^\| rel \| 100\.00 ± 0\.00 \(3\) \| – \|$", table, flags=re.M), table
    assert re.search(r"^\| abs \| \d\.\d\d ± \d\.\d\d \(3\) \| – \|$", table, flags=re.M), table
