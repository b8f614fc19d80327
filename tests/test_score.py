"""relmt-score: sacreBLEU, chrF, paper-comparable tokenized BLEU, and the by-length report; and the
scoring of prepared splits during and after training (relmt/evaluate/scoring.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

from relmt.cli import _score, guarded
from relmt.config import DecodeConfig, ModelConfig
from relmt.data.batching import collate
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import EOS_ID, PAD_ID
from relmt.errors import UserError
from relmt.evaluate import scoring
from relmt.evaluate.score import bucketed_bleu, lowercased_bleu, moses_lang, score, split_compounds, tokenized_bleu
from relmt.model.transformer import build_model
from relmt.train.loss import label_smoothed_nll


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
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/blank.txt", f"ref={tmp_path}/r.de"]) == 0
    result = json.loads((tmp_path / "blank.txt.score.json").read_text())
    assert result["sentences"] == 2 and result["sacrebleu"]["score"] == 0.0 and result["chrf"]["score"] == 0.0


def test_moses_language_from_suffix_or_english(tmp_path, capsys):
    assert (moses_lang("de"), moses_lang("fr"), moses_lang("tgt"), moses_lang("txt"), moses_lang("")) == (
        "de", "fr", "en", "en", "en")
    (tmp_path / "h.txt").write_text("a b c d\n")
    (tmp_path / "r.txt").write_text("a b c d\n")
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt"]) == 0
    assert json.loads((tmp_path / "h.txt.score.json").read_text())["lang"] == "en"  # not "txt"
    assert guarded("relmt-score", _score, [f"hyp={tmp_path}/h.txt", f"ref={tmp_path}/r.txt", "lang=xx"]) == 2
    assert "lang=xx: Moses has no tokenization rules for it" in capsys.readouterr().err


# --- scoring prepared splits (relmt/evaluate/scoring.py) -----------------------------------------

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "Die", "Auto-Industrie", "wächst", ".", "Der", "Hund", "läuft",
         "schnell", "Haus"]


class WordTokenizer:
    """Ids are indices into WORDS; decode joins words with spaces (a stand-in for sentencepiece)."""

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" ".join(WORDS[i] for i in row) for row in ids]


@dataclass
class OneSplitCorpus:
    """What scoring reads of a prepared `Corpus` (ids, texts, tokenizer, meta), for one split "valid"."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    refs: list[str]
    meta: dict
    tokenizer: WordTokenizer = field(default_factory=WordTokenizer)

    def ids(self, split: str) -> SplitIds:
        assert split == "valid"
        flat = [np.array([t for row in rows for t in row], np.int32) for rows in (self.src_ids, self.tgt_ids)]
        offsets = [np.cumsum([0] + [len(row) for row in rows]) for rows in (self.src_ids, self.tgt_ids)]
        return SplitIds(flat[0], offsets[0], flat[1], offsets[1])

    def texts(self, split: str, side: str) -> list[str]:
        assert (split, side) == ("valid", "tgt")
        return self.refs


def make_corpus(src_ids: list[list[int]], tgt_ids: list[list[int]], refs: list[str], tgt: str) -> OneSplitCorpus:
    return OneSplitCorpus(src_ids, tgt_ids, refs, {"config": {"src": "en", "tgt": tgt}})


@pytest.mark.parametrize("tgt,lang", [("de", "de"), ("tgt", "en")])
def test_translate_split_stores_tokenized_bleu_beside_sacrebleu(tmp_path, monkeypatch, tgt, lang):
    refs = ["Die Auto-Branche wächst .", "Der Hund läuft schnell ."]
    hyp_ids = [[4, 5, 6, 7], [8, 9, 10, 7]]
    monkeypatch.setattr(scoring, "decode_split", lambda *args: hyp_ids)
    corpus = make_corpus([[5, EOS_ID]] * 2, [[4, 5]] * 2, refs, tgt)
    out = tmp_path / "hyps" / "valid.txt"
    scores, hyps = scoring.translate_split(None, corpus, "valid", DecodeConfig(), torch.device("cpu"),
                                           out_file=out)
    assert hyps == ["Die Auto-Industrie wächst .", "Der Hund läuft ."]
    assert out.read_text() == "".join(h + "\n" for h in hyps)
    bleu, chrf = BLEU(), CHRF()
    assert scores["bleu"] == pytest.approx(bleu.corpus_score(hyps, [refs]).score)
    assert scores["signature"] == str(bleu.get_signature()) and scores["sentences"] == 2
    assert scores["chrf"] == pytest.approx(chrf.corpus_score(hyps, [refs]).score)
    expected = tokenized_bleu(hyps, refs, lang)
    assert scores["tokenized_bleu"] == pytest.approx(expected["score"])
    assert scores["tokenized_signature"] == expected["signature"] and "tok:none" in expected["signature"]
    assert f"Moses ({lang}) + compound splitting" in scores["tokenized_label"]
    assert scores["lowercased_bleu"] == pytest.approx(lowercased_bleu(hyps, refs, lang)["score"])
    assert scores["lowercased_label"].startswith("lowercased tokenized BLEU")
    # validation may skip it
    quick, _ = scoring.translate_split(None, corpus, "valid", DecodeConfig(), torch.device("cpu"), tokenized=False)
    assert "tokenized_bleu" not in quick and quick["bleu"] == scores["bleu"]


def test_eval_batches_keep_every_pair_and_give_an_oversize_one_its_own_batch():
    src_lens, tgt_lens = np.array([3, 12, 2, 4, 3]), np.array([2, 10, 2, 3, 2])
    data = SplitIds(np.zeros(src_lens.sum(), np.int32), np.concatenate(([0], np.cumsum(src_lens))),
                    np.zeros(tgt_lens.sum(), np.int32), np.concatenate(([0], np.cumsum(tgt_lens))))
    batches = scoring.eval_batches(data, max_tokens=16)  # pair 1 costs 12 + 10 + 1 = 23 on its own
    assert sorted(int(i) for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert [1] in [b.tolist() for b in batches]
    for b in batches:
        if len(b) > 1:
            assert len(b) * (src_lens[b].max() + tgt_lens[b].max() + 1) <= 16


def test_split_loss_counts_pairs_longer_than_max_tokens():
    """Evaluation splits are never filtered: a pair whose cost alone exceeds max_tokens still counts.
    The reference is the loss of each pair computed on its own."""
    torch.manual_seed(0)
    vocab = len(WORDS)
    lens = [(3, 2), (12, 10), (2, 3), (4, 2)]  # pair 1: 12 + 10 + 1 = 23 > max_tokens = 16
    rng = np.random.default_rng(0)
    src_ids = [[*rng.integers(4, vocab, s - 1).tolist(), EOS_ID] for s, _ in lens]
    tgt_ids = [rng.integers(4, vocab, t).tolist() for _, t in lens]
    corpus = make_corpus(src_ids, tgt_ids, ["x"] * len(lens), "de")
    model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1),
                        vocab, PAD_ID).train()
    result = scoring.split_loss(model, corpus, "valid", max_tokens=16, label_smoothing=0.1,
                                device=torch.device("cpu"))
    assert model.training  # restored
    data, loss, nll, tokens = corpus.ids("valid"), 0.0, 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(len(lens)):
            batch = collate(data, np.array([i]))
            pair_loss, pair_nll = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1)
            loss, nll, tokens = loss + pair_loss.item(), nll + pair_nll.item(), tokens + batch.n_tgt_tokens
    assert tokens == sum(t + 1 for _, t in lens)  # every target token and its EOS
    assert result["loss"] == pytest.approx(loss / tokens, rel=1e-5)
    assert result["nll"] == pytest.approx(nll / tokens, rel=1e-5)
    assert result["ppl"] == pytest.approx(np.exp(nll / tokens), rel=1e-5)
