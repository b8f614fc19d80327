"""relmt-score: sacreBLEU, chrF, paper-comparable tokenized BLEU, and the by-length report."""

from __future__ import annotations

import json

import pytest
from sacrebleu.metrics import BLEU

from relmt.cli import _score, guarded
from relmt.errors import UserError
from relmt.evaluate.score import bucketed_bleu, score, split_compounds, tokenized_bleu


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
