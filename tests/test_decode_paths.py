"""One decoding path (issue 13): validation BLEU (relmt.train.validate.translate_split) and
relmt-translate (Translator) decode through relmt.decode.search.decode_sources, so the same
sentences and DecodeConfig give the same translations with the same scores. Nothing is trained:
a random model and a tiny toy corpus are enough, since the two must agree whatever the weights."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from relmt.config import DecodeConfig, EosCandidates, ModelConfig, compose
from relmt.data.dataset import Corpus, prepare
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.greedy import greedy_decode
from relmt.decode.search import decode_sources, nbest_search, output_weight
from relmt.decode.translator import Translator
from relmt.evaluate.metrics import sacrebleu_score
from relmt.model.transformer import Transformer, build_model
from relmt.train.validate import source_name, split_sources, translate_split

CPU = torch.device("cpu")
SHORT = dict(max_len_a=0.0, max_len_b=8)  # random models rarely choose EOS: keep the outputs short
# Each variant decodes the whole split both ways; max_source_len=5 cuts about half of its sources,
# and max_source_tokens=30 makes batches of 2 to 6 sentences.
VARIANTS = {
    "greedy": DecodeConfig(beam=1, **SHORT),
    "greedy-min_len": DecodeConfig(beam=1, min_len=6, **SHORT),
    "beam4": DecodeConfig(beam=4, **SHORT),
    "beam4-nbest3": DecodeConfig(beam=4, nbest=3, **SHORT),
    "beam4-min_len": DecodeConfig(beam=4, nbest=2, min_len=6, **SHORT),
    "beam4-fairseq-early_stop": DecodeConfig(beam=4, lenpen=0.0, early_stop=True,
                                             eos_candidates=EosCandidates.fairseq, **SHORT),
    "beam4-max_source_len": DecodeConfig(beam=4, max_source_len=5, **SHORT),
    "greedy-max_source_len": DecodeConfig(beam=1, max_source_len=5, **SHORT),
    "beam4-small-batches": DecodeConfig(beam=4, max_source_tokens=30, **SHORT),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    cache = tmp_path_factory.mktemp("decode_paths")
    cfg = compose([f"data.cache_dir={cache}", "data.toy.n_train=200", "data.toy.n_valid=24", "data.toy.n_test=4",
                   "data.toy.n_test_long=4"])
    return prepare(cfg.data)


@pytest.fixture(scope="module")
def model(corpus: Corpus) -> Transformer:
    torch.manual_seed(13)
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, max_relative_position=4,
                      dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = build_model(cfg, corpus.tokenizer.vocab_size, PAD_ID).eval()
    with torch.no_grad():  # make EOS likely, so that hypotheses of different lengths finish and compete
        model.tgt_embed.weight[EOS_ID] *= 4
    return model


def test_the_corpus_exercises_what_is_compared(corpus, model):
    """Premises: the cache holds the tokenizer's ids of each source plus EOS, the vocabulary is not a
    multiple of 16 (so CPU decoding pads the output weight), and some hypotheses end in EOS."""
    data = corpus.ids("valid")
    texts = corpus.texts("valid", "src")
    assert [x.tolist() for x in split_sources(data)] == corpus.tokenizer.encode(texts)
    assert (data.src[data.src_offsets[1:] - 1] == EOS_ID).all()
    assert corpus.tokenizer.vocab_size % 16 and output_weight(model, CPU) is not None
    hyps = decode_sources(model, split_sources(data), VARIANTS["beam4"], CPU)
    assert 0 < sum(len(h[0].tokens) < SHORT["max_len_b"] for h in hyps) < len(hyps)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_validation_and_translation_give_the_same_hypotheses(corpus, model, variant, caplog):
    cfg = VARIANTS[variant]
    texts, refs = corpus.texts("valid", "src"), corpus.texts("valid", "tgt")
    translator = Translator(model, corpus.tokenizer, cfg, CPU)

    scores, valid_hyps = translate_split(model, corpus, "valid", cfg, CPU, tokenized=False)
    assert valid_hyps == translator.translate(texts)
    assert scores["bleu"] == sacrebleu_score(translator.translate(texts), refs)["score"]

    # n-best lists with their scores, equal as floats (the same batches and the same arithmetic)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        valid_nbest = decode_sources(model, split_sources(corpus.ids("valid")), cfg, CPU,
                                     name=source_name(corpus, "valid"))
        translated = translator.hypotheses(texts, name="valid.src")
    assert translated == valid_nbest
    assert all(len(h) == cfg.nbest for h in translated)
    lens = [len(x) for x in corpus.tokenizer.encode(texts)]
    if cfg.max_source_len == 5:  # each cut source is named once by each path, with the same line
        cut = [i for i, n in enumerate(lens) if n > 5]
        assert cut and caplog.text.count("more than max_source_len=5") == 2 * len(cut)
        assert caplog.text.count(f"valid.src:{cut[0] + 1}: the source has {lens[cut[0]]} tokens") == 2
    else:
        assert "max_source_len" not in caplog.text


def test_beam_one_is_the_greedy_oracle_on_the_split(corpus, model):
    """Beam 1 in the shared path (the beam search) gives greedy decoding's tokens (the oracle)."""
    sources = split_sources(corpus.ids("valid"))
    for cfg in (VARIANTS["greedy"], VARIANTS["greedy-min_len"]):
        hyps = decode_sources(model, sources, cfg, CPU)
        for x, h in zip(sources, hyps):
            (expected,) = greedy_decode(model, torch.tensor([[*x.tolist(), EOS_ID]]), BOS_ID, EOS_ID, cfg.max_len_a,
                                        cfg.max_len_b, min_len=cfg.min_len)
            assert h[0].tokens == expected


def test_padded_output_weight_changes_nothing(corpus, model):
    """The output weight padded for the CPU GEMM gives the logits of the plain tied projection
    (Transformer._logits), and the same hypotheses."""
    weight = output_weight(model, CPU)
    vocab = corpus.tokenizer.vocab_size
    assert weight.shape == (vocab + (-vocab % 16), model.tgt_embed.embedding_dim)
    assert torch.equal(weight[:vocab], model.tgt_embed.weight) and not weight[vocab:].any()
    rows = [[*x.tolist(), EOS_ID] for x in split_sources(corpus.ids("valid"))[:3]]
    src = torch.tensor([row + [PAD_ID] * (max(map(len, rows)) - len(row)) for row in rows])  # (3, S)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        tokens = torch.full((3,), BOS_ID)
        plain, _ = model.decode_step(tokens, memory, src_mask)
        padded, _ = model.decode_step(tokens, memory, src_mask, out_weight=weight)
        full = model.decode(tokens[:, None], memory, src_mask)[:, 0]
    assert padded.shape == plain.shape == (3, vocab)
    torch.testing.assert_close(padded, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(plain, full, rtol=1e-6, atol=1e-6)
    cfg = replace(VARIANTS["beam4"], nbest=2)
    with_pad, without = nbest_search(model, src, cfg, weight), nbest_search(model, src, cfg)
    assert [[h.tokens for h in hs] for hs in with_pad] == [[h.tokens for h in hs] for hs in without]
    for a, b in zip(with_pad, without):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    # only a CPU decoder pads, and only a vocabulary that needs it
    assert output_weight(model, torch.device("meta")) is None
    even = build_model(ModelConfig(d_model=8, n_heads=2, d_ff=8, encoder_layers=1, decoder_layers=1), 32, PAD_ID)
    assert output_weight(even, CPU) is None


def test_empty_sources_give_no_hypotheses_in_place(corpus, model):
    """An empty source is not decoded (relmt-translate writes an empty line for it); the others keep
    their place and their hypotheses."""
    sources = split_sources(corpus.ids("valid"))[:3]
    cfg = VARIANTS["beam4"]
    alone = decode_sources(model, sources, cfg, CPU)
    mixed = decode_sources(model, [[], sources[0], [], sources[1], sources[2], []], cfg, CPU)
    assert mixed == [[], alone[0], [], alone[1], alone[2], []]
    assert decode_sources(model, [[], []], cfg, CPU) == [[], []]
    assert model.training is False
    model.train()
    try:  # validation decodes a model in training mode: eval for the search, training mode after
        assert decode_sources(model, sources, cfg, CPU) == alone and model.training
    finally:
        model.eval()
