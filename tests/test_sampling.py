"""Sampling (relmt/decode/sampling.py): the draws follow softmax(logits / temperature) cut by topk
and topp, topk=1 is greedy decoding, a seed fixes the samples without global RNG, and the limits,
scores and config checks hold."""

from __future__ import annotations

import math

import pytest
import torch

from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.config import DecodeConfig, ModelConfig
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import length_penalty
from relmt.decode.greedy import greedy_decode
from relmt.decode.reference import score_references
from relmt.decode.sampling import draw, sample, sampling_logits, uniforms
from relmt.decode.search import decode_sources
from relmt.decode.translator import Translator
from relmt.dropout import MASK32, _mul32, hash32
from relmt.model.transformer import build_model
from tests.tiny_checkpoints import SENTENCES, toy_tokenizer, write_checkpoint

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("cpu_for_auto")  # CPU float32 pins: see conftest.py
INF = float("-inf")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampling")
    return write_checkpoint(tmp, "a.pt", toy_tokenizer(tmp), seed=1)


@pytest.fixture(scope="module")
def eos_ckpt(tmp_path_factory):
    """A random model whose greedy outputs end at EOS for some sentences and at the limit for others."""
    tmp = tmp_path_factory.mktemp("sampling_eos")
    return write_checkpoint(tmp, "eos.pt", toy_tokenizer(tmp), seed=1, eos_boost=3.5)


# --- the pieces, by hand ------------------------------------------------------------------------------

def lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32 in plain Python integers: the reference for hash32."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def test_hash32_is_lowbias32_without_int64_overflow():
    xs = [0, 1, 2, 12345, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1, 0xDEADBEEF]
    t = torch.tensor(xs)
    assert _mul32(t, 0x846CA68B).tolist() == [(x * 0x846CA68B) % 2 ** 32 for x in xs]
    assert hash32(t).tolist() == [lowbias32(x) for x in xs]


def test_uniforms_are_uniform_and_differ_by_key_and_step():
    keys = hash32(torch.arange(200_000))
    u = uniforms(keys, step=0)
    assert u.dtype == torch.float64 and 0 <= u.min() and u.max() < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    assert (counts - 10_000).abs().max() < 5 * math.sqrt(10_000)  # each bin within 5 standard deviations
    assert len(set(u.tolist())) > 199_990
    assert abs(torch.corrcoef(torch.stack((u, uniforms(keys, step=1))))[0, 1]) < 0.01


def test_sampling_logits_by_hand():
    x = torch.tensor([[2.0, 1.0, 0.0, -1.0, INF]])
    shifted = (x - 2.0).double()  # the row's maximum subtracted, so that no temperature overflows (issue 57)
    assert torch.equal(sampling_logits(x, 1.0, 0, 1.0), shifted)
    assert torch.equal(sampling_logits(x, 2.0, 0, 1.0), shifted / 2)
    assert sampling_logits(x, 1.0, 2, 1.0).tolist() == [[0.0, -1.0, INF, INF, INF]]
    # softmax(x) = .644, .237, .087, .032, 0 (cumulative .644, .881, .968): topp .6 keeps one, .7 two, .9 three,
    # .97 four
    kept = {p: torch.isfinite(sampling_logits(x, 1.0, 0, p)).sum().item() for p in (0.01, 0.6, 0.7, 0.9, 0.97)}
    assert kept == {0.01: 1, 0.6: 1, 0.7: 2, 0.9: 3, 0.97: 4}
    # topp acts on the distribution left by topk: (.731, .269) after topk=2, so .75 keeps both
    assert torch.isfinite(sampling_logits(x, 1.0, 2, 0.75)).sum().item() == 2


def test_draw_inverts_the_cumulative_distribution():
    scores = torch.log(torch.tensor([0.5, 0.0, 0.25, 0.25])).expand(6, 4)  # token 1 has probability 0
    u = torch.tensor([0.0, 0.49, 0.51, 0.74, 0.76, 1 - 2 ** -32], dtype=torch.float64)
    assert draw(scores, u).tolist() == [0, 0, 2, 2, 3, 3]


# --- the distribution of the first token -------------------------------------------------------------

def expected_first_token(logits: torch.Tensor, temperature: float, topk: int, topp: float) -> torch.Tensor:
    """q over the vocabulary, written out in float64 with Python loops: PAD and BOS never drawn,
    then softmax(logits / T), then the topk most likely, renormalised, then the smallest set of most
    likely tokens holding topp of that, renormalised."""
    x = logits.double().clone()
    x[[PAD_ID, BOS_ID]] = INF
    p = torch.softmax(x / temperature, dim=-1)
    order = sorted(range(len(p)), key=lambda i: -p[i].item())
    allowed = [i for i in order if p[i] > 0][: topk or None]
    total = sum(p[i].item() for i in allowed)
    kept, mass = [], 0.0
    for i in allowed:
        if mass >= topp:
            break
        kept.append(i)
        mass += p[i].item() / total
    q = torch.zeros_like(p)
    q[kept] = p[kept] / p[kept].sum()
    return q


@pytest.mark.parametrize("temperature,topk,topp", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 4, 1.0), (1.0, 0, 0.7),
                                                   (0.7, 5, 0.8), (1.3, 3, 0.9)])
def test_first_tokens_follow_the_cut_tempered_softmax(temperature, topk, topp):
    torch.manual_seed(3)
    vocab, n = 14, 20_000
    model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1,
                                    max_relative_position=2, dropout=0.0, attention_dropout=0.0,
                                    activation_dropout=0.0), vocab, PAD_ID).eval()
    with torch.no_grad():
        model.tgt_embed.weight.mul_(2.0)  # a peakier distribution, so that the cuts matter
    src = torch.tensor([[5, 9, 7, EOS_ID]])
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        logits = model.decode_step(torch.tensor([BOS_ID]), memory, src_mask)[0][0]
    q = expected_first_token(logits, temperature, topk, topp)
    (hyps,) = sample(model, src, torch.tensor([1]), n, BOS_ID, EOS_ID, seed=11, temperature=temperature, topk=topk,
                     topp=topp, max_len_a=0.0, max_len_b=1, nbest=n)
    assert len(hyps) == n
    counts = torch.bincount(torch.tensor([h.tokens[0] if h.tokens else EOS_ID for h in hyps]), minlength=vocab)
    support = q > 0
    assert (counts[~support] == 0).all()  # nothing outside the cuts, never PAD or BOS
    z = (counts - n * q).abs() / (n * q * (1 - q)).sqrt().clamp(min=1e-9)
    assert z[support].max() < 5, (counts.tolist(), (n * q).round().tolist())
    # the same counts reject the plain softmax (no temperature, no cuts) where the settings change it
    plain = expected_first_token(logits, 1.0, 0, 1.0)
    if not torch.allclose(plain, q):
        z_plain = (counts - n * plain).abs() / (n * plain * (1 - plain)).sqrt().clamp(min=1e-9)
        assert z_plain.max() > 10


# --- topk=1 is greedy decoding -------------------------------------------------------------------------

@pytest.mark.parametrize("beam,temperature,min_len", [(1, 1.0, 0), (3, 0.5, 0), (2, 3.0, 4)])
def test_topk_one_is_greedy(eos_ckpt, beam, temperature, min_len):
    translator = Translator.from_checkpoint(eos_ckpt)
    sources = translator.tokenizer.encode(SENTENCES)
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=0.0, max_len_b=8, min_len=min_len, sampling=True, topk=1,
                       temperature=temperature, seed=7)
    hyps = decode_sources(translator.model, sources, cfg, CPU)
    lengths = set()
    for x, hs in zip(sources, hyps):
        (expected,) = greedy_decode(translator.model, torch.tensor([[*x, EOS_ID]]), BOS_ID, EOS_ID, 0.0, 8,
                                    min_len=min_len)
        assert len(hs) == beam and all(h.tokens == expected for h in hs)
        lengths.add(len(expected))
    assert min_len or len(lengths) > 1  # EOS ends some, the limit others


# --- reproducible from a seed, without global RNG -----------------------------------------------------

SAMPLING = dict(sampling=True, beam=4, nbest=4, temperature=1.5, max_len_b=8)


def test_same_seed_same_samples_other_seed_others(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    first = translator.hypotheses(SENTENCES, seed=1, **SAMPLING)
    torch.manual_seed(123)  # the global RNG plays no part
    state = torch.get_rng_state()
    assert translator.hypotheses(SENTENCES, seed=1, **SAMPLING) == first
    assert torch.equal(torch.get_rng_state(), state)  # and is left alone
    other = translator.hypotheses(SENTENCES, seed=2, **SAMPLING)
    assert sum(a != b for a, b in zip(first, other)) >= 3
    assert len({tuple(h.tokens) for hs in first for h in hs}) > 5  # the samples vary


def test_samples_do_not_depend_on_the_batch(ckpt, tmp_path, capsys):
    """A line's samples depend on (seed, line number) only: alone or in a batch, in any chunking."""
    translator = Translator.from_checkpoint(ckpt)
    together = translator.hypotheses(SENTENCES, seed=3, **SAMPLING)
    alone = [translator.hypotheses([s], first_line=i + 1, seed=3, **SAMPLING)[0] for i, s in enumerate(SENTENCES)]
    assert [[h.tokens for h in hs] for hs in alone] == [[h.tokens for h in hs] for hs in together]
    for a, b in zip(alone, together):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    # a repeated line draws other samples: the line number is part of the seed
    twice = translator.hypotheses([SENTENCES[0]] * 2, seed=3, **SAMPLING)
    assert [h.tokens for h in twice[0]] != [h.tokens for h in twice[1]]
    # relmt-translate in chunks of 2 lines gives the API's samples
    src = tmp_path / "in.txt"
    src.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    args = [f"checkpoint={ckpt}", f"input={src}", "sampling=true", "beam=4", "temperature=1.5", "max_len_b=8",
            "seed=3"]
    assert guarded("relmt-translate", _translate, [*args, "buffer_lines=2"]) == 0
    expected = translator.translate(SENTENCES, seed=3, **{**SAMPLING, "nbest": 1})
    assert capsys.readouterr().out.splitlines() == expected
    assert guarded("relmt-translate", _translate, [*args, "seed=4"]) == 0
    assert capsys.readouterr().out.splitlines() != expected


# --- scores, lengths, EOS ----------------------------------------------------------------------------------

def test_sample_scores_are_the_models_log_probability(ckpt):
    """A sample's score is log P(y | x) / lp(|y|), the beam search's score, with log P(y | x) the
    forced-decoding score of y (relmt/decode/reference.py), whatever temperature and cuts drew it;
    each sentence's nbest come best first."""
    translator = Translator.from_checkpoint(ckpt)
    hyps = translator.hypotheses(SENTENCES, seed=5, lenpen=0.6, **{**SAMPLING, "topk": 20, "temperature": 0.8})
    sources = translator.tokenizer.encode(SENTENCES)
    for x, hs in zip(sources, hyps):
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
        forced = score_references(translator.model, [x] * len(hs), [h.tokens for h in hs], 0, 10_000, CPU)
        for h, f in zip(hs, forced):
            ended = len(h.tokens) < 8  # else the limit ended it, without EOS
            assert f.tokens == len(h.tokens) + 1
            logp = f.logprob if ended else f.logprob - eos_logprob(translator, x, h.tokens)
            assert h.score == pytest.approx(logp / length_penalty(len(h.tokens) + ended, 0.6), abs=1e-4)


def eos_logprob(translator: Translator, source: list[int], tokens: list[int]) -> float:
    """log p(EOS | tokens, source): part of the forced score of `tokens`, not of a sample the limit cut."""
    with torch.no_grad():
        memory, mask = translator.model.encode(torch.tensor([[*source, EOS_ID]]))
        logits = translator.model.decode(torch.tensor([[BOS_ID, *tokens]]), memory, mask)[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)[EOS_ID].item()


def test_min_len_and_the_step_limit(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    for min_len, limit in ((3, 8), (5, 5)):
        hyps = translator.hypotheses(SENTENCES, seed=1, **{**SAMPLING, "min_len": min_len, "max_len_b": limit})
        lengths = {len(h.tokens) for hs in hyps for h in hs}
        assert min(lengths) >= min_len and max(lengths) <= limit
        assert EOS_ID not in {t for hs in hyps for h in hs for t in h.tokens}
    assert lengths == {5}


# --- config checks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("values,message", [
    (dict(sampling=True, topk=-1), "decode.topk: must be >= 0"),
    (dict(sampling=True, topp=0.0), r"decode.topp: must be in \(0, 1\]"),
    (dict(sampling=True, topp=1.5), r"decode.topp: must be in \(0, 1\]"),
    (dict(sampling=True, temperature=0.0), "decode.temperature: must be > 0"),
    (dict(sampling=True, temperature=float("nan")), "decode.temperature: must be > 0"),
    (dict(topk=5), r"decode.topk: applies only when sampling \(decode.sampling=true\)"),
    (dict(temperature=0.7), r"decode.temperature: applies only when sampling"),
])
def test_bad_sampling_settings_name_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**values)


@pytest.mark.parametrize("overrides,message", [
    (["topk=5"], "topk=5: applies only when sampling (sampling=true), got 5 without it"),
    (["sampling=true", "temperature=0"], "temperature=0.0: must be > 0"),
    (["sampling=true", "topp=2"], "topp=2.0: must be in (0, 1]"),
])
def test_cli_rejects_bad_sampling_overrides_by_key(ckpt, capsys, overrides, message):
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
