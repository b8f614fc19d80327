"""relmt-report --name length: BLEU by source-length bucket for abs, rel and both, with the buckets
longer than any training source marked, a paired test on those sentences, the claim and the plot."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from sacrebleu.metrics import BLEU

from relmt.cli.report import main, parse_cutoffs
from relmt.report.runs import ReportError
from relmt.report.tables import seen_in_training
from tests.report_runs import fabricate_length, hypotheses, write_refs


def run_report(args: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return buf.getvalue()


def row(md: str, first: str) -> str:
    rows = [line for line in md.splitlines() if line.startswith(f"| {first} |")]
    assert len(rows) == 1, (first, rows)
    return rows[0]


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("refs")
    return folder, write_refs(folder, ("test",))


@pytest.mark.parametrize("label,max_words,seen", [
    ("1-10", 15, "yes"), ("11-20", 15, "partly"), ("11-20", 20, "yes"), ("16-20", 15, "no"), ("21-30", 15, "no"),
    ("61+", 60, "no"), ("61+", 100, "partly"), ("1-10", None, None)])
def test_seen_in_training(label, max_words, seen):
    assert seen_in_training(label, max_words) == seen


def test_cutoff_arguments():
    assert parse_cutoffs(["15", "europarl=80"]) == {None: 15, "europarl": 80}
    for bad in ("0", "x", "europarl=", "a=-3"):
        with pytest.raises(ReportError, match="train_max_words="):
            parse_cutoffs([bad])


def test_length_report_marks_unseen_buckets_tests_them_and_plots(tmp_path, refs):
    folder, texts = refs
    fabricate_length(tmp_path / "runs", texts)
    out = tmp_path / "out"
    md = run_report([str(tmp_path / "runs"), f"out={out}", "name=length", f"refs={folder}",
                     "train_max_words=multi30k_len15=15", "train_max_words=europarl=80"])
    assert md.startswith("# Length generalisation\n") and md == (out / "length.md").read_text()
    assert ("## multi30k_len15, mmt_tiny model (trained on sources of at most 15 words: "
            "train_max_words=multi30k_len15=15)") in md
    assert row(md, "source words") == "| source words | sentences | seen in training | abs | rel | both | rel − abs |"
    # bucket BLEU = design + seed over seeds 1 and 2
    assert row(md, "1-10") == "| 1-10 | 10 | yes | 61.50 ± 0.71 (2) | 62.50 ± 0.71 (2) | 62.50 ± 0.71 (2) | +1.00 |"
    assert row(md, "11-20").startswith("| 11-20 | 10 | partly |")
    assert row(md, "21-30") == ("| 21-30 | 10 | **no** | 21.50 ± 0.71 (2) | 31.50 ± 0.71 (2) | 30.50 ± 0.71 (2) | "
                                "+10.00 |")
    assert "\n\nSignatures: sacreBLEU `nrefs:1|case:mixed|tok:13a`.\n\n" in md  # the runs' metrics.json
    # sources have as many words as the reference without its final "."
    longer = [i for i, r in enumerate(texts["test"]) if len(r.split()) - 1 > 15]
    assert f"Paired tests on the {len(longer)} test sentences longer than training" in md
    abs1 = hypotheses("test", "abs", 1, texts["test"])
    abs1_bleu = BLEU().corpus_score([abs1[i] for i in longer], [[texts["test"][i] for i in longer]]).score
    expected = f"| rel vs abs | 1 | {abs1_bleu:.2f} | 100.00 | {100 - abs1_bleu:+.2f} | [+"
    assert row(md, "rel vs abs | 1").startswith(expected) and row(md, "rel vs abs | 1").endswith("] | 0.000 |")
    assert row(md, "rel vs abs | all (2 + 2)").endswith("] | 0.000 |")  # the test over all seeds, which decides
    assert "- **rel ≥ abs on sentences longer than any in training** (BLEU by length, multi30k_len15, mmt_tiny " \
           "model): held." in md
    assert "rel − abs over all seeds (2 + 2) +" in md and f"seed 1 {100 - abs1_bleu:+.2f} [+" in md
    doc = json.loads((out / "length.json").read_text())
    (item,) = doc["length"]
    assert (item["train_max_words"], item["claims"][0]["verdict"]) == (15, "held")
    assert [r["seen_in_training"] for r in item["table"]["rows"]] == ["yes", "partly", "no", "no"]
    png = (out / "length_buckets.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000 and "](length_buckets.png)" in md


def test_cutoff_from_the_config_wins_and_without_refs_nothing_is_tested(tmp_path, refs):
    folder, texts = refs
    fabricate_length(tmp_path / "runs", texts, data="toy", source="toy", toy={"max_words": 20})
    md = run_report([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=length",
                     "train_max_words=15"])
    assert "(trained on sources of at most 20 words: the runs' config)" in md
    assert row(md, "11-20").startswith("| 11-20 | 10 | yes |")
    assert "No paired test: the report was built without `refs=DIR`, the folder of the reference files" in md
    assert "): not tested. Criterion: rel − abs above 0 on the sentences longer than training (> 20 words) pooled; " \
           "the means are over the 1 bucket there, weighted by their sentences. Measured: mean rel − abs 10.00, mean " \
           "rel − abs in % of abs 46.51, rel − abs on lengths seen in training 1.50." in md


def test_not_significant_when_rel_leads_by_one_sentence(tmp_path, refs):
    """rel ahead on the bucket means, but on the pooled long sentences abs differs from rel in at most one
    sentence: the paired test finds no significant difference."""
    folder, texts = refs
    fabricate_length(tmp_path / "runs", texts, train_max_src_words=15)
    for seed in (1, 2):  # abs: the references with one long sentence corrupted, like both
        run = tmp_path / "runs" / f"abs_s{seed}"
        both = (tmp_path / "runs" / f"both_s{seed}" / "translations" / "test.de").read_text()
        (run / "translations" / "test.de").write_text(both)
    md = run_report([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=length",
                     f"refs={folder}", "bootstrap_samples=300"])
    assert "(trained on sources of at most 15 words: the runs' config)" in md
    doc = json.loads((tmp_path / "out" / "length.json").read_text())
    assert doc["length"][0]["claims"][0]["verdict"] == "not significant"


def test_unknown_cutoff_marks_nothing_and_checks_no_claim(tmp_path, refs):
    fabricate_length(tmp_path / "runs", refs[1], data="europarl")
    md = run_report([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=length",
                     "train_max_words=multi30k_len15=15"])
    assert "unknown: the config does not record it and no train_max_words= was given" in md
    assert "seen in training |" not in md and "- No claim could be checked" in md


def test_kind_follows_the_name_unless_given(tmp_path, refs):
    fabricate_length(tmp_path / "runs", refs[1])
    run_report([str(tmp_path / "runs"), f"out={tmp_path / 'a'}", "name=length", "kind=tables"])
    assert (tmp_path / "a" / "length_length.png").is_file() and not (tmp_path / "a" / "length_buckets.png").exists()
    run_report([str(tmp_path / "runs"), f"out={tmp_path / 'b'}", "name=long", "kind=length",
                "train_max_words=15"])
    assert (tmp_path / "b" / "long_buckets.png").is_file()


def test_bad_cutoff_is_exit_2(tmp_path, refs, capsys):
    fabricate_length(tmp_path / "runs", refs[1])
    assert main([str(tmp_path / "runs"), f"out={tmp_path / 'o'}", "name=length",
                 "train_max_words=many"]) == 2
    assert "relmt-report: error: train_max_words=many" in capsys.readouterr().err


def test_refs_per_data_set(tmp_path, refs):
    """The queue's layout: filtered Multi30k and Europarl runs in one report, each with its own references."""
    folder, texts = refs
    fabricate_length(tmp_path / "runs" / "m30k", texts, data="multi30k_text", train_max_src_words=14)
    fabricate_length(tmp_path / "runs" / "ep", texts, data="europarl20k_split", train_max_src_words=30)
    md = run_report([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=length",
                     f"refs=multi30k_text={folder}", "bootstrap_samples=100"])
    m30k = md[md.index("## multi30k_text"):md.index("## Claim")]
    europarl = md[md.index("## europarl20k_split"):md.index("## multi30k_text")]
    assert "(trained on sources of at most 14 words: the runs' config)" in m30k and "Paired tests on the" in m30k
    assert ("No paired test: no `refs=` folder for data set europarl20k_split (give `refs="
            "europarl20k_split=DIR` or a plain `refs=DIR`).") in europarl
    assert main([str(tmp_path / "runs"), f"out={tmp_path / 'o'}", "name=length",
                 f"refs=multi30k_text={tmp_path / 'nowhere'}"]) == 2


def test_the_unseen_buckets_count_by_their_sentences():
    """A bucket of 2 sentences where rel is far behind does not outweigh one of 100 where it is ahead:
    (100·10 + 2·(−50)) / 102 = 8.82 BLEU, and 900 / (100·20 + 2·50) = 42.86% of abs."""
    from types import SimpleNamespace

    from relmt.report.aggregate import Stat
    from relmt.report.length import LengthGroup, unseen_claim

    def row(bucket, n, seen, rel, abs_):
        return {"bucket": bucket, "sentences": [n], "seen_in_training": seen,
                "bleu": {"rel": Stat(rel, 0.0, 1), "abs": Stat(abs_, 0.0, 1)}}

    table = {"rows": [row("1-10", 500, "yes", 0.0, 90.0), row("11-20", 100, "no", 30.0, 20.0),
                      row("21+", 2, "no", 0.0, 50.0)]}
    claim = unseen_claim(LengthGroup(SimpleNamespace(data="d", model="m"), 10, "test", table))
    assert claim.verdict == "not tested"  # no paired test: the means decide nothing
    assert claim.measured["mean rel − abs"] == pytest.approx(900 / 102)
    assert claim.measured["mean rel − abs in % of abs"] == pytest.approx(100 * 900 / 2100)
    assert claim.measured["rel − abs on lengths seen in training"] == pytest.approx(-90.0)


def test_single_k_gets_no_k_plot_and_a_stale_one_is_removed(tmp_path, refs):
    fabricate_length(tmp_path / "runs", refs[1])
    out = tmp_path / "out"
    out.mkdir()
    (out / "single_k.png").write_bytes(b"\x89PNG left from an earlier report")
    md = run_report([str(tmp_path / "runs"), f"out={out}", "name=single", "kind=tables"])
    assert not (out / "single_k.png").exists() and (out / "single_length.png").is_file()
    assert "No plot of BLEU against k: these runs hold a single k." in md and "](single_k.png)" not in md


def test_each_later_method_is_judged_against_abs_and_rel_on_the_unseen_lengths(tmp_path, refs):
    """Issue 31: rope, alibi and t5 each get a verdict against abs and against rel on the sentences longer than
    training. Here rope translates as rel does: ahead of abs there (held), level with rel (not significant)."""
    import shutil

    import yaml

    folder, texts = refs
    fabricate_length(tmp_path / "runs", texts, train_max_src_words=15)
    for seed in (1, 2):
        rope = tmp_path / "runs" / f"rope_s{seed}"
        shutil.copytree(tmp_path / "runs" / f"rel_s{seed}", rope)
        cfg = yaml.safe_load((rope / "config.yaml").read_text())
        cfg["model"]["positions"] = "rope"
        (rope / "config.yaml").write_text(yaml.safe_dump(cfg))
    md = run_report([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=length",
                     f"refs={folder}", "bootstrap_samples=300"])
    header = "| source words | sentences | seen in training | abs | rel | both | rope |"
    assert row(md, "source words").startswith(header)
    doc = json.loads((tmp_path / "out" / "length.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in doc["length"][0]["claims"]}
    assert verdicts == {"rel ≥ abs on sentences longer than any in training": "held",
                        "rope ≥ abs on sentences longer than any in training": "held",
                        "rope ≥ rel on sentences longer than any in training": "not significant"}
    assert "- **rope ≥ rel on sentences longer than any in training** (BLEU by length, multi30k_len15, mmt_tiny " \
           "model): not significant. Criterion: rope − rel above 0 on the sentences longer than training (> 15 " \
           "words) pooled (held), below 0 (did not hold), each by its 95% interval;" in md
