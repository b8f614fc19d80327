"""Beam search: hand-checked pieces, a hand-built case, greedy and exhaustive-search oracles,
and cached = uncached decoding in every position mode."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from relmt.config import ModelConfig
from relmt.decode.beam import beam_search, can_stop, length_penalty, merge_finished, topk_candidates
from relmt.decode.greedy import greedy_decode
from relmt.model.transformer import build_model
from tests.test_incremental import MODES, batch, make

PAD, UNK, BOS, EOS = 0, 1, 2, 3
INF = float("-inf")


# --- the pieces, by hand ---------------------------------------------------------------------------

def test_length_penalty_by_hand():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)  # ((5 + 1) / 6)^a
    assert length_penalty(10, 0.6) == pytest.approx(2.5 ** 0.6)
    assert length_penalty(13.0, 1.0) == pytest.approx(3.0)
    assert length_penalty(40, 0.0) == 1.0
    torch.testing.assert_close(length_penalty(torch.tensor([1.0, 7.0]), 0.5), torch.tensor([1.0, 2.0 ** 0.5]))


def test_topk_candidates_by_hand():
    scores = torch.tensor([[[-1.0, -5.0, -0.5], [-2.0, -0.25, -9.0]]])  # 1 sentence, 2 beams, 3 tokens
    top, origin, token = topk_candidates(scores, k=3)
    assert top.tolist() == [[-0.25, -0.5, -1.0]]
    assert origin.tolist() == [[1, 0, 0]] and token.tolist() == [[1, 2, 0]]


def test_merge_finished_keeps_the_best_k():
    pool_scores = torch.tensor([[-1.0, INF]])
    pool_tokens = torch.tensor([[[7, 3], [0, 0]]])
    new_scores = torch.tensor([[INF, -0.5, -2.0]])
    new_tokens = torch.tensor([[[4, 3], [5, 3], [6, 3]]])
    scores, tokens = merge_finished(pool_scores, pool_tokens, new_scores, new_tokens)
    assert scores.tolist() == [[-0.5, -1.0]]
    assert tokens.tolist() == [[[5, 3], [7, 3]]]


def test_can_stop_by_hand():
    pool = torch.tensor([[-1.0, -2.0], [-1.0, INF]])
    alive = torch.tensor([[-2.5, -3.0], [-5.0, -6.0]])
    # alpha = 0: sentence 0's best live beam (-2.5) cannot beat its worst finished (-2.0); sentence 1's pool is not full
    assert can_stop(pool, alive, torch.tensor([10, 10]), 0.0).tolist() == [True, False]
    # alpha = 1, limit 7: the live beam could still reach -2.5 / 2 = -1.25 > -2.0
    assert can_stop(pool, alive, torch.tensor([7, 7]), 1.0).tolist() == [False, False]


# --- a hand-built case with a stub model (transitions depend on the last token) -----------------

class StubCache:
    def select(self, rows, sentences=None):
        return self


class StubModel:
    """p(next | last token): from BOS a .6 b .4; after a: a .55 EOS .45; after b: EOS .9 a .1."""

    pad_id = PAD
    A, B = 4, 5
    table = {BOS: {A: 0.6, B: 0.4}, A: {A: 0.55, EOS: 0.45}, B: {EOS: 0.9, A: 0.1}}

    def __init__(self):
        self.steps = 0

    def encode(self, src):
        return torch.zeros(src.shape[0], src.shape[1], 1), src != PAD

    def decode_step(self, tokens, memory, src_mask, cache, step):
        self.steps += 1
        logits = torch.full((tokens.shape[0], 6), INF)
        for row, tok in enumerate(tokens.tolist()):
            for nxt, p in self.table[tok].items():
                logits[row, nxt] = math.log(p)
        return logits, StubCache()


def test_hand_built_beam_finds_what_greedy_misses():
    src = torch.tensor([[7, EOS]])
    model = StubModel()
    # greedy: a (.6), a (.55), a (.55), then the 3-step limit: "a a a"
    assert greedy_decode(model, src, BOS, EOS, max_len_a=0, max_len_b=3) == [[4, 4, 4]]
    # beam 2: "b EOS" (.4 x .9 = .36) finishes at step 2; "a a a" (.1815) is forced at the limit
    (hyps,) = beam_search(model, src, beam=2, bos_id=BOS, eos_id=EOS, lenpen=0.0, max_len_a=0, max_len_b=3, nbest=2)
    assert [h.tokens for h in hyps] == [[5], [4, 4, 4]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.6 * 0.55 * 0.55)])
    # alpha = 0.6 divides by ((5 + |y|) / 6)^0.6 with |y| counting EOS: 2 for "b EOS", 3 for "a a a"
    (hyps,) = beam_search(model, src, beam=2, bos_id=BOS, eos_id=EOS, lenpen=0.6, max_len_a=0, max_len_b=3, nbest=2)
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36) / (7 / 6) ** 0.6,
                                                     math.log(0.1815) / (8 / 6) ** 0.6])


def test_stopping_rules_by_hand():
    """Beam 2, limit 5. After step 2 the pool holds "b EOS" (.36) and "a a EOS" (.1485): early_stop
    ends there (3 steps). Otherwise the live "a a a" (.1815) could still win, so step 3 runs; then the
    best live "a a a a" (.0998) cannot, and the search ends (4 steps)."""
    src = torch.tensor([[7, EOS]])
    kw = dict(beam=2, bos_id=BOS, eos_id=EOS, lenpen=0.0, max_len_a=0, max_len_b=5, nbest=2)
    early, patient = StubModel(), StubModel()
    (a,) = beam_search(early, src, early_stop=True, **kw)
    (b,) = beam_search(patient, src, early_stop=False, **kw)
    assert (early.steps, patient.steps) == (3, 4)
    assert [h.tokens for h in a] == [h.tokens for h in b] == [[5], [4, 4]]


# --- oracles on real (untrained) models --------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lenpen,early_stop", [(0.0, False), (0.6, True), (1.0, True)])
def test_beam_one_is_greedy(mode, lenpen, early_stop, float64):
    model = make(mode)
    src, _ = batch()
    greedy = greedy_decode(model, src, BOS, EOS, max_len_a=0.5, max_len_b=6)
    beams = beam_search(model, src, beam=1, bos_id=BOS, eos_id=EOS, lenpen=lenpen, max_len_a=0.5, max_len_b=6,
                        early_stop=early_stop)
    assert [h[0].tokens for h in beams] == greedy


def exhaustive_best(model, src, length: int, alpha: float, top: int):
    """Every output of at most `length` steps, scored as the beam search scores finished ones."""
    memory, src_mask = model.encode(src)
    words = [t for t in range(model.tgt_embed.num_embeddings) if t not in (PAD, BOS, EOS)]
    scored = []
    for n in range(length):
        for prefix in itertools.product(words, repeat=n):
            tgt = torch.tensor([[BOS, *prefix]])
            lp = torch.log_softmax(model.decode(tgt, memory, src_mask)[0].double(), dim=-1)
            lp[:, [PAD, BOS]] = INF  # never produced, as in the search (which does not renormalise)
            logp = sum(lp[i, tok].item() for i, tok in enumerate(prefix))
            scored.append(((logp + lp[n, EOS].item()) / length_penalty(n + 1, alpha), list(prefix)))
            if n == length - 1:  # the limit: a non-EOS last token finishes as it stands
                scored += [((logp + lp[n, w].item()) / length_penalty(length, alpha), [*prefix, w]) for w in words]
    return sorted(scored, key=lambda s: -s[0])[:top]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_wide_beam_equals_exhaustive_search(alpha, float64):
    torch.manual_seed(7)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, max_relative_position=2)
    model = build_model(cfg, vocab_size=7, pad_id=PAD).eval()  # words: UNK, 4, 5, 6
    src = torch.tensor([[4, 5, 6, EOS]])
    with torch.no_grad():
        expected = exhaustive_best(model, src, length=4, alpha=alpha, top=3)
    (hyps,) = beam_search(model, src, beam=400, bos_id=BOS, eos_id=EOS, lenpen=alpha, max_len_a=0, max_len_b=4, nbest=3)
    assert [h.tokens for h in hyps] == [toks for _, toks in expected]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected], abs=1e-6)


@pytest.mark.parametrize("mode", list(MODES))
def test_cached_and_uncached_beam_search_agree(mode, float64):
    model = make(mode)
    src, _ = batch()
    kw = dict(beam=3, bos_id=BOS, eos_id=EOS, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=3)
    cached = beam_search(model, src, use_cache=True, **kw)
    uncached = beam_search(model, src, use_cache=False, **kw)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for a, b in zip(cached, uncached):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-9)


def test_nbest_is_sorted_and_min_len_forces_length(float64):
    model = make("rel")
    src, _ = batch()
    hyps = beam_search(model, src, beam=4, bos_id=BOS, eos_id=EOS, lenpen=0.6, max_len_a=0, max_len_b=5, nbest=4,
                       min_len=5)
    for hs in hyps:
        assert len(hs) == 4
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
        assert all(len(h.tokens) == 5 for h in hs)
