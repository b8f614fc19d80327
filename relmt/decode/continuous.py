"""Continuous batching: sentences join a running beam search at step boundaries (relmt-serve).

A server that decodes batch after batch leaves its decoder running a few sentences at the tail of
each batch while new requests wait. Here the search state is a value (`Running`) that new sentences
join between two steps (`join`), and `advance` takes one step of every sentence in it, returning
those that finished, so the rows freed by a finished sentence are filled at the next step.

A sentence joins at slot T of the running cache: its hypotheses' self-attention cache holds T empty
slots before its BOS, masked out, and `Transformer.decode_step(starts=...)` gives each row its own
position, step - start, for the absolute encoding. The relative terms (Shaw §3), ALiBi and T5 read
the distance j - i, the same between slots as between positions. When the longest-running sentence
finishes, the slots no remaining sentence uses are cut from the front. RoPE rotates keys by their
slot, so a RoPE model is refused here (`supports`) and served batch by batch.

The same runs on an engine's graphs (relmt/export/graphs.py's GraphModel: engine=onnx or aoti, issue 62 §3): its
step graph takes the rows' starts as an input, its memory holds the cross-attention keys and values and its cache
the self-attention ones. There neither `join` nor `trim` copies the self-attention cache (issue 76 §2): the new rows
continue a stored row that their starts mask out, and the step's gather makes their rows; a cut leaves the cache
whole, and the search graph's next step leaves the cut slots out of the copy it makes anyway, so a step costs the
slots its sentences use. A step graph (engine=onnx) takes its cache contiguous, so there a cut costs a copy, and
`trim` waits until it saves a quarter of the slots.

Each step is `relmt.decode.beam.beam_step`, beam_search's own, given each sentence's step count (the slot less
its start): the same candidates, EOS rules (t2t or fairseq), pools, stopping rule and length penalty, so a
sentence decoded here gets the hypotheses it gets alone (tests/test_continuous.py, float64: the same tokens; the
scores agree to rounding, since the padding changes the order of the sums). On an engine with a search graph
(aoti) the decoder step and beam_step are one call with the starts as an input, whoever has joined (issue 70); the
rules are made once per search and kept in `Running`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from relmt.config import DecodeConfig, EosCandidates
from relmt.decode.beam import Beams, Hypothesis, Rules, beam_step, finished_hypotheses, max_lengths
from relmt.model.cache import DecoderCache, LayerCache
from relmt.model.positions import Rotary
from relmt.model.transformer import Transformer


def supports(model: object, cfg: DecodeConfig) -> bool:
    """Whether `model` can decode under `cfg` here: relmt's own Transformer or an engine's graphs whose step
    takes per-row starts (relmt/export/graphs.py's GraphModel with `continuous`; not an ensemble), no RoPE, and a
    beam search (sampling seeds by the batch's line numbers)."""
    if cfg.sampling:
        return False
    if isinstance(model, Transformer):
        return not isinstance(model.decoder_positions, Rotary)
    return bool(getattr(model, "continuous", False))


@dataclass(frozen=True)
class Running:
    """The search over n sentences with K beams each, after T steps of the running batch."""

    keys: tuple[Hashable, ...]  # the caller's name of each sentence, (n,)
    tokens: Tensor  # (n*K, T + 1): each row's slots; padding, then BOS and the tokens chosen so far
    starts: Tensor  # (n,) the slot of each sentence's BOS
    alive: Tensor  # (n, K) live beams' log-probabilities
    pool_scores: Tensor  # (n, K) finished hypotheses' scores, -inf where none yet
    pool_tokens: Tensor  # (n, K, T) their tokens
    limit: Tensor  # (n,) steps allowed per sentence, floor(a |x| + b)
    memory: Tensor  # (n, S, d_model); an engine's GraphMemory: the cross keys and values
    src_mask: Tensor  # (n, S)
    cache: DecoderCache  # an engine's GraphCache: the self-attention keys and values alone
    rules: Rules | None = None  # the search's rules, made at its first step and kept (they do not change)


@torch.no_grad()
def start(model: Transformer, src: Tensor, keys: list[Hashable], cfg: DecodeConfig, bos_id: int) -> Running:
    """The state of the sentences src (n, S) (ids, EOS, padding) before their first step."""
    k = cfg.beam
    memory, src_mask = model.encode(src)
    n = src.shape[0]
    alive = torch.full((n, k), float("-inf"), device=src.device)
    alive[:, 0] = 0.0  # one live beam to start, as in beam_search
    return Running(tuple(keys), src.new_full((n * k, 1), bos_id), src.new_zeros(n), alive,
                   torch.full((n, k), float("-inf"), device=src.device), src.new_full((n, k, 0), model.pad_id),
                   max_lengths(src_mask, cfg.max_len_a, cfg.max_len_b), memory, src_mask,
                   model.init_cache(memory, n * k))


@torch.no_grad()
def join(run: Running | None, new: Running, pad_id: int) -> Running:
    """`new` (from `start`) joined to the running search at its next slot."""
    if run is None:
        return new
    slot, k = run.tokens.shape[1] - 1, new.alive.shape[1]
    rows = new.tokens.shape[0]
    s = max(run.src_mask.shape[1], new.src_mask.shape[1])

    def wide(x: Tensor, dim: int, value: float | bool = 0) -> Tensor:  # padded to s source positions
        pad = [0, 0] * (x.dim() - 1 - dim) + [0, s - x.shape[dim]]
        return F.pad(x, pad, value=value)

    if isinstance(run.cache, DecoderCache):
        layers = []
        for old, lc in zip(run.cache.layers, new.cache.layers):
            self_k, self_v = ((x if run.cache.order is None else x.index_select(0, run.cache.order))
                              for x in (old.self_k, old.self_v))
            empty = self_k.new_zeros(rows, *self_k.shape[1:])
            layers.append(LayerCache(torch.cat((self_k, empty)), torch.cat((self_v, empty)),
                                     torch.cat((wide(old.cross_k, 2), wide(lc.cross_k, 2))),
                                     torch.cat((wide(old.cross_v, 2), wide(lc.cross_v, 2)))))
        cache, memory = DecoderCache(tuple(layers)), torch.cat((wide(run.memory, 1), wide(new.memory, 1)))
    else:  # an engine's state (relmt/export/graphs.py): the cross keys and values are its memory
        cache, memory = run.cache.joined(rows), run.memory.joined(new.memory)
    tokens = torch.cat((new.tokens.new_full((rows, slot), pad_id), new.tokens), dim=1)
    pool = new.pool_tokens.new_full((new.alive.shape[0], k, run.pool_tokens.shape[2]), pad_id)
    return Running(run.keys + new.keys, torch.cat((run.tokens, tokens)), torch.cat((run.starts, new.starts + slot)),
                   torch.cat((run.alive, new.alive)), torch.cat((run.pool_scores, new.pool_scores)),
                   torch.cat((run.pool_tokens, pool)), torch.cat((run.limit, new.limit)), memory,
                   torch.cat((wide(run.src_mask, 1, False), wide(new.src_mask, 1, False))), cache, run.rules)


@torch.no_grad()
def advance(model: Transformer, run: Running, cfg: DecodeConfig, bos_id: int, eos_id: int,
            out_weight: Tensor | None = None) -> tuple[Running | None, list[tuple[Hashable, list[Hypothesis]]]]:
    """One step of every sentence: the state after it (None when no sentence is left) and the
    sentences that finished, each with its cfg.nbest hypotheses, best first."""
    k, pad_id = cfg.beam, model.pad_id
    rules = run.rules if run.rules is not None else rules_of(cfg, pad_id, bos_id, eos_id, run.tokens.device)
    slot = run.tokens.shape[1] - 1
    beams = Beams(run.tokens, run.alive, run.pool_scores, run.pool_tokens, run.limit)
    if out_weight is None and getattr(model, "searches", None) is not None and model.searches(rules):
        # an engine's search graph (relmt/export/graphs.py) runs the decoder step and beam_step for every sentence
        # from its own start in one call, as offline: no step of the search in Python (issue 70)
        beams, done, cache = model.search_step(beams, run.memory, run.src_mask, run.cache, rules, starts=run.starts)
    else:
        # while every sentence began at slot 0 (one decoded alone, say), the step needs no mask of empty slots
        starts = run.starts.repeat_interleave(k) if bool(run.starts.any()) else None
        logits, cache = model.decode_step(run.tokens[:, -1], run.memory, run.src_mask, run.cache, step=slot,
                                          out_weight=out_weight, starts=starts)
        beams, rows, done = beam_step(logits, beams, rules, pad_id, steps=slot - run.starts)
        cache = cache.select(rows)
    done_rows = done.nonzero().view(-1).tolist()  # the step's one read of the device, with the finished pools
    if not done_rows:
        return replace(run, tokens=beams.tokens, alive=beams.alive, pool_scores=beams.pool_scores,
                       pool_tokens=beams.pool_tokens, cache=cache, rules=rules), []
    # a late joiner's tokens hold its BOS after the empty slots
    hyps = finished_hypotheses(beams.pool_scores[done], beams.pool_tokens[done], (eos_id, pad_id, bos_id))
    finished = [(run.keys[i], h[: cfg.nbest]) for i, h in zip(done_rows, hyps)]
    if len(done_rows) == len(run.keys):
        return None, finished
    gone = set(done_rows)
    state = Running(tuple(key for i, key in enumerate(run.keys) if i not in gone), beams.tokens, run.starts,
                    beams.alive, beams.pool_scores, beams.pool_tokens, run.limit, run.memory, run.src_mask, cache,
                    rules)
    return trim(keep_sentences(state, ~done), pad_id), finished


def rules_of(cfg: DecodeConfig, pad_id: int, bos_id: int, eos_id: int, device: torch.device) -> Rules:
    """The search's rules for `cfg`, as relmt.decode.search.nbest_search sets them: beam 1 is greedy decoding
    (fairseq's EOS rule, stopping at the first finished hypothesis)."""
    greedy = cfg.beam == 1
    t2t = not greedy and EosCandidates(cfg.eos_candidates) == EosCandidates.t2t
    return Rules(eos_id, torch.tensor([pad_id, bos_id], device=device), cfg.min_len, cfg.lenpen, cfg.length_norm,
                 t2t, cfg.early_stop or greedy)


def drop(run: Running, keep: list[bool], pad_id: int) -> Running | None:
    """The search without the sentences where `keep` is False (their client left, relmt-serve): the others go on
    as if those had never joined; None when none is left."""
    if not any(keep):
        return None
    if all(keep):
        return run
    left = torch.tensor(keep, device=run.alive.device)
    kept = replace(run, keys=tuple(key for key, k in zip(run.keys, keep) if k))
    return trim(keep_sentences(kept, left), pad_id)


def keep_sentences(run: Running, left: Tensor) -> Running:
    """The sentences where `left` (n,) is True; the keys are already theirs."""
    k = run.alive.shape[1]
    rows = left.repeat_interleave(k)
    return Running(run.keys, run.tokens[rows], run.starts[left], run.alive[left], run.pool_scores[left],
                   run.pool_tokens[left], run.limit[left], run.memory[left], run.src_mask[left],
                   run.cache.select(rows.nonzero().view(-1), left.nonzero().view(-1)), run.rules)


def trim(run: Running, pad_id: int) -> Running:
    """Cut the front slots that no remaining sentence uses (all before every start) from the tokens,
    the pools and the cache: positions are step - start and the relative terms read distances, so
    shifting every slot by the same amount changes nothing (RoPE is not decoded here)."""
    cut = int(run.starts.min())
    if cut == 0 or (not isinstance(run.cache, DecoderCache) and not run.cache.free_cuts
                    and 4 * cut < run.tokens.shape[1]):
        # an engine's step graph takes its cache contiguous, so there a cut costs a copy of every layer's keys and
        # values: it waits until it saves a quarter of the slots (the slots before every start are masked out
        # meanwhile). The search graph's cuts cost nothing (relmt/export/graphs.py's GraphCache.trimmed).
        return run
    if isinstance(run.cache, DecoderCache):
        cache = DecoderCache(tuple(LayerCache(lc.self_k[:, :, cut:], lc.self_v[:, :, cut:], lc.cross_k, lc.cross_v)
                                   for lc in run.cache.layers), run.cache.order)
    else:  # an engine's GraphCache
        cache = run.cache.trimmed(cut)
    # pool column c holds slot c + 1: the cut columns hold slot 1..cut, padding or a BOS
    return Running(run.keys, run.tokens[:, cut:], run.starts - cut, run.alive, run.pool_scores,
                   run.pool_tokens[:, :, cut:], run.limit, run.memory, run.src_mask, cache, run.rules)
