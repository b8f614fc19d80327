"""relmt's network as two graphs for an inference engine (issue 33), and the stand-in the searches decode with.

An engine (relmt/export/onnx.py, relmt/export/aoti.py) compiles two modules traced from the model itself:
- `EncoderGraph`: source ids (B, S) -> the keep-mask (B, S) and every decoder layer's cross-attention keys and
  values, stacked (L, B, H, S, D): what `Transformer.encode` and `init_cache` compute once per batch;
- `StepGraph`: one `Transformer.decode_step` on the explicit state: tokens (B, K), the keep-mask, the cross keys
  and values, the self-attention keys and values of the t positions so far (L, N', H, t, D) and `order` (B, K),
  the stored row each hypothesis continues; it returns the logits (N, V) and the keys and values of the
  t + 1 positions (L, N, H, t + 1, D).
Every position mode goes through the same graphs: Shaw's per-head and shared tables (which CTranslate2
cannot hold), rope, alibi and t5 included.

`GraphModel` offers what the searches use of a `Transformer` (pad_id, encode, decode_step, eval), with
`GraphMemory` and `GraphCache` as its decoding state, so beam search, sampling, n-best, the t2t/fairseq EOS
rules and ensembles run unchanged on top of any engine; an engine supplies `run_encoder` and `run_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmt.model.cache import DecoderCache, LayerCache
from relmt.model.transformer import Transformer

STEP_INPUTS = ("tokens", "keep", "cross_k", "cross_v", "self_k", "self_v", "order")

# Part of the key of every onnx and aoti artefact (relmt/export/engines.py: `dependencies`). Bump it whenever a
# change to this file (or to the model code the graphs trace) changes what is exported: the graphs' inputs,
# outputs or what they compute. Artefacts made by the older code then get rebuilt instead of reused.
GRAPHS_VERSION = 1


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

    def forward(self, tokens: Tensor, keep: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: Tensor,
                self_v: Tensor, order: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # tokens and order come as (B, K), K hypotheses per sentence: N = B * K stays symbolic in the graph
        tokens, order = tokens.reshape(-1), order.reshape(-1)
        layers = tuple(LayerCache(self_k[i], self_v[i], cross_k[i], cross_v[i]) for i in range(self_k.shape[0]))
        memory = keep[:, :, None]  # decode_step reads only its batch size
        logits, cache = self.model.decode_step(tokens, memory, keep, DecoderCache(layers, order), step=self_k.shape[3])
        return (logits, torch.stack([lc.self_k for lc in cache.layers]),
                torch.stack([lc.self_v for lc in cache.layers]))


def shape_of(model: Transformer) -> dict:
    """What an engine needs to know beside its graphs: pad id, decoder layers, heads, head size, vocabulary."""
    first = model.decoder_layers[0].self_attn
    return {"pad_id": model.pad_id, "layers": len(model.decoder_layers), "heads": first.n_heads,
            "d_head": first.d_head, "vocab": model.tgt_embed.num_embeddings}


def examples(model: Transformer) -> tuple[tuple, tuple, dict, dict]:
    """Inputs to trace with (sizes over 1, so that no dimension is taken for a constant) and the dynamic
    dimensions of each graph."""
    shape = shape_of(model)
    layers, heads, d_head = shape["layers"], shape["heads"], shape["d_head"]
    b, k, m, s, t = 2, 3, 4, 5, 3
    src = torch.full((b, s), model.pad_id + 4, dtype=torch.long)
    step = (torch.full((b, k), model.pad_id + 4, dtype=torch.long), torch.ones(b, s, dtype=torch.bool),
            *(torch.randn(layers, b, heads, s, d_head) for _ in range(2)),
            *(torch.randn(layers, m, heads, t, d_head) for _ in range(2)), (torch.arange(b * k) % m).view(b, k))
    big = 1 << 20
    B, K, S, M = (torch.export.Dim(name, min=1, max=big) for name in ("B", "K", "S", "M"))
    T = torch.export.Dim("T", min=0, max=big)
    encoder_dims = {"src": {0: B, 1: S}}
    step_dims = {"tokens": {0: B, 1: K}, "keep": {0: B, 1: S}, "cross_k": {1: B, 3: S}, "cross_v": {1: B, 3: S},
                 "self_k": {1: M, 3: T}, "self_v": {1: M, 3: T}, "order": {0: B, 1: K}}
    return (src,), step, encoder_dims, step_dims


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


@dataclass(frozen=True)
class GraphCache:
    """The decoder state between steps: self-attention keys and values (L, N', H, t, D), and the stored row
    each hypothesis continues (`order`, None: row b), as `DecoderCache` keeps them."""

    self_k: Tensor
    self_v: Tensor
    order: Tensor | None = None

    @property
    def length(self) -> int:
        return self.self_k.shape[3]

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> GraphCache:
        """Hypothesis b becomes what hypothesis rows[b] was; the sentences live in GraphMemory."""
        order = rows if self.order is None else self.order.index_select(0, rows)
        return GraphCache(self.self_k, self.self_v, order)


class GraphModel:
    """The interface the searches use of a Transformer, over an engine's two graphs: a subclass gives
    `run_encoder(src) -> (keep, cross_k, cross_v)` and `run_step(*inputs in STEP_INPUTS order) -> (logits,
    self_k, self_v)`, CPU tensors in and out."""

    training = False

    def __init__(self, shape: dict) -> None:
        self.pad_id, self.layers, self.heads, self.d_head, self.vocab = (
            shape[k] for k in ("pad_id", "layers", "heads", "d_head", "vocab"))

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def run_step(self, *inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def eval(self) -> GraphModel:
        return self

    def train(self, mode: bool = True) -> GraphModel:
        return self

    def encode(self, src: Tensor) -> tuple[GraphMemory, Tensor]:
        keep, cross_k, cross_v = self.run_encoder(src.cpu())
        return GraphMemory(cross_k, cross_v), keep

    def decode_step(self, tokens: Tensor, memory: GraphMemory, src_mask: Tensor, cache: GraphCache | None = None,
                    step: int = 0, out_weight: Tensor | None = None) -> tuple[Tensor, GraphCache]:
        n, b = tokens.shape[0], src_mask.shape[0]
        if cache is None:
            empty = torch.zeros(self.layers, n, self.heads, 0, self.d_head)
            cache = GraphCache(empty, empty)
        if cache.length != step:
            raise ValueError(f"decode_step(step={step}) got a cache holding {cache.length} positions")
        order = cache.order if cache.order is not None else torch.arange(n)
        logits, self_k, self_v = self.run_step(tokens.reshape(b, -1), src_mask, memory.cross_k, memory.cross_v,
                                               cache.self_k, cache.self_v, order.reshape(b, -1))
        return logits, GraphCache(self_k, self_v)
