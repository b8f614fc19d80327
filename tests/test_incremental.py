"""Cached, step-by-step decoding equals the full teacher-forced pass, in every position mode.

The relative term at step t must use the distances j - t (Shaw §3.2 at decode time); a cache that
loses t gives every distance 0 (HF transformers #19045). These tests would catch that.
"""

from __future__ import annotations

import pytest
import torch

from relmt.config import ModelConfig, Norm, PosKind
from relmt.decode.greedy import greedy_decode
from relmt.model.transformer import build_model

pytestmark = pytest.mark.usefixtures("float64")
PAD, BOS, EOS, V = 0, 2, 3, 40

MODES = {
    "abs": dict(positions=PosKind.abs),
    "rel": dict(positions=PosKind.rel, max_relative_position=2),
    "both": dict(positions=PosKind.both, max_relative_position=2),
    "none": dict(positions=PosKind.none),
    "rel-keys-only": dict(positions=PosKind.rel, max_relative_position=1, relative_values=False),
    "rel-values-only": dict(positions=PosKind.rel, max_relative_position=3, relative_keys=False),
    "rel-shared-heads": dict(positions=PosKind.rel, max_relative_position=2, relative_share_heads=True),
    "rel-k0": dict(positions=PosKind.rel, max_relative_position=0),
    "rel-post-norm": dict(positions=PosKind.rel, max_relative_position=2, norm=Norm.post),
    "rope": dict(positions=PosKind.rope),
    "alibi": dict(positions=PosKind.alibi),
    "t5": dict(positions=PosKind.t5),
    "t5-post-norm": dict(positions=PosKind.t5, norm=Norm.post),
}


def make(mode: str):
    torch.manual_seed(sum(map(ord, mode)))
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2,
                      **MODES[mode])
    return build_model(cfg, V, PAD).eval()


def batch():
    src = torch.tensor([[5, 9, 12, 7, 30, EOS], [8, 11, EOS, PAD, PAD, PAD], [6, 6, 6, 6, EOS, PAD]])
    tgt = torch.tensor([[BOS, 6, 7, 11, 4, 20, 21, 9, 10],
                        [BOS, 13, 14, PAD, PAD, PAD, PAD, PAD, PAD],
                        [BOS, 4, 4, 17, 18, 19, 25, PAD, PAD]])
    return src, tgt


def run_steps(model, tgt, memory, src_mask, cache, start, stop):
    """Decode positions start..stop-1 and compare each step's logits to the full pass."""
    full = model.decode(tgt, memory, src_mask)  # (B, T, V)
    for t in range(start, stop):
        logits, cache = model.decode_step(tgt[:, t], memory, src_mask, cache, step=t)
        real = tgt[:, t] != PAD
        torch.testing.assert_close(logits[real], full[real, t], rtol=1e-9, atol=1e-9)
    return cache


@pytest.mark.parametrize("mode", list(MODES))
def test_cached_decoding_equals_full_pass(mode):
    model = make(mode)
    src, tgt = batch()
    memory, src_mask = model.encode(src)
    run_steps(model, tgt, memory, src_mask, None, 0, tgt.shape[1])


@pytest.mark.parametrize("mode", list(MODES))
def test_cached_decoding_after_select(mode):
    """Reordering (and repeating) rows mid-sentence, as beam search does, keeps the parity."""
    model = make(mode)
    src, tgt = batch()
    memory, src_mask = model.encode(src)
    cache = run_steps(model, tgt, memory, src_mask, None, 0, 4)
    order = torch.tensor([2, 0, 0, 1])
    cache = cache.select(order, order)
    assert cache.length == 4 and cache.batch_size == 4
    run_steps(model, tgt[order], memory[order], src_mask[order], cache, 4, tgt.shape[1])


@pytest.mark.parametrize("mode", list(MODES))
def test_hypotheses_share_their_sentence_memory(mode):
    """K hypotheses per sentence against one copy of its memory (as beam search decodes) give
    what the same rows give against the memory repeated K times, cached and full, and after the
    hypotheses are reordered within their sentences."""
    model = make(mode)
    src, tgt = batch()
    memory, src_mask = model.encode(src)
    k = 3
    hyp_tgt = tgt.repeat_interleave(k, 0)
    hyp_tgt[1::k, 2:] = torch.roll(hyp_tgt[1::k, 2:], 1, dims=1)  # beams of a sentence differ
    hyp_tgt = hyp_tgt.masked_fill(tgt.repeat_interleave(k, 0) == PAD, PAD)
    rep_memory, rep_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)
    full = model.decode(hyp_tgt, rep_memory, rep_mask)
    torch.testing.assert_close(model.decode(hyp_tgt, memory, src_mask), full, rtol=1e-12, atol=1e-12)
    cache = run_steps(model, hyp_tgt, memory, src_mask, None, 0, 3)
    rows = torch.arange(len(hyp_tgt)).view(-1, k).flip(1).reshape(-1)  # reverse each sentence's beams
    run_steps(model, hyp_tgt[rows], memory, src_mask, cache.select(rows), 3, tgt.shape[1])
    with pytest.raises(ValueError, match="hypotheses for"):
        model.decode_step(hyp_tgt[:-1, 0], memory, src_mask, None, step=0)


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_cached_equals_uncached(mode):
    model = make(mode)
    src, _ = batch()
    cached = greedy_decode(model, src, BOS, EOS, max_len_a=0.0, max_len_b=12, use_cache=True)
    uncached = greedy_decode(model, src, BOS, EOS, max_len_a=0.0, max_len_b=12, use_cache=False)
    assert cached == uncached
    assert all(len(out) <= 12 for out in cached)


def test_decode_step_rejects_a_cache_of_the_wrong_length():
    model = make("rel")
    src, tgt = batch()
    memory, src_mask = model.encode(src)
    _, cache = model.decode_step(tgt[:, 0], memory, src_mask, None, step=0)
    with pytest.raises(ValueError, match="step=2"):
        model.decode_step(tgt[:, 1], memory, src_mask, cache, step=2)


def test_greedy_respects_per_sentence_max_length():
    model = make("abs")
    src, _ = batch()
    out = greedy_decode(model, src, BOS, EOS, max_len_a=1.0, max_len_b=0)
    src_lens = (src != PAD).sum(1).tolist()
    assert all(len(o) <= n for o, n in zip(out, src_lens))
