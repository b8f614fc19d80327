"""Beam search: hand-checked pieces, a hand-built case, greedy and exhaustive-search oracles,
and cached = uncached decoding in every position mode."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from relmt.config import DecodeConfig, EosCandidates, ModelConfig
from relmt.decode import beam
from relmt.decode.beam import beam_search, can_stop, length_penalty, max_lengths, merge_finished, topk_candidates
from relmt.decode.greedy import greedy_decode
from relmt.decode.search import decode_sources, nbest_search
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
    # power: fairseq's --lenpen and CTranslate2's length_penalty, |y|^a
    assert length_penalty(10, 1.0, "power") == 10.0 and length_penalty(4, 0.5, "power") == 2.0
    assert length_penalty(40, 0.0, "power") == 1.0


def test_topk_candidates_by_hand():
    scores = torch.tensor([[[-1.0, -5.0, -0.5], [-2.0, -0.25, -9.0]]])  # 1 sentence, 2 beams, 3 tokens
    top, origin, token = topk_candidates(scores, k=3)
    assert top.tolist() == [[-0.25, -0.5, -1.0]]
    assert origin.tolist() == [[1, 0, 0]] and token.tolist() == [[1, 2, 0]]


@pytest.mark.parametrize("vocab", [7, 120, 128, 129, 1000, 8000])
@pytest.mark.parametrize("beams", [1, 2, 4, 5])
def test_step_candidates_equal_the_plain_top_k_of_the_log_probabilities(vocab, beams):
    """The chunked search of step_candidates gives what log_softmax, the bans and one top-k over (B, K*V) give:
    the same tokens and beams, scores to float32 rounding; also with beams not yet alive (-inf, step 0), a
    vocabulary not a multiple of the chunk, and the best candidates crowded into one chunk."""
    torch.manual_seed(vocab * 10 + beams)
    b, k = 6, 2 * beams
    logits = torch.randn(b * beams, vocab) * 3
    logits[beams:2 * beams, :k] += 20  # sentence 1: every best candidate in its beams' first chunk
    alive = torch.randn(b, beams) - 2
    alive[2, 1:] = float("-inf")  # sentence 2: one live beam, as at step 0
    for banned in ([0, 2], [0, 2, 3]):
        lprobs = torch.log_softmax(logits, dim=-1)
        lprobs[:, banned] = float("-inf")
        want = topk_candidates(alive[:, :, None] + lprobs.view(b, beams, vocab), k)
        got = beam.step_candidates(logits.clone(), alive, torch.tensor(banned), k)
        finite = torch.isfinite(want[0])
        assert torch.equal(finite, torch.isfinite(got[0]))
        assert torch.equal(want[1][finite], got[1][finite]) and torch.equal(want[2][finite], got[2][finite])
        torch.testing.assert_close(got[0][finite], want[0][finite], rtol=0, atol=1e-5)
        assert not set(got[2][finite].tolist()) & set(banned)


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


# --- hand-built cases with a stub model (transitions depend on the last token) -------------------

class StubCache:
    def select(self, rows, sentences=None):
        return self


class StubModel:
    """p(next | last token) from a table; by default, from BOS a .6 b .4; after a: a .55 EOS .45;
    after b: EOS .9 a .1. A token without a row (only ever the last token of a beam scored -inf)
    is followed by EOS."""

    pad_id = PAD
    A, B = 4, 5
    TABLE = {BOS: {A: 0.6, B: 0.4}, A: {A: 0.55, EOS: 0.45}, B: {EOS: 0.9, A: 0.1}}

    def __init__(self, table: dict[int, dict[int, float]] | None = None):
        self.table = table or self.TABLE
        self.vocab = 1 + max(max(row) for row in self.table.values())
        self.steps = 0

    def encode(self, src):
        return torch.zeros(src.shape[0], src.shape[1], 1), src != PAD

    def decode_step(self, tokens, memory, src_mask, cache, step, out_weight=None):
        self.steps += 1
        logits = torch.full((tokens.shape[0], self.vocab), INF)
        for row, tok in enumerate(tokens.tolist()):
            for nxt, p in self.table.get(tok, {EOS: 1.0}).items():
                logits[row, nxt] = math.log(p)
        return logits, StubCache()


def test_hand_built_beam_finds_what_greedy_misses():
    """Beam 2, 3-step limit. Step 2's candidates are "b EOS" .36, "a a" .33, "a EOS" .27, "b a" .04.
    t2t finishes both EOS candidates; fairseq only "b EOS" (rank 0), dropping "a EOS" (rank 2 = K),
    so its second best is "a a a" (.1815), forced at the limit, below the dropped .27."""
    src = torch.tensor([[7, EOS]])
    model = StubModel()
    # greedy: a (.6), a (.55), a (.55), then the 3-step limit: "a a a"
    assert greedy_decode(model, src, BOS, EOS, max_len_a=0, max_len_b=3) == [[4, 4, 4]]
    kw = dict(beam=2, bos_id=BOS, eos_id=EOS, max_len_a=0, max_len_b=3, nbest=2)
    (hyps,) = beam_search(model, src, lenpen=0.0, **kw)
    assert [h.tokens for h in hyps] == [[5], [4]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.6 * 0.45)])
    (hyps,) = beam_search(model, src, lenpen=0.0, eos_candidates="fairseq", **kw)
    assert [h.tokens for h in hyps] == [[5], [4, 4, 4]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.6 * 0.55 * 0.55)])
    # alpha = 0.6 divides by ((5 + |y|) / 6)^0.6 with |y| counting EOS: 2 for "b EOS" and "a EOS", 3 for "a a a"
    (hyps,) = beam_search(model, src, lenpen=0.6, **kw)
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36) / (7 / 6) ** 0.6, math.log(0.27) / (7 / 6) ** 0.6])
    (hyps,) = beam_search(model, src, lenpen=0.6, eos_candidates="fairseq", **kw)
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36) / (7 / 6) ** 0.6,
                                                     math.log(0.1815) / (8 / 6) ** 0.6])


def test_t2t_finishes_an_eos_ranked_beyond_the_beam():
    """Issue 11.5, beam K = 2, alpha 0. Step 2's candidates, best first: "a c" .36, "b c" .28,
    "a EOS" .24, "b EOS" .12, so both EOS rank K..2K-1. Every continuation of "c" costs at least
    .6 more and ends two steps later: "a c d EOS" .144, "a c e EOS" .126. tensor2tensor (the paper's
    code) finishes "a EOS" at step 2 and returns it; the fairseq rule drops it and returns "a c d",
    scored below it."""
    a, b, c, d, e, f = 4, 5, 6, 7, 8, 9
    table = {BOS: {a: 0.6, b: 0.4}, a: {c: 0.6, EOS: 0.4}, b: {c: 0.7, EOS: 0.3},
             c: {d: 0.4, e: 0.35, f: 0.25}, d: {EOS: 1.0}, e: {EOS: 1.0}, f: {EOS: 1.0}}
    src = torch.tensor([[7, EOS]])
    kw = dict(beam=2, bos_id=BOS, eos_id=EOS, lenpen=0.0, max_len_a=0, max_len_b=6, nbest=2)
    (t2t,) = beam_search(StubModel(table), src, **kw)
    assert [h.tokens for h in t2t] == [[a], [a, c, d]]
    assert [h.score for h in t2t] == pytest.approx([math.log(0.24), math.log(0.144)])
    (fairseq,) = beam_search(StubModel(table), src, eos_candidates="fairseq", **kw)
    assert [h.tokens for h in fairseq] == [[a, c, d], [a, c, e]]
    assert [h.score for h in fairseq] == pytest.approx([math.log(0.144), math.log(0.126)])
    assert fairseq[0].score < t2t[0].score  # the fairseq rule returns a worse-scored hypothesis


def test_stopping_rules_by_hand():
    """Beam 2, limit 5, the default stub. fairseq: after step 2 the pool holds "b EOS" (.36) and
    "a a EOS" (.1485): early_stop ends there (3 steps). Otherwise the live "a a a" (.1815) could still
    win, so step 3 runs; then the best live "a a a a" (.0998) cannot, and the search ends (4 steps).
    t2t: the pool is full after step 2 ("b EOS" .36, "a EOS" .27), so early_stop ends there (2 steps);
    otherwise the live "a a" (.33) could still win, step 3 runs, and its best live "a a a" (.1815)
    cannot (3 steps)."""
    src = torch.tensor([[7, EOS]])
    kw = dict(beam=2, bos_id=BOS, eos_id=EOS, lenpen=0.0, max_len_a=0, max_len_b=5, nbest=2)
    for rule, steps, expected in (("fairseq", (3, 4), [[5], [4, 4]]), ("t2t", (2, 3), [[5], [4]])):
        early, patient = StubModel(), StubModel()
        (x,) = beam_search(early, src, early_stop=True, eos_candidates=rule, **kw)
        (y,) = beam_search(patient, src, early_stop=False, eos_candidates=rule, **kw)
        assert (early.steps, patient.steps) == steps, rule
        assert [h.tokens for h in x] == [h.tokens for h in y] == expected, rule


# --- oracles on real (untrained) models --------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lenpen,early_stop", [(0.0, False), (0.6, True), (1.0, True)])
def test_beam_one_is_greedy_under_the_fairseq_rule(mode, lenpen, early_stop, float64):
    """Only an EOS ranked first finishes, so the one live beam follows the argmax path; with alpha 0
    nothing after the first finished hypothesis can beat it, and early_stop stops there anyway."""
    model = make(mode)
    src, _ = batch()
    greedy = greedy_decode(model, src, BOS, EOS, max_len_a=0.5, max_len_b=6)
    beams = beam_search(model, src, beam=1, bos_id=BOS, eos_id=EOS, lenpen=lenpen, max_len_a=0.5, max_len_b=6,
                        early_stop=early_stop, eos_candidates="fairseq")
    assert [h[0].tokens for h in beams] == greedy


def t2t_beam_one(next_lprobs, limit: int, alpha: float, early_stop: bool) -> list[int]:
    """Beam 1 under t2t's rule, written out. next_lprobs(prefix) gives log P(next token | prefix), (V,).
    The live beam follows the best non-EOS token; at each step an EOS ranked first or second (of the
    2K = 2 candidates) finishes, and at the limit the live beam finishes as it stands. The best
    finished hypothesis wins; early_stop returns the first."""
    prefix, logp, best = [], 0.0, None
    for t in range(limit):
        lp = next_lprobs(prefix).double().clone()
        lp[[PAD, BOS]] = INF
        finished = []
        if EOS in lp.topk(2).indices.tolist():
            finished.append(((logp + lp[EOS].item()) / length_penalty(t + 1, alpha), prefix))
        lp[EOS] = INF
        nxt = int(lp.argmax())
        prefix, logp = [*prefix, nxt], logp + lp[nxt].item()
        if t + 1 == limit:
            finished.append((logp / length_penalty(t + 1, alpha), prefix))
        for score, tokens in finished:
            if best is None or score > best[0]:
                best = (score, tokens)
        if early_stop and best is not None:
            break
    return best[1]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lenpen,early_stop", [(0.0, False), (0.6, False), (0.6, True)])
def test_beam_one_under_the_t2t_rule(mode, lenpen, early_stop, float64):
    """With t2t's rule a beam of one is not greedy decoding (an EOS ranked second finishes too), so
    DecodeConfig.beam = 1 decodes greedily through `nbest_search`; the raw search matches its oracle."""
    model = make(mode)
    src, _ = batch()
    limit = max_lengths(src != PAD, 0.5, 6).tolist()
    beams = beam_search(model, src, beam=1, bos_id=BOS, eos_id=EOS, lenpen=lenpen, max_len_a=0.5, max_len_b=6,
                        early_stop=early_stop)

    def oracle(row: torch.Tensor, limit: int) -> list[int]:
        memory, src_mask = model.encode(row)
        return t2t_beam_one(lambda prefix: torch.log_softmax(
            model.decode(torch.tensor([[BOS, *prefix]]), memory, src_mask)[0, -1], dim=-1), limit, lenpen, early_stop)

    expected = [oracle(src[i:i + 1], limit[i]) for i in range(len(src))]
    assert [h[0].tokens for h in beams] == expected


def random_markov_table(seed: int, vocab: int = 8) -> dict[int, dict[int, float]]:
    """p(next | last token) drawn at random, PAD and BOS never next, EOS made likely."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * 2
    logits[:, EOS] += 1.5
    logits[:, [PAD, BOS]] = INF
    probs = torch.softmax(logits, dim=-1)
    return {tok: {nxt: probs[tok, nxt].item() for nxt in range(vocab) if nxt not in (PAD, BOS)}
            for tok in range(vocab) if tok != PAD}


@pytest.mark.parametrize("lenpen,early_stop", [(0.0, False), (0.6, False), (0.6, True)])
def test_beam_one_under_the_t2t_rule_on_random_markov_models(lenpen, early_stop, float64):
    """The same oracle on 30 random bigram models, where an EOS often ranks second: it differs from
    greedy on some of them (so the rule matters here), and the search agrees with it on all."""
    src = torch.tensor([[4, 5, EOS]])
    differs = 0
    for seed in range(30):
        model = StubModel(random_markov_table(seed))

        def lprobs(prefix: list[int], model: StubModel = model) -> torch.Tensor:
            return torch.log_softmax(model.decode_step(torch.tensor([prefix[-1] if prefix else BOS]),
                                                      None, None, None, 0)[0][0], dim=-1)

        (hyps,) = beam_search(model, src, beam=1, bos_id=BOS, eos_id=EOS, lenpen=lenpen, max_len_a=0, max_len_b=6,
                              early_stop=early_stop)
        expected = t2t_beam_one(lprobs, 6, lenpen, early_stop)
        assert hyps[0].tokens == expected, seed
        differs += expected != greedy_decode(model, src, BOS, EOS, max_len_a=0, max_len_b=6)[0]
    assert differs > 0


@pytest.mark.parametrize("mode", list(MODES))
def test_decode_config_beam_one_is_greedy(mode, float64):
    """Beam 1 in a DecodeConfig is greedy decoding whatever eos_candidates says, with or without
    alpha and min_len: on a batch (nbest_search) and through the front-end that validation and
    relmt-translate share (decode_sources, which takes the sources without EOS)."""
    model = make(mode)
    src, _ = batch()
    sources = [row[(row != PAD) & (row != EOS)].tolist() for row in src]
    for min_len in (0, 3):
        greedy = greedy_decode(model, src, BOS, EOS, max_len_a=0.5, max_len_b=6, min_len=min_len)
        for rule in EosCandidates:
            cfg = DecodeConfig(beam=1, lenpen=0.6, max_len_a=0.5, max_len_b=6, eos_candidates=rule, min_len=min_len)
            assert [h[0].tokens for h in nbest_search(model, src, cfg)] == greedy
            hyps = decode_sources(model, sources, cfg, torch.device("cpu"))
            assert [h[0].tokens for h in hyps] == greedy


def exhaustive_best(model, src, length: int, alpha: float, top: int, norm: str = "gnmt"):
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
            scored.append(((logp + lp[n, EOS].item()) / length_penalty(n + 1, alpha, norm), list(prefix)))
            if n == length - 1:  # the limit: a non-EOS last token finishes as it stands
                scored += [((logp + lp[n, w].item()) / length_penalty(length, alpha, norm), [*prefix, w])
                           for w in words]
    return sorted(scored, key=lambda s: -s[0])[:top]


@pytest.mark.parametrize("alpha,norm", [(0.0, "gnmt"), (0.6, "gnmt"), (1.5, "gnmt"), (0.6, "power"), (1.0, "power")])
def test_wide_beam_equals_exhaustive_search(alpha, norm, float64):
    torch.manual_seed(7)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, max_relative_position=2)
    model = build_model(cfg, vocab_size=7, pad_id=PAD).eval()  # words: UNK, 4, 5, 6
    src = torch.tensor([[4, 5, 6, EOS]])
    with torch.no_grad():
        expected = exhaustive_best(model, src, length=4, alpha=alpha, top=3, norm=norm)
    (hyps,) = beam_search(model, src, beam=400, bos_id=BOS, eos_id=EOS, lenpen=alpha, max_len_a=0, max_len_b=4, nbest=3,
                          length_norm=norm)
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
