"""relmt's network as graphs for an inference engine (issue 33), and the stand-in the searches decode with.

An engine (relmt/export/onnx.py, relmt/export/aoti.py) compiles two modules traced from the model itself:
- `EncoderGraph`: source ids (B, S) -> the keep-mask (B, S) and every decoder layer's cross-attention keys and
  values, stacked (L, B, H, S, D): what `Transformer.encode` and `init_cache` compute once per batch;
- `StepGraph`: one `Transformer.decode_step` on the explicit state: tokens (B, K), the keep-mask, the cross keys
  and values, the self-attention keys and values of the t positions so far, one (N', H, t, D) tensor per layer
  each, and `order` (B, K), the stored row each hypothesis continues, and `starts` (B, K), the cache slot where
  each hypothesis's sentence began (all 0 but in continuous batching, relmt/decode/continuous.py); it returns the
  logits (N, V) and each layer's keys and then values of the t + 1 positions (N, H, t + 1, D);
- `SearchGraph` (aoti only): `StepGraph` and the beam search's own step (relmt.decode.beam.beam_step) in one
  graph, so that a beam search step leaves Python once (issue 44 §7); it takes the starts too, and each sentence's
  step count is the slot less its start, so that continuous batching's step is one call as well (issue 70).
Every position mode goes through the same graphs: Shaw's per-head and shared tables (which CTranslate2
cannot hold), rope, alibi and t5 included.

The self-attention keys and values go in and out one tensor per layer, not stacked (L, N, H, t, D): a step makes
each layer's (N, H, t + 1, D) for its own attention, and a stacked output was a second copy of all of them, a pass
over the whole cache at every step (without it a step at 32 sentences 24 slots in takes 0.88x its time; issue 76
§2, docs/results/engines/cache_copies.md). An engine takes and gives the graphs' arguments flat: the lists spread in
place (`flat`; `nest` groups them back, for a graph run eagerly), and `flat_names` names them.

`GraphModel` offers what the searches use of a `Transformer` (pad_id, encode, decode_step, eval), with
`GraphMemory` and `GraphCache` as its decoding state, so beam search, sampling, n-best, the t2t/fairseq EOS
rules and ensembles run unchanged on top of any engine; an engine supplies `run_encoder` and `run_step`, and
may supply `run_search`, which beam_search then calls through `search_step` instead of decode_step + beam_step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmt.config import LengthNorm
from relmt.data.tokenizer import BOS_ID, EOS_ID
from relmt.decode.beam import Beams, Rules, beam_step
from relmt.model.cache import DecoderCache, LayerCache
from relmt.model.positions import Rotary
from relmt.model.transformer import Transformer

STEP_INPUTS = ("tokens", "keep", "cross_k", "cross_v", "self_k", "self_v", "order", "starts")
SEARCH_INPUTS = ("history", "keep", "cross_k", "cross_v", "self_k", "self_v", "order", "starts", "alive",
                 "pool_scores", "pool_tokens", "limit", "min_len", "lenpen", "power", "t2t", "early_stop")
SETTINGS = SEARCH_INPUTS.index("min_len")  # the settings (0-d tensors) follow the state
SEARCH_OUTPUTS = ("history", "alive", "pool_scores", "pool_tokens", "order", "self_k", "self_v", "done")

# Part of the key of every onnx and aoti artefact (relmt/export/engines.py: `dependencies`). Bump it whenever a
# change to this file (or to the model code the graphs trace) changes what is exported: the graphs' inputs,
# outputs or what they compute. Artefacts made by the older code then get rebuilt instead of reused.
GRAPHS_VERSION = 7  # 2: the search step (SearchGraph); 3: the step's starts (continuous batching, issue 62 §3);
# 4: the search step's starts (continuous batching's step in one call, issue 70); 5: the step's attention written
# out, and topk for the live candidates (issue 76 §3: docs/results/engines/step_profile.md); 6: the self-attention
# keys and values one tensor per layer, and examples of batch size to trace with (issue 76 §2); 7: the search step
# takes a cache longer than its history and leaves out the front slots (continuous batching's cut, issue 76 §2)
CACHE = ("self_k", "self_v")  # the inputs (and outputs) that are one tensor per decoder layer
LOOP_SLOTS = 32  # the longest step limit of a search that beam_search runs in LoopGraph (GraphModel.loops)


def flat_names(names: tuple[str, ...], layers: int) -> list[str]:
    """The names of a graph's flat inputs: self_k and self_v as self_k_0 .. self_k_{L-1} (as torch.export and the
    ONNX exporter name a list's items)."""
    return [f"{n}_{i}" if n in CACHE else n for n in names for i in (range(layers) if n in CACHE else (0,))]


def flat(args) -> list[Tensor]:
    """A graph's arguments as an engine takes them: each list spread in its place."""
    return [x for a in args for x in (a if isinstance(a, (list, tuple)) else (a,))]


def nest(inputs, names: tuple[str, ...], layers: int) -> list:
    """The arguments of the graph whose inputs are `names`, from its flat inputs (`flat`'s inverse), for a graph run
    eagerly: self_k and self_v as lists of `layers` tensors."""
    out, i = [], 0
    for name in names:
        if i == len(inputs):  # an input the graph may go without (the step's starts)
            break
        if name in CACHE:
            out.append(list(inputs[i:i + layers]))
            i += layers
        else:
            out.append(inputs[i])
            i += 1
    return out


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        memory, keep = self.model.encode(src)
        keys, values = zip(*(layer.cross_attn.project_kv(memory) for layer in self.model.decoder_layers))
        return keep, torch.stack(keys), torch.stack(values)


class StepGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, keep: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: list[Tensor],
                self_v: list[Tensor], order: Tensor, starts: Tensor | None = None) -> tuple[Tensor, ...]:
        # tokens, order and starts come as (B, K), K hypotheses per sentence: N = B * K stays symbolic in the graph.
        # starts: continuous batching joins sentences at later slots (all 0 offline).
        tokens, order = tokens.reshape(-1), order.reshape(-1)
        layers = tuple(LayerCache(k, v, cross_k[i], cross_v[i]) for i, (k, v) in enumerate(zip(self_k, self_v)))
        memory = keep[:, :, None]  # decode_step reads only its batch size
        logits, cache = self.model.decode_step(tokens, memory, keep, DecoderCache(layers, order),
                                               step=self_k[0].shape[2],
                                               starts=None if starts is None else starts.reshape(-1))
        return (logits, *(lc.self_k for lc in cache.layers), *(lc.self_v for lc in cache.layers))


class SearchGraph(nn.Module):
    """`StepGraph` and then relmt.decode.beam.beam_step in one graph: a beam search step that leaves Python
    once (issue 44 §7). history: (B, K, 1 + t) each hypothesis's tokens (continuous batching: padding before a
    late joiner's BOS); starts (B, K) the slot of each sentence's BOS (all 0 offline), so that a sentence's step
    count is t - its start (relmt/decode/continuous.py); alive, pool_scores (B, K);
    pool_tokens (B, K, t); limit (B,); then the settings as 0-d tensors (min_len, lenpen, and power, t2t,
    early_stop as bools). BOS and EOS are relmt's tokenizer's, constants of the graph. Returns the new
    history, alive, pool_scores, pool_tokens, the row each new hypothesis continues (B*K,) (the next
    step's order), the self-attention keys and values of the step's hypotheses and which sentences are done.

    The cache may hold more slots than the history's t: continuous batching cuts the front slots that no sentence
    uses any more from the history and the pools alone (`GraphCache.trimmed`), and the step's copy of the cache
    (its gather by order, which it makes anyway) leaves them out: a cut costs nothing, and a step costs the slots
    its sentences use (issue 76 §2)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.step = StepGraph(model)
        self.pad_id = model.pad_id

    def forward(self, history: Tensor, keep: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: list[Tensor],
                self_v: list[Tensor], order: Tensor, starts: Tensor, alive: Tensor, pool_scores: Tensor,
                pool_tokens: Tensor, limit: Tensor, min_len: Tensor, lenpen: Tensor, power: Tensor, t2t: Tensor,
                early_stop: Tensor, banned: Tensor | None = None) -> tuple[Tensor, ...]:
        b, k = alive.shape
        t = history.shape[2] - 1
        torch._check(self_k[0].shape[2] >= t)
        self_k, self_v = ([x.narrow(2, x.shape[2] - t, t) for x in xs] for xs in (self_k, self_v))
        logits, *cache = self.step(history[:, :, -1], keep, cross_k, cross_v, self_k, self_v, order, starts)
        if banned is None:  # LoopGraph makes it outside its loop: a constant made inside a loop's body fails to compile
            banned = torch.tensor([self.pad_id, BOS_ID])
        rules = Rules(EOS_ID, banned, min_len, lenpen, power, t2t, early_stop)
        steps = (history.shape[2] - 1) - starts[:, 0]  # (B,) each sentence's steps so far
        beams, rows, done = beam_step(logits, Beams(history.reshape(b * k, -1), alive, pool_scores, pool_tokens,
                                                    limit), rules, self.pad_id, steps)
        return (beams.tokens.view(b, k, -1), beams.alive, beams.pool_scores, beams.pool_tokens, rows, *cache, done)


LOOP_INPUTS = ("history", "keep", "cross_k", "cross_v", "self_k", "self_v", "order", "alive", "pool_scores",
               "pool_tokens", "done", "t", "limit", "min_len", "lenpen", "power", "t2t", "early_stop")
LOOP_STATE = ("history", "self_k", "self_v", "order", "alive", "pool_scores", "pool_tokens", "done", "t")
LOOP_OUTPUTS = LOOP_STATE  # the state after the call: the pools, and where a search goes on, what it goes on from


class LoopGraph(nn.Module):
    """The whole search in one graph (issue 76 §1): `SearchGraph`'s step inside torch's while_loop, so that a
    sentence's search leaves Python once, not once per step. while_loop carries tensors of one shape, so the
    growing state lives in buffers of T slots, each step reading the t slots so far (t an unbacked size inside
    the loop) and writing its t + 1 back: history (B, K, T + 1), BOS in slot 0; the self-attention keys and values
    (L, B, K, H, T, D); pool_tokens (B, K, T), padding. The step is SearchGraph's, so a step gives what a search
    step gives; a sentence done stays in the batch, its pool frozen (beam_search takes done sentences out instead:
    the same pools). Offline searches only (starts 0).

    It runs from step t (an input, with the row each beam continues, `order`, and which sentences are `done`: the
    search's state, in and out) until every sentence is done, the longest step limit, or the buffers are full, and
    returns the state (LOOP_STATE): the pools (pool_tokens: the first t slots hold the tokens). A step copies the
    carried buffers whole, so it costs their length T, not the slots so far (docs/results/engines/search_loop*.md).

    It steps a copy of `model` with its computed weights made once (Transformer.freeze_projections: the scaled W^Q,
    W^Q|W^K|W^V, the output layer): a while_loop's body gets the weights as operands, where freezing does not fold
    what is computed from them, so they were computed again at every iteration (docs/results/engines/search_loop.md).
    relmt/export/aoti_loop.py compiles it with the weights as the body's constants."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        model = copy.deepcopy(model).eval()
        model.freeze_projections()
        self.search = SearchGraph(model)

    def forward(self, history: Tensor, keep: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: Tensor,
                self_v: Tensor, order: Tensor, alive: Tensor, pool_scores: Tensor, pool_tokens: Tensor, done: Tensor,
                t: Tensor, limit: Tensor, min_len: Tensor, lenpen: Tensor, power: Tensor, t2t: Tensor,
                early_stop: Tensor) -> tuple[Tensor, ...]:
        from torch._higher_order_ops.while_loop import while_loop

        b, k = alive.shape
        layers, heads, slots, d_head = self_k.shape[0], self_k.shape[3], self_k.shape[4], self_k.shape[5]
        starts = torch.zeros(b, k, dtype=torch.long, device=alive.device)
        banned = torch.tensor([self.search.pad_id, BOS_ID], device=alive.device)
        end = limit.max().clamp(max=slots)

        def cond(history, self_k, self_v, order, alive, pool_scores, pool_tokens, done, t):
            return (t < end) & ~done.all()

        def body(history, self_k, self_v, order, alive, pool_scores, pool_tokens, done, t):
            n = t.item()
            torch._check(n >= 0)
            torch._check(n < slots)
            flat_k = self_k.view(layers, b * k, heads, slots, d_head)
            flat_v = self_v.view(layers, b * k, heads, slots, d_head)
            new_history, alive, new_scores, new_tokens, rows, *cache, finished = self.search(
                history.narrow(2, 0, n + 1), keep, cross_k, cross_v, [x.narrow(2, 0, n) for x in flat_k],
                [x.narrow(2, 0, n) for x in flat_v], order, starts, alive, pool_scores, pool_tokens.narrow(2, 0, n),
                limit, min_len, lenpen, power, t2t, early_stop, banned)
            new_k, new_v = torch.stack(cache[:layers]), torch.stack(cache[layers:])
            # a sentence done before this step keeps its pool, as if it had left the search
            pool_scores = torch.where(done[:, None], pool_scores, new_scores)
            pool_tokens = torch.where(done[:, None, None], pool_tokens,
                                      pool_tokens.slice_scatter(new_tokens, 2, 0, n + 1))
            self_k = flat_k.slice_scatter(new_k, 3, 0, n + 1).view(self_k.shape)
            self_v = flat_v.slice_scatter(new_v, 3, 0, n + 1).view(self_v.shape)
            return (history.slice_scatter(new_history, 2, 0, n + 2), self_k, self_v, rows.view(b, k), alive,
                    pool_scores, pool_tokens, done | finished, t + 1)

        return tuple(while_loop(cond, body, (history, self_k, self_v, order, alive, pool_scores, pool_tokens, done,
                                             t)))


def shape_of(model: Transformer) -> dict:
    """What an engine needs to know beside its graphs: pad id, decoder layers, heads, head size, vocabulary, that
    the step graph takes `starts` (an export made before it did has no such key) and whether the decoder rotates
    keys by their slot (RoPE, which continuous batching cannot shift: relmt/decode/continuous.py)."""
    first = model.decoder_layers[0].self_attn
    return {"pad_id": model.pad_id, "layers": len(model.decoder_layers), "heads": first.n_heads,
            "d_head": first.d_head, "vocab": model.tgt_embed.num_embeddings, "starts": True,
            "rope": isinstance(model.decoder_positions, Rotary)}


# The sizes to trace with: sentences, beams, stored cache rows, source length, slots so far; each over 1, so that no
# dimension is taken for a constant. The graphs are dynamic in all of them, but inductor's CPU code decides at compile
# time whether a loop is split over the threads, from the sizes it was traced at (its size hints, against
# cpp.min_chunk_size): traced at "few" rows, every copy of the self-attention cache ran on one thread at 32 sentences
# per batch. An engine compiles its graphs for many rows at "many", and search_small.pt2 (one sentence) at "few".
EXAMPLE_SIZES = {"few": (2, 3, 4, 5, 3), "many": (8, 4, 30, 24, 16)}


def examples(model: Transformer, rows: str = "few") -> tuple[tuple, tuple, dict, dict]:
    """Inputs to trace with (at EXAMPLE_SIZES[rows]) and the dynamic dimensions of each graph."""
    shape = shape_of(model)
    layers, heads, d_head = shape["layers"], shape["heads"], shape["d_head"]
    b, k, m, s, t = EXAMPLE_SIZES[rows]
    src = torch.full((b, s), model.pad_id + 4, dtype=torch.long)
    step = (torch.full((b, k), model.pad_id + 4, dtype=torch.long), torch.ones(b, s, dtype=torch.bool),
            *(torch.randn(layers, b, heads, s, d_head) for _ in range(2)),
            *([torch.randn(m, heads, t, d_head) for _ in range(layers)] for _ in range(2)),
            (torch.arange(b * k) % m).view(b, k),
            # starts: every second sentence joined at slot 1, so that the graph masks slots by a traced comparison
            (torch.arange(b) % 2).repeat_interleave(k).view(b, k))
    big = 1 << 20
    B, K, S, M = (torch.export.Dim(name, min=1, max=big) for name in ("B", "K", "S", "M"))
    T = torch.export.Dim("T", min=0, max=big)
    encoder_dims = {"src": {0: B, 1: S}}
    step_dims = {"tokens": {0: B, 1: K}, "keep": {0: B, 1: S}, "cross_k": {1: B, 3: S}, "cross_v": {1: B, 3: S},
                 "self_k": [{0: M, 2: T}] * layers, "self_v": [{0: M, 2: T}] * layers, "order": {0: B, 1: K},
                 "starts": {0: B, 1: K}}
    return (src,), step, encoder_dims, step_dims


def search_examples(model: Transformer, rows: str = "few") -> tuple[tuple, dict]:
    """Inputs to trace SearchGraph with (at EXAMPLE_SIZES[rows]), and its dynamic dimensions."""
    _, step, _, step_dims = examples(model, rows)
    tokens, keep, cross_k, cross_v, self_k, self_v, order, starts = step
    b, k = tokens.shape
    p = self_k[0].shape[2] - 1  # the history's slots: one fewer than the cache's, one slot cut (SearchGraph)
    history = torch.full((b, k, p + 1), model.pad_id + 4, dtype=torch.long)
    scores = torch.randn(b, k)
    search = (history, keep, cross_k, cross_v, self_k, self_v, order, starts, scores, scores.clone(),
              torch.full((b, k, p), model.pad_id, dtype=torch.long), torch.full((b,), p + 2),
              torch.tensor(1), torch.tensor(0.6, dtype=torch.float64), *map(torch.tensor, (False, True, False)))
    B, K = step_dims["tokens"][0], step_dims["tokens"][1]
    dims = {name: step_dims[name] for name in ("keep", "cross_k", "cross_v", "self_k", "self_v", "order", "starts")}
    # the history's slots (P) apart from the cache's (T): the cache may hold front slots cut from the history
    P = torch.export.Dim("P", min=0, max=1 << 20)
    dims |= {"history": {0: B, 1: K, 2: P + 1}, "alive": {0: B, 1: K}, "pool_scores": {0: B, 1: K},
             "pool_tokens": {0: B, 1: K, 2: P}, "limit": {0: B}} | {name: None for name in SEARCH_INPUTS[SETTINGS:]}
    return search, dims


def loop_state(keep: Tensor, cross_k: Tensor, cross_v: Tensor, beam: int, slots: int, pad_id: int) -> dict:
    """The state LoopGraph starts a search from (LOOP_STATE, by name), from its encoder's output as EncoderGraph gives
    it: BOS in every history, one live beam a sentence (so that the first step does not repeat it `beam` times),
    empty pools and buffers of `slots` slots, on keep's device."""
    device, (layers, b, heads, _, d_head) = keep.device, cross_k.shape
    history = torch.full((b, beam, slots + 1), pad_id, device=device)
    history[:, :, 0] = BOS_ID
    alive = torch.full((b, beam), float("-inf"), device=device)
    alive[:, 0] = 0.0
    cache = torch.zeros(layers, b, beam, heads, slots, d_head, device=device)
    return {"history": history, "self_k": cache, "self_v": cache.clone(),
            "order": torch.arange(b * beam, device=device).view(b, beam), "alive": alive,
            "pool_scores": torch.full_like(alive, float("-inf")),
            "pool_tokens": torch.full((b, beam, slots), pad_id, device=device),
            "done": torch.zeros(b, dtype=torch.bool, device=device), "t": torch.zeros((), dtype=torch.long,
                                                                                      device=device)}


def loop_inputs(state: dict, keep: Tensor, cross_k: Tensor, cross_v: Tensor, limit: Tensor,
                settings: tuple[Tensor, ...]) -> list[Tensor]:
    """LoopGraph's inputs in LOOP_INPUTS' order: the state, the batch's encoder output and step limits, and the
    search's settings as the search graph takes them (min_len, lenpen, power, t2t, early_stop: GraphModel.for_rules)."""
    given = state | {"keep": keep, "cross_k": cross_k, "cross_v": cross_v, "limit": limit}
    return [given[name] for name in LOOP_INPUTS[:LOOP_INPUTS.index("min_len")]] + list(settings)


def loop_settings(min_len: int, lenpen: float, power: bool, t2t: bool, early_stop: bool, device=None
                  ) -> tuple[Tensor, ...]:
    """A search's settings as LoopGraph and the search graph take them (0-d tensors)."""
    return (torch.tensor(min_len, device=device), torch.tensor(lenpen, dtype=torch.float64, device=device),
            *(torch.tensor(flag, device=device) for flag in (power, t2t, early_stop)))


def loop_start(keep: Tensor, cross_k: Tensor, cross_v: Tensor, beam: int, slots: int, limit: Tensor, pad_id: int,
               min_len: int, lenpen: float, power: bool, t2t: bool, early_stop: bool) -> list[Tensor]:
    """LoopGraph's inputs (LOOP_INPUTS' order) for a batch's whole search in one call: `loop_state` with buffers of
    `slots` slots, the encoder's output, each sentence's step limit and the search's settings, on keep's device."""
    return loop_inputs(loop_state(keep, cross_k, cross_v, beam, slots, pad_id), keep, cross_k, cross_v, limit,
                       loop_settings(min_len, lenpen, power, t2t, early_stop, keep.device))


def loop_examples(model: Transformer) -> tuple[tuple, dict]:
    """Inputs to trace LoopGraph with (T = 6 slots), and its dynamic dimensions."""
    shape = shape_of(model)
    layers, heads, d_head = shape["layers"], shape["heads"], shape["d_head"]
    b, k, s, slots = 2, 3, 5, 6
    loop = loop_start(torch.ones(b, s, dtype=torch.bool), *(torch.randn(layers, b, heads, s, d_head) for _ in range(2)),
                      k, slots, torch.tensor([4, 6]), model.pad_id, 1, 0.6, False, True, False)
    big = 1 << 20
    B, K, S = (torch.export.Dim(name, min=1, max=big) for name in ("B", "K", "S"))
    T = torch.export.Dim("T", min=2, max=big)
    dims = {"history": {0: B, 1: K, 2: T + 1}, "keep": {0: B, 1: S}, "cross_k": {1: B, 3: S}, "cross_v": {1: B, 3: S},
            "self_k": {1: B, 2: K, 4: T}, "self_v": {1: B, 2: K, 4: T}, "order": {0: B, 1: K}, "alive": {0: B, 1: K},
            "pool_scores": {0: B, 1: K}, "pool_tokens": {0: B, 1: K, 2: T}, "done": {0: B}, "t": None,
            "limit": {0: B}}
    return tuple(loop), dims | {name: None for name in LOOP_INPUTS[LOOP_INPUTS.index("min_len"):]}


@dataclass(frozen=True)
class GraphMemory:
    """The encoder's output as the step graph takes it: cross keys and values (L, B, H, S, D)."""

    cross_k: Tensor
    cross_v: Tensor

    @property
    def shape(self) -> tuple[int]:
        return (self.cross_k.shape[1],)  # the batch size, which is what the searches read

    def __getitem__(self, keep: Tensor) -> GraphMemory:
        rows = keep.nonzero().view(-1) if keep.dtype == torch.bool else keep
        return GraphMemory(self.cross_k.index_select(1, rows), self.cross_v.index_select(1, rows))

    def joined(self, new: GraphMemory) -> GraphMemory:
        """These sentences and then `new`'s, padded to the longer source (continuous batching)."""
        s = max(self.cross_k.shape[3], new.cross_k.shape[3])

        def wide(x: Tensor) -> Tensor:
            return torch.nn.functional.pad(x, (0, 0, 0, s - x.shape[3]))

        return GraphMemory(torch.cat((wide(self.cross_k), wide(new.cross_k)), dim=1),
                           torch.cat((wide(self.cross_v), wide(new.cross_v)), dim=1))


@dataclass(frozen=True)
class GraphCache:
    """The decoder state between steps: each layer's self-attention keys and values (N', H, front + t, D), and the
    stored row each hypothesis continues (`order`, None: row b), as `DecoderCache` keeps them. `front`: slots at the
    front that continuous batching has cut (`trimmed`) and the next step leaves out. `free_cuts`: made by the search
    graph, whose next step leaves cut slots out of the copy it makes anyway (a step graph's call copies the rest)."""

    self_k: tuple[Tensor, ...]
    self_v: tuple[Tensor, ...]
    order: Tensor | None = None
    front: int = 0
    free_cuts: bool = False

    @property
    def length(self) -> int:
        return self.self_k[0].shape[2] - self.front

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> GraphCache:
        """Hypothesis b becomes what hypothesis rows[b] was; the sentences live in GraphMemory."""
        order = rows if self.order is None else self.order.index_select(0, rows)
        return GraphCache(self.self_k, self.self_v, order, self.front, self.free_cuts)

    def joined(self, rows: int) -> GraphCache:
        """The hypotheses in order and then `rows` new ones whose slots so far are empty (continuous batching:
        relmt/decode/continuous.py's `join`, which masks them by the new sentences' starts). Nothing is copied: the
        new hypotheses continue stored row 0, whose keys and values their mask leaves out (a weight of exactly 0
        on a finite value), and the next step's gather by `order` makes their rows as it makes every other's."""
        order = torch.arange(self.self_k[0].shape[0]) if self.order is None else self.order
        return GraphCache(self.self_k, self.self_v, torch.cat((order, order.new_zeros(rows))), self.front,
                          self.free_cuts)

    def trimmed(self, cut: int) -> GraphCache:
        """Without the first `cut` slots (continuous batching, when no sentence uses them). Nothing is copied: the
        next search step leaves them out of the copy of the cache it makes anyway (SearchGraph); a step graph takes
        the rest as a view, which the engine's call copies contiguous."""
        return GraphCache(self.self_k, self.self_v, self.order, self.front + cut, self.free_cuts)

    def live(self) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Each layer's keys and values without the front slots cut (views)."""
        if not self.front:
            return self.self_k, self.self_v
        return tuple(x[:, :, self.front:] for x in self.self_k), tuple(x[:, :, self.front:] for x in self.self_v)


class GraphModel:
    """The interface the searches use of a Transformer, over an engine's two graphs: a subclass gives
    `run_encoder(src) -> (keep, cross_k, cross_v)` and `run_step(*inputs in STEP_INPUTS order, flat) -> (logits,
    each layer's self_k, each layer's self_v)`, CPU tensors in and out."""

    training = False

    def __init__(self, shape: dict) -> None:
        self.pad_id, self.layers, self.heads, self.d_head, self.vocab = (
            shape[k] for k in ("pad_id", "layers", "heads", "d_head", "vocab"))
        self.starts = bool(shape.get("starts"))  # the step graph takes `starts` (exports since GRAPHS_VERSION 3)
        # continuous batching (relmt/decode/continuous.py: `supports`) joins sentences at later slots: the step
        # graph must take their starts, and the keys must not be rotated by their slot
        self.continuous = self.starts and not shape.get("rope", True)

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def run_step(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    run_search = None  # an engine with a SearchGraph: run_search(*inputs in SEARCH_INPUTS order, flat) -> its outputs
    run_loop = None  # an engine with a LoopGraph: run_loop(*inputs in LOOP_INPUTS order) -> LOOP_OUTPUTS
    loop_rows = 0  # the most hypotheses (sentences x beams) that beam_search hands to `whole_search` (0: none)

    def for_rules(self, rules: Rules) -> tuple[bool, tuple[Tensor, ...]]:
        """Whether `search_step` serves a beam search with these rules (the engine has a search graph, and the ids are
        the ones compiled into it), and the settings as the search graph's inputs: made once per Rules, which a
        search's steps share (a running search asks at every step)."""
        kept = self.__dict__.get("_rules")
        if kept is None or kept[0] is not rules or kept[1] is not self.run_search:
            serves = self.run_search is not None and rules.eos_id == EOS_ID and \
                rules.banned.tolist() == [self.pad_id, BOS_ID]
            settings = (torch.tensor(rules.min_len), torch.tensor(float(rules.lenpen), dtype=torch.float64),
                        torch.tensor(LengthNorm(rules.norm) == LengthNorm.power), torch.tensor(bool(rules.t2t)),
                        torch.tensor(bool(rules.early_stop)))
            kept = self._rules = rules, self.run_search, serves, settings
        return kept[2], kept[3]

    def searches(self, rules: Rules) -> bool:
        """Whether `search_step` serves a beam search with these rules (`for_rules`)."""
        return self.for_rules(rules)[0]

    def search_step(self, beams: Beams, memory: GraphMemory, src_mask: Tensor, cache: GraphCache | None,
                    rules: Rules, starts: Tensor | None = None) -> tuple[Beams, Tensor, GraphCache]:
        """decode_step and relmt.decode.beam.beam_step in one call of the search graph: the beams after the
        step, which sentences are done, and the cache (the keys and values of the step's hypotheses, and the
        row each new live beam continues). starts: (b,) the slot where each sentence began (continuous batching;
        None: all 0)."""
        b, k = beams.alive.shape
        if cache is None:
            cache = self.init_cache(memory, b * k)
        order = cache.order if cache.order is not None else torch.arange(b * k)
        # the (b, k) starts the graph takes, made again only when the sentences change (a join, a cut, one done)
        kept = self.__dict__.get("_starts")
        if kept is None or kept[0] is not starts or kept[1] != (b, k):
            made = torch.zeros(b, k, dtype=torch.long) if starts is None else starts[:, None].expand(b, k).contiguous()
            kept = self._starts = starts, (b, k), made
        starts, settings = kept[2], self.for_rules(rules)[1]
        history, alive, pool_scores, pool_tokens, rows, *kv, done = self.run_search(
            beams.tokens.view(b, k, -1), src_mask, memory.cross_k, memory.cross_v, *cache.self_k, *cache.self_v,
            order.view(b, k), starts, beams.alive, beams.pool_scores, beams.pool_tokens, beams.limit, *settings)
        return (Beams(history.view(b * k, -1), alive, pool_scores, pool_tokens, beams.limit), done,
                GraphCache(tuple(kv[: self.layers]), tuple(kv[self.layers:]), rows, free_cuts=True))

    def loops(self, rows: int, steps: int) -> bool:
        """Whether beam_search runs a search of `rows` hypotheses (sentences x beams) and at most `steps` steps in one
        call of `whole_search`: at most `loop_rows` rows, and at most LOOP_SLOTS steps. Each step of the loop copies
        its buffers whole (LoopGraph), so a longer search ran slower than a call per step (0.66-0.69x at 70 steps on
        docs/results/engines/search_loop_rel_1t.md), a shorter one as fast (1.02-1.05x at 20)."""
        return 0 < rows <= self.loop_rows and steps <= LOOP_SLOTS

    def whole_search(self, memory: GraphMemory, src_mask: Tensor, beam: int, limit: Tensor, rules: Rules
                     ) -> tuple[Tensor, Tensor]:
        """A whole beam search in one call of the engine's LoopGraph (issue 76 §1), its buffers as long as the longest
        step limit: each sentence's pool of finished hypotheses, scores (B, beam) and tokens (B, beam, t), as
        beam_search's steps leave it."""
        state = loop_state(src_mask, memory.cross_k, memory.cross_v, beam, int(limit.max()), self.pad_id)
        out = dict(zip(LOOP_STATE, self.run_loop(*loop_inputs(state, src_mask, memory.cross_k, memory.cross_v, limit,
                                                                 self.for_rules(rules)[1]))))
        return out["pool_scores"], out["pool_tokens"][:, :, :int(out["t"])]

    def eval(self) -> GraphModel:
        return self

    def train(self, mode: bool = True) -> GraphModel:
        return self

    def encode(self, src: Tensor) -> tuple[GraphMemory, Tensor]:
        keep, cross_k, cross_v = self.run_encoder(src.cpu())
        return GraphMemory(cross_k, cross_v), keep

    def init_cache(self, memory: GraphMemory, hypotheses: int) -> GraphCache:
        """An empty cache for `hypotheses` rows (the cross keys and values live in the memory)."""
        empty = (torch.zeros(hypotheses, self.heads, 0, self.d_head),) * self.layers
        return GraphCache(empty, empty)

    def decode_step(self, tokens: Tensor, memory: GraphMemory, src_mask: Tensor, cache: GraphCache | None = None,
                    step: int = 0, out_weight: Tensor | None = None, starts: Tensor | None = None,
                    ) -> tuple[Tensor, GraphCache]:
        """Transformer.decode_step on the graphs; `starts` (N,) as there (continuous batching), None: all 0."""
        n, b = tokens.shape[0], src_mask.shape[0]
        if cache is None:
            cache = self.init_cache(memory, n)
        if cache.length != step:
            raise ValueError(f"decode_step(step={step}) got a cache holding {cache.length} positions")
        order = cache.order if cache.order is not None else torch.arange(n)
        self_k, self_v = cache.live()
        inputs = [tokens.reshape(b, -1), src_mask, memory.cross_k, memory.cross_v, *self_k, *self_v,
                  order.reshape(b, -1)]
        if self.starts:
            inputs.append((starts if starts is not None else torch.zeros_like(order)).reshape(b, -1))
        elif starts is not None:
            raise ValueError("decode_step(starts=...): this export's step graph takes no starts; export it again")
        logits, *kv = self.run_step(*inputs)
        return logits, GraphCache(tuple(kv[: self.layers]), tuple(kv[self.layers:]))
