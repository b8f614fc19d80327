"""Validation during and after training (relmt/train/validate.py): the loss of a prepared split,
with every pair counted, and the scores of its translations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

from relmt.config import DecodeConfig, ModelConfig
from relmt.data.batching import collate
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import EOS_ID, PAD_ID
from relmt.decode.beam import Hypothesis
from relmt.evaluate.metrics import lowercased_bleu, tokenized_bleu
from relmt.model.transformer import build_model
from relmt.train import validate
from relmt.train.loss import label_smoothed_nll

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "Die", "Auto-Industrie", "wächst", ".", "Der", "Hund", "läuft",
         "schnell", "Haus"]


class WordTokenizer:
    """Ids are indices into WORDS; decode joins words with spaces (a stand-in for sentencepiece)."""

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" ".join(WORDS[i] for i in row) for row in ids]


@dataclass
class OneSplitCorpus:
    """What validation reads of a prepared `Corpus` (ids, texts, tokenizer, meta), for one split "valid"."""

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


@pytest.mark.parametrize("tgt,lang", [("de", "de"), ("tgt", "tgt, English rules")])  # toy: not "en" (issue 74)
def test_translate_split_stores_tokenized_bleu_beside_sacrebleu(tmp_path, monkeypatch, tgt, lang):
    refs = ["Die Auto-Branche wächst .", "Der Hund läuft schnell ."]
    hyp_ids = [[4, 5, 6, 7], [8, 9, 10, 7]]
    monkeypatch.setattr(validate, "decode_sources", lambda *args, **kw: [[Hypothesis(h, 0.0)] for h in hyp_ids])
    corpus = make_corpus([[5, EOS_ID]] * 2, [[4, 5]] * 2, refs, tgt)
    out = tmp_path / "hyps" / "valid.txt"
    scores, hyps = validate.translate_split(None, corpus, "valid", DecodeConfig(), torch.device("cpu"),
                                           out_file=out)
    assert hyps == ["Die Auto-Industrie wächst .", "Der Hund läuft ."]
    assert out.read_text() == "".join(h + "\n" for h in hyps)
    bleu, chrf = BLEU(), CHRF()
    assert scores["bleu"] == pytest.approx(bleu.corpus_score(hyps, [refs]).score)
    assert scores["signature"] == str(bleu.get_signature()) and scores["sentences"] == 2
    assert scores["chrf"] == pytest.approx(chrf.corpus_score(hyps, [refs]).score)
    expected = tokenized_bleu(hyps, refs, tgt)
    assert scores["tokenized_bleu"] == pytest.approx(expected["score"])
    assert scores["tokenized_signature"] == expected["signature"] and "tok:none" in expected["signature"]
    assert f"Moses ({lang}) + compound splitting" in scores["tokenized_label"]
    assert scores["lowercased_bleu"] == pytest.approx(lowercased_bleu(hyps, refs, tgt)["score"])
    assert scores["tokenized_bleu"] == pytest.approx(tokenized_bleu(hyps, refs, "de" if tgt == "de" else "en")["score"])
    assert scores["lowercased_label"].startswith("lowercased tokenized BLEU")
    # validation may skip it
    quick, _ = validate.translate_split(None, corpus, "valid", DecodeConfig(), torch.device("cpu"), tokenized=False)
    assert "tokenized_bleu" not in quick and quick["bleu"] == scores["bleu"]


def test_eval_batches_keep_every_pair_and_give_an_oversize_one_its_own_batch():
    src_lens, tgt_lens = np.array([3, 12, 2, 4, 3]), np.array([2, 10, 2, 3, 2])
    data = SplitIds(np.zeros(src_lens.sum(), np.int32), np.concatenate(([0], np.cumsum(src_lens))),
                    np.zeros(tgt_lens.sum(), np.int32), np.concatenate(([0], np.cumsum(tgt_lens))))
    batches = validate.eval_batches(data, max_tokens=16)  # pair 1 costs 12 + 10 + 1 = 23 on its own
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
    result = validate.split_loss(model, corpus, "valid", max_tokens=16, label_smoothing=0.1,
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
