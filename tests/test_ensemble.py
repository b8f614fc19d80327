"""Ensembles (relmt/decode/ensemble.py): the mean of the models' probabilities, one decoding path
with single models, N copies of one model = that model exactly, and one vocabulary enforced."""

from __future__ import annotations

import pytest
import torch

from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.config import DecodeConfig, PosKind
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from relmt.decode.beam import beam_search
from relmt.decode.ensemble import Ensemble, EnsembleCache, mix
from relmt.decode.greedy import greedy_decode
from relmt.decode.search import decode_sources, output_weight
from relmt.decode.translator import Translator
from relmt.errors import UserError
from tests.tiny_checkpoints import SENTENCES, model_config, random_model, toy_tokenizer, write_checkpoint

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("cpu_for_auto")  # CPU float32 pins: see conftest.py


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """a.pt and b.pt: two random models of one vocabulary, of different shapes; c.pt: another
    vocabulary of the same size; d.pt: a vocabulary of another size."""
    tmp = tmp_path_factory.mktemp("ensemble")
    spm = toy_tokenizer(tmp)
    return {"a": write_checkpoint(tmp, "a.pt", spm, seed=1),
            "b": write_checkpoint(tmp, "b.pt", spm, seed=2,
                                  model=model_config(d_model=16, n_heads=2, decoder_layers=1)),
            "c": write_checkpoint(tmp, "c.pt", toy_tokenizer(tmp, seed=2), seed=3),
            "d": write_checkpoint(tmp, "d.pt", toy_tokenizer(tmp, vocab_size=100), seed=4)}


# --- mix: the mean of the probabilities ------------------------------------------------------------------

def test_mix_is_the_mean_of_the_probabilities(float64):
    torch.manual_seed(0)
    logits = [torch.randn(2, 3, 11) * 4 for _ in range(3)]
    logits[1][0, 0, 5] = 300.0  # one model sure of a token the others give almost nothing: no overflow
    expected = torch.stack([torch.softmax(x, dim=-1) for x in logits]).mean(dim=0)
    got = mix(logits)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(torch.softmax(got, dim=-1), expected, rtol=1e-12, atol=1e-14)
    # fairseq's formula (EnsembleModel.forward_decoder): logsumexp of the log-probabilities - log N
    fairseq = torch.logsumexp(torch.stack([torch.log_softmax(x, -1) for x in logits]), dim=0) - torch.log(
        torch.tensor(3.0))
    torch.testing.assert_close(torch.log_softmax(got, dim=-1), fairseq, rtol=1e-12, atol=1e-12)
    # not the mean of the log-probabilities (a product of experts), which would differ here
    geometric = torch.log_softmax(torch.stack([torch.log_softmax(x, -1) for x in logits]).mean(0), dim=-1)
    assert (torch.log_softmax(got, dim=-1) - geometric).abs().max() > 0.1


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_mix_of_copies_is_the_logits_bit_for_bit(n):
    torch.manual_seed(n)
    x = torch.randn(4, 37) * 6
    assert torch.equal(mix([x] * n), x)
    assert torch.equal(mix([x.bfloat16()] * n), x.bfloat16().float())  # autocast output, cast as the searches do


# --- copies of one model are that model ----------------------------------------------------------------

@pytest.mark.parametrize("settings", [dict(beam=3, nbest=3), dict(beam=1), dict(beam=4, nbest=2, lenpen=1.0, min_len=2),
                                      dict(beam=3, nbest=2, sampling=True, temperature=1.5, seed=5)])
def test_copies_of_one_model_give_its_output_exactly(ckpts, settings):
    one = Translator.from_checkpoint(ckpts["a"])
    for n in (2, 3):
        copies = Translator.from_checkpoints([ckpts["a"]] * n)
        assert isinstance(copies.model, Ensemble) and len(copies.model.models) == n
        expected = one.hypotheses(SENTENCES, **settings)
        assert any(h[0].tokens for h in expected)  # something beyond EOS is compared
        assert copies.hypotheses(SENTENCES, **settings) == expected  # tokens, and scores as floats, equal
    refs = ["der hund", "", "ein kleiner vogel", "alice sagte", "bob lief"]
    assert Translator.from_checkpoints([ckpts["a"]] * 3).score(SENTENCES, refs) == one.score(SENTENCES, refs)


def test_one_checkpoint_is_no_ensemble(ckpts):
    assert not isinstance(Translator.from_checkpoints([ckpts["a"]]).model, Ensemble)


# --- two different models --------------------------------------------------------------------------------

@pytest.fixture
def pair(ckpts):
    vocab = Tokenizer(toy_tokenizer(ckpts["a"].parent)).vocab_size
    return [random_model(model_config(), vocab, seed=1).double(),
            random_model(model_config(d_model=16, n_heads=2, decoder_layers=1, positions=PosKind.abs), vocab,
                         seed=2).double()]


def sources(ckpts) -> torch.Tensor:
    ids = Tokenizer(toy_tokenizer(ckpts["a"].parent)).encode(SENTENCES)
    width = max(map(len, ids)) + 1
    return torch.tensor([x + [EOS_ID] + [PAD_ID] * (width - len(x) - 1) for x in ids])  # (5, S)


def test_steps_and_reordering_follow_each_model(ckpts, pair, float64):
    """Each step's distribution is the mean of the models' distributions, also after the cache has
    been reordered (EnsembleCache.select) and sentences dropped (EnsembleMemory[keep])."""
    src = sources(ckpts)
    ensemble = Ensemble(pair)
    memory, src_mask = ensemble.encode(src)
    singles = [(m, *m.encode(src)) for m in pair]
    k, tokens = 2, torch.full((len(src) * 2,), BOS_ID)
    cache, caches = None, [None, None]
    keep = torch.tensor([True, False, True, True, False])
    for t in range(4):
        logits, cache = ensemble.decode_step(tokens, memory, src_mask, cache, step=t)
        assert isinstance(cache, EnsembleCache)
        probs = []
        for i, (m, mem, mask) in enumerate(singles):
            x, caches[i] = m.decode_step(tokens, mem, mask, caches[i], step=t)
            probs.append(torch.softmax(x, dim=-1))
        torch.testing.assert_close(torch.softmax(logits, dim=-1), torch.stack(probs).mean(0), rtol=1e-10, atol=1e-12)
        tokens = logits.topk(k, dim=-1).indices[:, t % k]  # some next tokens
        rows = torch.arange(len(tokens)).view(-1, k).flip(1).reshape(-1)  # swap each sentence's two rows
        tokens, cache = tokens[rows], cache.select(rows)
        caches = [c.select(rows) for c in caches]
        if t == 1:  # drop sentences 1 and 4 from everything
            rows = keep.repeat_interleave(k).nonzero()[:, 0]
            sentences = keep.nonzero()[:, 0]
            tokens, memory, src_mask = tokens[rows], memory[keep], src_mask[keep]
            cache = cache.select(rows, sentences)
            caches = [c.select(rows, sentences) for c in caches]
            singles = [(m, mem[keep], mask[keep]) for m, mem, mask in singles]


def test_beam_search_on_an_ensemble(ckpts, pair, float64):
    """The beam search drives an ensemble as it drives one model: cached = uncached, beam 1 = the
    greedy oracle, and the result is neither member's."""
    src = sources(ckpts)
    ensemble = Ensemble(pair).eval()
    kw = dict(beam=3, bos_id=BOS_ID, eos_id=EOS_ID, lenpen=0.6, max_len_a=0.0, max_len_b=6, nbest=3)
    cached = beam_search(ensemble, src, use_cache=True, **kw)
    uncached = beam_search(ensemble, src, use_cache=False, **kw)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for a, b in zip(cached, uncached):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-9)
    cfg = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=6)
    greedy = greedy_decode(ensemble, src, BOS_ID, EOS_ID, 0.0, 6)
    sources_ids = [row[(row != PAD_ID) & (row != EOS_ID)].tolist() for row in src]
    assert [h[0].tokens for h in decode_sources(ensemble, sources_ids, cfg, CPU)] == greedy
    members = [greedy_decode(m, src, BOS_ID, EOS_ID, 0.0, 6) for m in pair]
    assert greedy != members[0] or greedy != members[1]
    assert [h[0].tokens for h in cached] != [h[0].tokens for h in beam_search(pair[0], src, **kw)]


def test_output_weights_are_per_model(ckpts, pair):
    weights = output_weight(Ensemble(pair), CPU)
    assert isinstance(weights, tuple) and len(weights) == 2
    assert all(torch.equal(w, output_weight(m, CPU)) for w, m in zip(weights, pair))


def test_ensemble_of_two_checkpoints_through_the_api_and_the_cli(ckpts, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    both = Translator.from_checkpoints([ckpts["a"], ckpts["b"]])
    expected = both.translate(SENTENCES, beam=2)
    assert expected != Translator.from_checkpoint(ckpts["a"]).translate(SENTENCES, beam=2)
    assert guarded("relmt-translate", _translate, [f"checkpoint=[{ckpts['a']},{ckpts['b']}]", f"input={src}",
                                                   "beam=2"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    # N copies on the command line, too
    assert guarded("relmt-translate", _translate, [f"checkpoint=[{ckpts['a']},{ckpts['a']}]", f"input={src}"]) == 0
    copies = capsys.readouterr().out
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpts['a']}", f"input={src}"]) == 0
    assert copies == capsys.readouterr().out


# --- one vocabulary ----------------------------------------------------------------------------------------

def test_another_vocabulary_is_refused_naming_the_checkpoint(ckpts, capsys):
    a, c, d = ckpts["a"], ckpts["c"], ckpts["d"]
    with pytest.raises(UserError, match=rf"{c}: its vocabulary differs from {a}'s \(sentencepiece model sha256 "
                                        r"\w{12} vs \w{12}; both 120 pieces\)"):
        Translator.from_checkpoints([a, a, c])
    with pytest.raises(UserError, match=rf"{d}: its vocabulary differs from {a}'s .*; 100 pieces, {a} 120\)"):
        Translator.from_checkpoints([a, d])
    assert guarded("relmt-translate", _translate, [f"checkpoint=[{a},{c}]"]) == 2
    err = capsys.readouterr().err
    assert f"{c}: its vocabulary differs from {a}'s" in err and "Traceback" not in err
    assert guarded("relmt-translate", _translate, ["checkpoint=[]"]) == 2
    assert "checkpoint=[]: give a checkpoint" in capsys.readouterr().err


def test_the_ensemble_wrapper_checks_the_vocabulary_too(pair):
    other = random_model(model_config(), 50, seed=3)
    with pytest.raises(ValueError, match="must share one vocabulary"):
        Ensemble([pair[0].float(), other])
