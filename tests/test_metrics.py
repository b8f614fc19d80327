"""Pure metrics (relmt/evaluate/metrics.py) and relmt-score: sacreBLEU, chrF, paper-comparable
tokenized BLEU, the by-length report and the paired bootstrap test."""

from __future__ import annotations

import json
import logging
import random

import pytest
from sacrebleu.metrics import BLEU, CHRF

from relmt.cli.common import USAGE, guarded
from relmt.cli.score import _score
from relmt.errors import UserError
from relmt.evaluate.metrics import (
    bucketed_bleu,
    lowercased_bleu,
    moses_lang,
    paired_bootstrap,
    score,
    split_compounds,
    tokenized_bleu,
)


def test_sacrebleu_value_by_hand():
    # unigram 5/6, bigram 3/5, trigram 2/4, 4-gram 1/3, equal lengths: BLEU = (1/12)^(1/4)
    result = score(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert result["sacrebleu"]["score"] == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-3)
    assert "tok:13a" in result["sacrebleu"]["signature"]
    assert result["chrf"]["score"] > 0 and "nc:6|nw:0" in result["chrf"]["signature"]
    assert score(["a b c d e"], ["a b c d e"])["sacrebleu"]["score"] == pytest.approx(100.0)


@pytest.mark.parametrize("text,expected", [
    ("die Auto-Industrie", "die Auto ##AT##-##AT## Industrie"),
    ("a-b-c", "a ##AT##-##AT## b-c"),  # left to right, no overlaps: as perl's s{(\S)-(\S)}{...}g
    ("- frei -", "- frei -"),
    ("E-Mail und U-Bahn", "E ##AT##-##AT## Mail und U ##AT##-##AT## Bahn"),
])
def test_compound_splitting(text, expected):
    assert split_compounds(text) == expected


def test_tokenized_bleu_is_labelled_and_splits_compounds():
    hyp, ref = ["Die Auto-Industrie wächst."], ["Die Auto-Branche wächst."]
    tok = tokenized_bleu(hyp, ref, "de")
    assert "not sacreBLEU" in tok["label"] and "tok:none" in tok["signature"]
    # Moses splits the final period; compound splitting makes "Auto" and "-" count as matches
    expected = BLEU(tokenize="none").corpus_score(
        ["Die Auto ##AT##-##AT## Industrie wächst ."], [["Die Auto ##AT##-##AT## Branche wächst ."]]).score
    assert tok["score"] == pytest.approx(expected)
    assert tok["score"] > BLEU(tokenize="none").corpus_score(["Die Auto-Industrie wächst ."],
                                                             [["Die Auto-Branche wächst ."]]).score


def test_tokenized_bleu_bootstrap_interval_is_sacrebleus_and_holds_the_score():
    hyps = [f"Ein Mann {i} geht {'heute' if i % 3 else 'morgen'} nach Hause." for i in range(60)]
    refs = [f"Ein Mann {i} geht heute nach Hause." for i in range(60)]
    plain = tokenized_bleu(hyps, refs, "de", compound_split=False, lowercase=True)
    boot = tokenized_bleu(hyps, refs, "de", compound_split=False, lowercase=True, n_bootstrap=200)
    assert "ci" not in plain and boot["score"] == plain["score"]
    assert 0 < boot["ci"] < plain["score"]
    assert boot["mean"] - boot["ci"] <= plain["score"] <= boot["mean"] + boot["ci"]
    expected = BLEU(tokenize="none", force=True).corpus_score(
        [h.lower().replace(".", " .") for h in hyps], [[r.lower().replace(".", " .") for r in refs]], n_bootstrap=200)
    assert boot["ci"] == pytest.approx(expected._ci) and boot["mean"] == pytest.approx(expected._mean)


def test_lowercased_bleu_lowercases_moses_tokens_without_splitting_compounds():
    """The Multi30k literature's metric: case differences do not count, hyphens stay inside words."""
    hyp, ref = ["die Auto-Industrie WÄCHST."], ["Die Auto-Branche wächst."]
    lc = lowercased_bleu(hyp, ref, "de")
    expected = BLEU(tokenize="none").corpus_score(["die auto-industrie wächst ."],
                                                  [["die auto-branche wächst ."]]).score
    assert lc["score"] == pytest.approx(expected)
    assert lc["label"].startswith("lowercased tokenized BLEU") and "compound" not in lc["label"]
    assert lc["score"] > tokenized_bleu(hyp, ref, "de", compound_split=False)["score"]


def test_tokenized_bleu_raises_no_detokenize_warning(caplog):
    """Moses output ends in " ." by design; sacreBLEU must not warn that the data looks tokenized."""
    lines = [f"Satz {i} ist gut." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        assert tokenized_bleu(lines, lines, "de")["score"] == pytest.approx(100.0)
    assert not [r for r in caplog.records if r.name == "sacrebleu"]


def test_bucketed_report():
    srcs = ["w " * 3, "w " * 12, "w " * 15, "w " * 65, ""]
    refs = ["a b c d", "e f g h", "i j k l", "m n o p", "q"]
    hyps = ["a b c d", "e f x h", "i j k l", "zz", "q"]
    rows = bucketed_bleu(hyps, refs, srcs)
    assert [r["bucket"] for r in rows] == ["1-10", "11-20", "21-30", "31-40", "41-60", "61+"]
    assert [r["sentences"] for r in rows] == [2, 2, 0, 0, 0, 1]
    expected = BLEU().corpus_score([hyps[1], hyps[2]], [[refs[1], refs[2]]]).score
    assert rows[1]["bleu"] == pytest.approx(expected) and rows[2]["bleu"] is None


def test_mismatched_lines_are_a_clear_error():
    with pytest.raises(UserError, match="hyp has 2 lines but ref has 1"):
        score(["a", "b"], ["a"])
    with pytest.raises(UserError, match="src has 1 lines"):
        score(["a", "b"], ["a", "b"], ["x"])


def test_cli_prints_and_writes_json(tmp_path, capsys):
    (tmp_path / "h.txt").write_text("the cat sat on the mat\nhello world\n")
    (tmp_path / "r.de").write_text("the cat sat on a mat\nhello world\n")
    (tmp_path / "s.txt").write_text("x y z\n" + "w " * 30 + "\n")
    argv = [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.de", f"src={tmp_path}/s.txt", f"out={tmp_path}/o.json"]
    assert guarded("relmt-score", _score, argv) == 0
    printed = capsys.readouterr().out
    assert "sacreBLEU" in printed and "tokenized BLEU" in printed and "21-30: " in printed
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["lang"] == "de" and len(result["by_source_length"]) == 6
    (tmp_path / "short.txt").write_text("one line\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/short.txt", f"ref={tmp_path}/r.de"]) == 2
    assert "has 1 lines but" in capsys.readouterr().err


def test_score_writes_json_only_to_out(tmp_path, capsys):
    """The hypothesis may sit in a read-only or shared folder: nothing is written beside it."""
    (tmp_path / "h.de").write_text("ein Haus\n")
    (tmp_path / "r.de").write_text("ein Haus\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.de", f"ref={tmp_path}/r.de"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.de", "r.de"]
    assert "sacreBLEU" in capsys.readouterr().out
    assert "nothing is written without out=" in USAGE["relmt-score"]


def test_score_arguments_are_key_value_and_a_typo_names_the_key(tmp_path, capsys):
    assert guarded("relmt-score", _score, ["a.tgt", "b.tgt"]) == 2
    err = capsys.readouterr().err
    assert ("'a.tgt': arguments are key=value, e.g. relmt-score hyp=test.hyp.de ref=test.de (keys: hyp, ref, src, "
            "lang, buckets, out)") in err
    assert guarded("relmt-score", _score, ["hyp_file=a.tgt", "ref=b.tgt"]) == 2
    assert "hyp_file: no such argument (did you mean hyp?)" in capsys.readouterr().err


# --- empty input --------------------------------------------------------------------------------

def test_empty_hyp_and_ref_name_both_files(tmp_path, capsys):
    (tmp_path / "h.txt").write_text("")
    (tmp_path / "r.de").write_text("")
    with pytest.raises(UserError, match="hyp=hyp and ref=ref are empty: nothing to score"):
        score([], [])
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.de"]) == 2
    err = capsys.readouterr().err
    assert f"hyp={tmp_path}/h.txt and ref={tmp_path}/r.de are empty: nothing to score" in err
    assert "Traceback" not in err and not (tmp_path / "h.txt.score.json").exists()


def test_one_empty_file_is_a_line_count_mismatch(tmp_path, capsys):
    (tmp_path / "h.txt").write_text("")
    (tmp_path / "r.de").write_text("ein Satz\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.de"]) == 2
    assert f"{tmp_path}/h.txt has 0 lines but {tmp_path}/r.de has 1" in capsys.readouterr().err


def test_only_empty_lines(tmp_path, capsys):
    """References of empty lines only give BLEU nothing to count against: a clear error, not a 0.
    Empty hypotheses against real references are a real result: BLEU 0."""
    (tmp_path / "blank.txt").write_text("\n\n")
    (tmp_path / "r.de").write_text("ein Satz\nnoch einer\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/blank.txt", f"ref={tmp_path}/blank.txt"]) == 2
    assert f"ref={tmp_path}/blank.txt: all 2 lines are empty" in capsys.readouterr().err
    out = f"out={tmp_path}/o.json"
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/blank.txt", f"ref={tmp_path}/r.de", out]) == 0
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["sentences"] == 2 and result["sacrebleu"]["score"] == 0.0 and result["chrf"]["score"] == 0.0


def test_moses_language_from_suffix_or_english(tmp_path, capsys):
    assert (moses_lang("de"), moses_lang("fr"), moses_lang("tgt"), moses_lang("txt"), moses_lang("")) == (
        "de", "fr", "en", "en", "en")
    (tmp_path / "h.txt").write_text("a b c d\n")
    (tmp_path / "r.txt").write_text("a b c d\n")
    out = f"out={tmp_path}/o.json"
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt", out]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["lang"] == "en"  # not "txt"
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt", "lang=xx"]) == 2
    assert "lang=xx: Moses has no tokenization rules for it" in capsys.readouterr().err


def test_the_tokenized_label_never_calls_a_target_moses_does_not_know_english(tmp_path, capsys):
    """Issue 74 §4.10: the toy's target ("tgt") tokenizes by Moses' English rules, as tokenizer.perl falls back
    to them, and the label said `Moses (en)`, as if the target were English. It names the target and the rules."""
    hyp, ref = ["a b-c d ."], ["a b-c d ."]
    assert tokenized_bleu(hyp, ref, "de")["label"].startswith("tokenized BLEU: Moses (de) + compound splitting")
    for lang in ("tgt", "txt", ""):
        label = tokenized_bleu(hyp, ref, lang)["label"]
        assert "Moses (en)" not in label and "English rules" in label and (lang in label), (lang, label)
        assert "Moses (en)" not in lowercased_bleu(hyp, ref, lang)["label"]
    assert "Moses (tgt, English rules)" in tokenized_bleu(hyp, ref, "tgt")["label"]
    # relmt-score on the toy's text files (scripts/reproduce/toy_corpus.py: test.src, test.tgt)
    (tmp_path / "hyp.tgt").write_text("a b-c d .\n")
    (tmp_path / "test.tgt").write_text("a b-c d .\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/hyp.tgt", f"ref={tmp_path}/test.tgt"]) == 0
    printed = capsys.readouterr().out
    assert "Moses (en)" not in printed and "Moses (tgt, English rules)" in printed, printed


# --- paired bootstrap (sacreBLEU's implementation, as `sacrebleu --paired-bs`) --------------------

def fabricated_systems(n: int = 60) -> tuple[list[str], list[str], list[str]]:
    """References, an unrelated "bad" system, and a "mixed" one that copies every other reference."""
    rng = random.Random(0)
    words = "the a cat dog sat on mat house red blue runs quickly under over".split()

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
    refs, bad = [sentence() for _ in range(n)], [sentence() for _ in range(n)]
    mixed = [r if i % 2 else b for i, (r, b) in enumerate(zip(refs, bad))]
    return refs, bad, mixed


def test_paired_bootstrap_identical_systems_are_not_significant():
    refs, bad, mixed = fabricated_systems()
    for hyps in (bad, mixed):
        result = paired_bootstrap(hyps, list(hyps), refs, n_samples=200)
        assert result["baseline"] == result["system"] and result["p_value"] == 1.0
        assert result["low"] == result["high"] == 0.0


def test_paired_bootstrap_a_copy_of_the_reference_beats_a_bad_system():
    refs, bad, _ = fabricated_systems()
    for metric, name, scorer in (("bleu", "BLEU", BLEU), ("chrf", "chrF2", CHRF)):
        result = paired_bootstrap(bad, refs, refs, metric=metric, n_samples=200)
        assert result["metric"] == name and result["system"] == pytest.approx(100.0)
        assert result["baseline"] == pytest.approx(scorer().corpus_score(bad, [refs]).score)  # sacreBLEU's own
        assert result["system"] > result["baseline"] and result["p_value"] < 0.05 and result["low"] > 0
        assert "paired-bootstrap:200" in result["signature"] and "seed:12345" in result["signature"]


def test_paired_bootstrap_p_is_two_sided_and_agrees_with_the_interval():
    """Swapping the systems negates the difference and its interval and keeps p; p < alpha exactly
    when the interval excludes 0."""
    rng = random.Random(3)
    refs, bad, _ = fabricated_systems(60)
    for trial in range(30):
        a = [r if rng.random() < 0.5 else b for r, b in zip(refs, bad)]
        b = [r if rng.random() < 0.5 + trial / 100 else x for r, x in zip(refs, bad)]
        ab, ba = (paired_bootstrap(x, y, refs, n_samples=300, seed=trial + 1) for x, y in ((a, b), (b, a)))
        assert ab["p_value"] == ba["p_value"] and ab["difference"] == pytest.approx(-ba["difference"])
        assert (ab["low"], ab["high"]) == pytest.approx((-ba["high"], -ba["low"]))
        assert (ab["p_value"] < 0.05) == (ab["low"] > 0 or ab["high"] < 0)
        assert ab["low"] <= ab["difference"] + 5 and ab["high"] >= ab["difference"] - 5


def simulated_equal_systems(rng: random.Random, n: int) -> tuple[list[str], list[str], list[str]]:
    """Two systems of the same quality: each hypothesis word is the reference's with probability 0.6,
    else a random word, drawn independently for each system."""
    words = [f"w{i}" for i in range(40)]
    refs = [[rng.choice(words) for _ in range(rng.randint(5, 15))] for _ in range(n)]

    def system() -> list[str]:
        return [" ".join(w if rng.random() < 0.6 else rng.choice(words) for w in ref) for ref in refs]
    return system(), system(), [" ".join(ref) for ref in refs]


def test_paired_bootstrap_is_calibrated_on_systems_of_equal_quality():
    """At alpha = 0.05, two systems of equal quality are found different in 3-7% of trials, and p
    spreads over (0, 1]: a two-sided p exceeds 0.5 about half the time (sacreBLEU's never does)."""
    rng = random.Random(2018)
    ps = [paired_bootstrap(*simulated_equal_systems(rng, 100), n_samples=400, seed=trial + 1)["p_value"]
          for trial in range(600)]
    rejected = sum(p < 0.05 for p in ps) / len(ps)
    assert 0.03 <= rejected <= 0.07
    assert 0.35 <= sum(p > 0.5 for p in ps) / len(ps) <= 0.65


def test_paired_bootstrap_rejects_misaligned_input():
    refs, bad, _ = fabricated_systems(5)
    with pytest.raises(ValueError, match="line-aligned"):
        paired_bootstrap(bad, bad[:4], refs)
    with pytest.raises(ValueError, match="metric=ter"):
        paired_bootstrap(bad, bad, refs, metric="ter")
