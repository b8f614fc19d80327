"""Batched beam search over the explicit decoder cache, built from small pure pieces.

Shaw et al. §4.1 decode with beam 4 and the GNMT length penalty lp(|y|) = ((5 + |y|) / 6)^alpha,
alpha = 0.6: a finished hypothesis y (|y| counts its tokens including EOS) scores log P(y) / lp(|y|).

Each step, per sentence: extend the K live beams by every token and take the 2K best candidates by
log-probability (`step_candidates`). Which EOS candidates finish is `eos_candidates`:
- t2t (the default): every EOS among the 2K, as tensor2tensor's beam_search.py, the code the paper
  was run with, does (its grow_finished takes all EOS of the 2K top candidates);
- fairseq: only an EOS ranked among the first K; one ranked K..2K-1 is dropped, though its score may
  beat everything the search later finishes (tests/test_beam.py pins such a case).
Either way the first K non-EOS candidates stay live (a beam has one EOS candidate, so at least K of
the 2K are not EOS, and K live beams survive however many finish). Each sentence keeps a pool of
its K best finished hypotheses (`merge_finished`). A sentence is done when its pool is full and no
live beam can still beat the pool's worst (`can_stop`, tensor2tensor's `_is_finished`: since
log-probabilities only fall, a live beam's best reachable score is its log P / lp(max length)), or
at once with `early_stop`, or at its step limit max_len = floor(a * |x| + b), where the live beams
finish as they stand (t2t: the K kept live; fairseq: the first K candidates). Finished sentences
leave the batch. No Python loop runs over sentences or beams.

With beam 1 and fairseq, and alpha = 0 or early_stop, this is exactly greedy decoding. With beam 1
and t2t it is not: the live beam follows the best non-EOS token while an EOS ranked second still
finishes, so it returns the best of those and of the path at the limit (tests/test_beam.py has
that oracle too). `DecodeConfig.beam = 1` therefore means greedy decoding whatever eos_candidates
says (relmt.decode.search.nbest_search).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from relmt.config import EosCandidates, LengthNorm
from relmt.decode import constraints as forcing
from relmt.decode.constraints import Forced, make_forced
from relmt.decode.ensemble import Ensemble
from relmt.model.transformer import Transformer


def max_lengths(src_mask: Tensor, a: float, b: int) -> Tensor:
    """Per-sentence step limit floor(a * |x| + b), (B,) int64, from the source keep-mask (B, S)
    (tensor2tensor decodes up to input length + 50: a = 1, b = 50)."""
    # clamped before the cast: a float past int64's range casts to an arbitrary (negative) integer
    return (a * src_mask.sum(dim=1).to(torch.float64) + b).floor().clamp(1, 2.0 ** 31).long()


def length_penalty(length: Tensor | float, alpha: float | Tensor, norm: LengthNorm | str | Tensor = LengthNorm.gnmt,
                   ) -> Tensor | float:
    """What a hypothesis's log-probability is divided by (|y| counts its EOS): GNMT (Wu et al. 2016, eq. 14)
    ((5 + |y|) / 6)^alpha, or |y|^alpha (`power`: fairseq's --lenpen, CTranslate2, Marian)."""
    if isinstance(norm, Tensor):  # a compiled search step's input (`Rules.norm`): True for power
        return torch.where(norm, length ** alpha, ((5.0 + length) / 6.0) ** alpha)
    if LengthNorm(norm) == LengthNorm.power:
        return length ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def topk_candidates(scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """scores: (B, K, V) candidate log-probabilities. Returns the k best per sentence as
    (scores (B, k), origin beam (B, k), token (B, k)), best first: the plain form of `step_candidates`."""
    b, beams, vocab = scores.shape
    top, flat = scores.view(b, beams * vocab).topk(k, dim=1)
    return top, torch.div(flat, vocab, rounding_mode="floor"), flat % vocab


CHUNK = 64  # tokens per chunk in step_candidates' first pass


def step_candidates(logits: Tensor, alive: Tensor, banned: Tensor, k: int, row_ban: tuple[Tensor, int] | None = None,
                    lse: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The k best one-token extensions of each sentence's live beams, as topk_candidates(alive[:, :, None] +
    log_softmax(logits) with the `banned` tokens at -inf, k) returns them, without writing out the (B, K, V)
    scores: logits (B*K, V) float (may be overwritten: the banned tokens become -inf), alive (B, K)
    log-probabilities; row_ban: (rows (B*K,) bool, token), a token banned in those rows alone; lse: the rows'
    logsumexp where the caller has it (constrained decoding needs it too).

    log_softmax shifts each row by a constant (its log-normaliser, taken before the bans, as the model's
    distribution), so a row's order is its logits' order. The vocabulary is cut into chunks of CHUNK tokens,
    and a sentence's k best candidates lie in its k chunks with the highest shifted maxima (a candidate outside
    them is beaten by the maxima of k chunks, which are k other candidates): one vectorised max over the
    logits and a top-k over (K*V/CHUNK) chunk maxima and k*CHUNK tokens replace a top-k over K*V scores, the
    slowest operation of a CPU step (about half of the search's time at 32 sentences, beam 4, 8,000 tokens)."""
    logits = logits.contiguous()  # a slice of the full pass's output without the cache
    rows, vocab = logits.shape
    b, beams = alive.shape
    shift = alive.reshape(-1) - (torch.logsumexp(logits, dim=1) if lse is None else lse)  # (B*K,): log P - log Z
    logits.index_fill_(1, banned, float("-inf"))
    if row_ban is not None:  # (B*K,) rows and the token banned in them alone (EOS before min_len, per sentence)
        logits[:, row_ban[1]].masked_fill_(row_ban[0], float("-inf"))
    size = CHUNK if vocab >= 2 * CHUNK else 1  # small vocabularies: one token per chunk
    whole = vocab // size * size
    maxima = logits[:, :whole].view(rows, -1, size).amax(dim=2)
    if whole < vocab:  # the last, shorter chunk
        maxima = torch.cat((maxima, logits[:, whole:].amax(dim=1, keepdim=True)), dim=1)
    per_row = maxima.shape[1]
    chunk = (maxima + shift[:, None]).view(b, beams * per_row).topk(k, dim=1).indices  # (B, k), best chunks
    origin = torch.div(chunk, per_row, rounding_mode="floor")  # (B, k) beam of each chosen chunk
    row = torch.arange(b, device=logits.device)[:, None] * beams + origin  # (B, k) its row of logits
    token = ((chunk % per_row) * size)[:, :, None] + torch.arange(size, device=logits.device)  # (B, k, size)
    scores = logits.view(-1)[row[:, :, None] * vocab + token.clamp(max=vocab - 1)]
    scores = scores.masked_fill_(token >= vocab, float("-inf")) + shift[row][:, :, None]
    top, best = scores.view(b, k * size).topk(k, dim=1)
    return top, origin.gather(1, torch.div(best, size, rounding_mode="floor")), token.view(b, -1).gather(1, best)


def merge_finished(pool_scores: Tensor, pool_tokens: Tensor, new_scores: Tensor, new_tokens: Tensor,
                   unmet: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, ...]:
    """Keep each sentence's K best finished hypotheses. pool: (B, K) scores and (B, K, L) tokens;
    new: (B, N) scores (-inf where not finished) and (B, N, L) tokens. Returns the new pool. unmet: the
    constraints each pool and new hypothesis misses ((B, K), (B, N); relmt/decode/constraints.py), ranked before
    the score (fewer first) and returned as the pool's third tensor."""
    k = pool_scores.shape[1]
    scores = torch.cat((pool_scores, new_scores), dim=1)
    tokens = torch.cat((pool_tokens, new_tokens), dim=1)
    missed = torch.cat(unmet, dim=1) if unmet is not None else None
    key = scores if missed is None else scores.double() - 1e6 * missed  # float64: exact for these sizes
    best, idx = key.topk(k, dim=1)
    pool = scores.gather(1, idx) if missed is not None else best, tokens.gather(1, idx[:, :, None].expand(
        -1, -1, tokens.shape[2]))
    return pool if missed is None else (*pool, missed.gather(1, idx))


def can_stop(pool_scores: Tensor, alive_scores: Tensor, limit: Tensor, alpha: float | Tensor,
             norm: LengthNorm | str | Tensor = LengthNorm.gnmt) -> Tensor:
    """(B,) True where the pool is full and no live beam can beat its worst hypothesis (both penalties grow
    with the length, so a live score divided by the penalty at the step limit is the best it can reach)."""
    full = torch.isfinite(pool_scores).all(dim=1)
    best_reachable = alive_scores.max(dim=1).values / length_penalty(limit.to(alive_scores.dtype), alpha, norm)
    return full & (best_reachable <= pool_scores.min(dim=1).values)


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # output ids without BOS/EOS
    score: float  # log P(y) / lp(|y|)
    unmet: int = 0  # constraints it misses: only where its step limit left no room (relmt/decode/constraints.py)
    eos: bool = True  # whether it ended with EOS (False: cut at its step limit; its score has no EOS term)


def pick(flag: bool | Tensor, yes, no) -> Tensor:
    """yes() where `flag` holds, else no(): a Python bool calls one of them; a bool tensor (a setting given to a
    compiled search step as an input, relmt/export/graphs.py) calls both and selects elementwise."""
    if isinstance(flag, Tensor):
        return torch.where(flag, yes(), no())
    return yes() if flag else no()


def live_and_finishing(cand: Tensor, token: Tensor, last: Tensor, eos_id: int, t2t: bool | Tensor,
                       ) -> tuple[Tensor, Tensor]:
    """Of each sentence's 2K candidates (scores cand and tokens token, (B, 2K), best first), the K that stay live,
    keep (B, K): the first K non-EOS (EOS sorted after every other candidate, stably); and those that finish now,
    (B, 2K) bool. t2t: an EOS anywhere among the 2K, and at the step limit (last, (B, 1)) the K kept live. fairseq:
    an EOS among the first K, and at the limit any of the first K. A candidate at -inf never finishes."""
    k = cand.shape[1] // 2
    rank = torch.arange(2 * k, device=cand.device)
    is_eos = token == eos_id
    # the keys are distinct, so the K smallest in order are the stable sort's first K, in one small kernel where a
    # compiled step ran a stable sort of all 2K (docs/results/engines/step_profile.md)
    keep = (is_eos.int() * 2 * k + rank).topk(k, dim=1, largest=False).indices
    finishing = pick(t2t, lambda: is_eos | (last & torch.zeros_like(is_eos).scatter_(1, keep, True)),
                     lambda: (is_eos | last) & (rank < k))
    return keep, finishing & torch.isfinite(cand)


def finished_hypotheses(scores: Tensor, tokens: Tensor, drop: tuple[int, ...], unmet: Tensor | None = None,
                        ) -> list[list[Hypothesis]]:
    """Each sentence's pool (scores (n, K), tokens (n, K, L), the constraints each misses (n, K)) as hypotheses,
    best first, without the empty slots (-inf) and the `drop` ids (EOS first, padding). Where a sentence has a
    hypothesis holding every constraint, those that miss one (cut at the step limit) are dropped."""
    missed = unmet.tolist() if unmet is not None else [[0] * scores.shape[1]] * scores.shape[0]
    out = [[Hypothesis([x for x in seq if x not in drop], sc, u, drop[0] in seq)
            for sc, seq, u in zip(row_scores, row_tokens, row_u) if sc != float("-inf")]
           for row_scores, row_tokens, row_u in zip(scores.tolist(), tokens.tolist(), missed)]
    return [[h for h in hs if not h.unmet] if any(not h.unmet for h in hs) else hs for hs in out]


@dataclass(frozen=True)
class Rules:
    """The settings a search step reads. Python values in beam_search; in a compiled search step
    (relmt/export/graphs.py) the ids are constants of the graph and the others 0-d tensors, its inputs, so
    that one graph serves every setting (`pick` and length_penalty select by a tensor flag)."""

    eos_id: int
    banned: Tensor  # ids never chosen (padding, BOS); EOS neither before min_len
    min_len: int | Tensor
    lenpen: float | Tensor
    norm: LengthNorm | str | Tensor  # the length normalisation; as a tensor: True for power
    t2t: bool | Tensor  # which EOS candidates finish (EosCandidates)
    early_stop: bool | Tensor


@dataclass(frozen=True)
class Beams:
    """The search between two steps, for m sentences of K beams at step t: an explicit value that a step takes
    and returns. Finished sentences leave it (`keep`)."""

    tokens: Tensor  # (m*K, 1 + t): BOS and each live beam's outputs
    alive: Tensor  # (m, K) the live beams' log-probabilities
    pool_scores: Tensor  # (m, K) the finished hypotheses' normalised scores, -inf for an empty slot
    pool_tokens: Tensor  # (m, K, t) their tokens, padded
    limit: Tensor  # (m,) each sentence's step limit
    forced: Forced | None = None  # prefixes and constraints (relmt/decode/constraints.py), None: none

    def keep(self, sentences: Tensor) -> Beams:
        """The beams of the sentences where `sentences` (m,) bool holds."""
        k = self.alive.shape[1]
        return Beams(self.tokens[sentences.repeat_interleave(k)], self.alive[sentences], self.pool_scores[sentences],
                     self.pool_tokens[sentences], self.limit[sentences],
                     self.forced.keep(sentences) if self.forced is not None else None)


def beam_step(logits: Tensor, beams: Beams, rules: Rules, pad_id: int, steps: Tensor | None = None,
              ) -> tuple[Beams, Tensor, Tensor]:
    """One step of the search (see the module's docstring) from the logits (m*K, V) of the beams' next token.
    Returns the beams after it, the row of the step's hypotheses each new live beam continues ((m*K,), for
    cache.select), and which sentences are done ((m,) bool). With `beams.forced`, prefixes and constraints
    shape the candidates (relmt/decode/constraints.py); without, the step is exactly the plain one.

    steps: (m,) the steps each sentence has taken, where sentences joined the search at different slots
    (continuous batching, relmt/decode/continuous.py: a sentence's tokens then hold padding before its BOS); None:
    every sentence began with the search, at t = the tokens' width - 1. The EOS ban before min_len, the step limit
    and the length penalty read each sentence's own count, so a sentence gets the step it gets alone."""
    m, k = beams.alive.shape
    t = beams.tokens.shape[1] - 1
    f = beams.forced
    if steps is not None and f is not None:
        raise ValueError("beam_step: prefixes and constraints are decoded from a common start (steps=None)")
    own = t if steps is None else steps  # each sentence's step count: an int (symbolic in a graph) or (m,)
    early = own < rules.min_len  # a bool; a tensor on the device in a compiled step (min_len an input) or with steps
    # EOS banned in every row before min_len: filled on the logits' device (a CPU mask fails on CUDA)
    eos_early = early.reshape(-1, 1).expand(m, k).reshape(m * k) if isinstance(early, Tensor) else torch.full(
        (m * k,), early, dtype=torch.bool, device=logits.device)
    logits, alive, lse = logits.float(), beams.alive, None
    if f is not None:
        logits = logits.contiguous()
        if f.constrained:
            eos_early = eos_early | ~forcing.all_met(f, f.progress)  # no EOS while a constraint is missing
            lse = torch.logsumexp(logits, dim=1)  # once, for the extra candidates and the 2K best
            extra = forcing.extra_candidates(logits, alive, f, rules.banned, rules.eos_id, t, lse)
        if forcing.inside_prefix(f, t).any():
            alive, lse = forcing.force_prefix(logits, alive, f, t), None  # the masked rows' own normaliser
    cand, origin, token = step_candidates(logits, alive, rules.banned, 2 * k, (eos_early, rules.eos_id), lse)
    last = (own + 1 >= beams.limit)[:, None]
    keep, finishing = live_and_finishing(cand, token, last, rules.eos_id, rules.t2t)
    if f is not None and f.constrained:
        cand, origin, token, progress, keep, finishing, unmet = forcing.select(
            f, (cand, origin, token), extra, last, rules.eos_id, logits.shape[1], (keep, finishing))
    n = cand.shape[1]  # 2K candidates, and with constraints the extra ones
    rows = torch.arange(m, device=cand.device)[:, None] * k + origin  # (m, N) rows of `tokens`
    seqs = torch.cat((beams.tokens[rows.view(-1), 1:].view(m, n, t), token[:, :, None]), dim=2)
    if steps is None:
        normalised = cand / length_penalty(t + 1, rules.lenpen, rules.norm)  # t + 1: an int, or symbolic in a graph
    else:  # each sentence's penalty, in float64 and then in the scores' precision, as the int's above
        normalised = cand / length_penalty((steps + 1).double(), rules.lenpen, rules.norm).to(cand.dtype)[:, None]
    pool_tokens = torch.cat((beams.pool_tokens, beams.pool_tokens.new_full((m, k, 1), pad_id)), dim=2)
    if f is not None and f.constrained:
        pool_scores, pool_tokens, pool_unmet = merge_finished(
            beams.pool_scores, pool_tokens, normalised.masked_fill(~finishing, float("-inf")), seqs,
            (f.pool_unmet, unmet))
        f = replace(f, progress=progress.gather(1, keep[:, :, None].expand(-1, -1, progress.shape[2])).view(m * k, -1),
                    pool_unmet=pool_unmet)
    else:
        pool_scores, pool_tokens = merge_finished(beams.pool_scores, pool_tokens,
                                                  normalised.masked_fill(~finishing, float("-inf")), seqs)
    alive = cand.gather(1, keep)
    rows = rows.gather(1, keep).view(-1)
    tokens = torch.cat((beams.tokens[rows], token.gather(1, keep).view(-1, 1)), dim=1)
    done = last[:, 0] | pick(rules.early_stop, lambda: torch.isfinite(pool_scores).all(1),
                             lambda: can_stop(pool_scores, alive, beams.limit, rules.lenpen, rules.norm))
    return Beams(tokens, alive, pool_scores, pool_tokens, beams.limit, f), rows, done


@torch.no_grad()
def beam_search(model: Transformer | Ensemble, src: Tensor, beam: int, bos_id: int, eos_id: int, lenpen: float = 0.6,
                max_len_a: float = 1.0, max_len_b: int = 50, nbest: int = 1, early_stop: bool = False,
                min_len: int = 0, use_cache: bool = True, eos_candidates: EosCandidates | str = EosCandidates.t2t,
                out_weight: Tensor | tuple | None = None, length_norm: LengthNorm | str = LengthNorm.gnmt,
                prefixes: Sequence[Sequence[int]] | None = None,
                constraints: Sequence[Sequence[Sequence[int]]] | None = None, ordered: bool = False,
                stop: Callable[[], bool] | None = None) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses of each source row of src (B, S), best first, ranked by log-probability
    over length_penalty(|y|, lenpen, length_norm). `out_weight` is
    the output weight padded with zero rows for a faster CPU GEMM (relmt.decode.search.output_weight),
    handed to every cached step; None: the tied embedding itself. An `Ensemble` decodes through the
    same code: its memory, cache and output weights hold one entry per model. A model that `searches`
    with these rules (an engine whose compiled step includes `beam_step`, relmt/export/graphs.py) runs the
    step and beam_step in one call of its `search_step`, and one with a compiled loop of those steps runs a search
    that it `loops` (a sentence, a short step limit) in one call of its `whole_search` (relmt/export/aoti_loop.py).

    prefixes[i]: the ids row i's output begins with; constraints[i]: id sequences its output must contain, in
    that order if `ordered` (relmt/decode/constraints.py). Without either the search is the plain one. `stop`, asked
    before each step: True ends the search there, the unfinished sentences without hypotheses (relmt-serve: every
    client of the batch left; asked once where the search is one call)."""
    k, pad_id = beam, model.pad_id
    rules = Rules(eos_id, torch.tensor([pad_id, bos_id], device=src.device), min_len, lenpen, length_norm,
                  EosCandidates(eos_candidates) == EosCandidates.t2t, early_stop)
    memory, src_mask = model.encode(src)
    n = src.shape[0]  # memory stays (n, S, d): the decoder shares it among a sentence's K beams
    alive = torch.full((n, k), float("-inf"), device=src.device)
    alive[:, 0] = 0.0  # one live beam to start, so that the first step does not repeat it K times
    forced = make_forced(prefixes, constraints, ordered, n, k, src.device)
    limit = max_lengths(src_mask, max_len_a, max_len_b)
    if forced is not None:  # room for the prefix, every constraint token and EOS
        limit = torch.maximum(limit, forced.needed())
    beams = Beams(src.new_full((n * k, 1), bos_id), alive, torch.full((n, k), float("-inf"), device=src.device),
                  src.new_empty((n, k, 0)), limit, forced)
    fused = use_cache and out_weight is None and getattr(model, "searches", None) is not None and \
        forced is None and model.searches(rules)
    if fused and model.loops(n * k, int(limit.max())):  # the whole search in one compiled call (issue 76 §1),
        if stop is not None and stop():  # `stop` asked once, before it
            return [[] for _ in range(n)]
        pool_scores, pool_tokens = model.whole_search(memory, src_mask, k, limit, rules)
        return [hyps[:nbest] for hyps in finished_hypotheses(pool_scores, pool_tokens, (eos_id, pad_id))]
    sentence = torch.arange(n, device=src.device)  # original index of each remaining sentence
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    cache = None
    for t in range(int(beams.limit.max())):
        if stop is not None and stop():
            break
        if fused:
            beams, done, cache = model.search_step(beams, memory, src_mask, cache, rules)
        else:
            if use_cache:
                logits, cache = model.decode_step(beams.tokens[:, -1], memory, src_mask, cache, step=t,
                                                  out_weight=out_weight)
            else:
                logits = model.decode(beams.tokens, memory, src_mask)[:, -1]
            beams, rows, done = beam_step(logits, beams, rules, pad_id)
            if use_cache:
                cache = cache.select(rows)
        if done.any():
            unmet = beams.forced.pool_unmet[done] if beams.forced is not None else None
            for i, hyps in zip(sentence[done].tolist(), finished_hypotheses(
                    beams.pool_scores[done], beams.pool_tokens[done], (eos_id, pad_id), unmet)):
                results[i] = hyps[:nbest]
            sentence, beams, memory, src_mask = sentence[~done], beams.keep(~done), memory[~done], src_mask[~done]
            if use_cache:
                cache = cache.select((~done).repeat_interleave(k).nonzero().view(-1), (~done).nonzero().view(-1))
            if not len(sentence):
                break
    return results
