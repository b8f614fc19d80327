"""Ensembles: N models that share one vocabulary, decoded as one model.

Each step's distribution is the mean of the models' probabilities, p(y_t) = 1/N sum_i p_i(y_t),
as fairseq decodes `--path a.pt:b.pt` (fairseq/sequence_generator.py, EnsembleModel.forward_decoder:
logsumexp of the stacked log-probabilities minus log N). Sequence scores are then sums of
log p(y_t) as for one model.

`Ensemble` offers what the searches use of a `Transformer` (`pad_id`, `encode`, `decode`,
`decode_step`), and its decoding state is again an explicit value: `EnsembleCache` holds one
`DecoderCache` per model and reorders them all with `select`, `EnsembleMemory` holds each model's
encoder output and drops finished sentences from all of them with `memory[keep]`. So the beam
search, sampling and reference scoring run one code path for one model and for N (the models may
differ in shape; only the vocabulary must be the same).

The searches apply log_softmax to what `decode_step` returns, so the ensemble returns scores whose
softmax is the mean of the models' distributions (`mix`). They are anchored on the first model's
logits, so that N copies of one model give that model's logits bit for bit, and with them its
translations and scores (tests/test_ensemble.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmt.model.cache import DecoderCache
from relmt.model.transformer import Transformer


def mix(logits: Sequence[Tensor]) -> Tensor:
    """Scores y (..., V) with softmax(y) = 1/N sum_i softmax(logits_i), in float32 at least.

    y = x_0 + log(1/N sum_i p_i / p_0): exp(y) is then proportional to sum_i p_i. With
    d_i = log p_i - log p_0 (d_0 = 0) and m = max_i d_i >= 0, log(1/N sum_i exp(d_i)) is computed as
    m + log(1/N sum_i exp(d_i - m)), which never overflows. Identical inputs give d = 0, m = 0 and
    log(1) = 0 exactly, hence y = x_0."""
    x = [t if t.dtype == torch.float64 else t.float() for t in logits]
    lprobs = [torch.log_softmax(t, dim=-1) for t in x]
    d = torch.stack([lp - lprobs[0] for lp in lprobs])  # (N, ..., V): log(p_i / p_0)
    m = d.max(dim=0).values
    return x[0] + m + torch.log(torch.exp(d - m).mean(dim=0))


@dataclass(frozen=True)
class EnsembleMemory:
    """Each model's encoder output, (B, S, d_model of that model); `memory[keep]` keeps the
    sentences `keep` picks (a (B,) bool mask or indices) in all of them."""

    memories: tuple[Tensor, ...]

    def __getitem__(self, keep: Tensor) -> EnsembleMemory:
        return EnsembleMemory(tuple(m[keep] for m in self.memories))


@dataclass(frozen=True)
class EnsembleCache:
    """Each model's `DecoderCache`, reordered together (see DecoderCache.select)."""

    caches: tuple[DecoderCache, ...]

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache(tuple(c.select(rows, sentences) for c in self.caches))


class Ensemble(nn.Module):
    """N >= 1 models with one vocabulary, decoded as the mean of their probabilities (`mix`)."""

    def __init__(self, models: Sequence[Transformer]) -> None:
        """`models`: relmt's modules, or an engine's stand-ins for them (relmt.export.graphs.GraphModel, which
        are no nn.Modules and give their vocabulary size as `vocab`)."""
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        vocab = {(m.tgt_embed.num_embeddings if isinstance(m, nn.Module) else m.vocab, m.pad_id) for m in models}
        if len(vocab) > 1:
            raise ValueError(f"the models of an ensemble must share one vocabulary, got (size, pad id) {vocab}")
        self.models = nn.ModuleList(models) if all(isinstance(m, nn.Module) for m in models) else tuple(models)
        self.pad_id = models[0].pad_id

    def encode(self, src: Tensor) -> tuple[EnsembleMemory, Tensor]:
        """src: (B, S). Each model's memory, and the source keep-mask (B, S) they share."""
        outputs = [m.encode(src) for m in self.models]
        return EnsembleMemory(tuple(memory for memory, _ in outputs)), outputs[0][1]

    def decode(self, tgt_in: Tensor, memory: EnsembleMemory, src_mask: Tensor) -> Tensor:
        """Teacher-forced pass (Transformer.decode): (B*K, T, V) mixed scores."""
        return mix([m.decode(tgt_in, mem, src_mask) for m, mem in zip(self.models, memory.memories)])

    def decode_step(self, tokens: Tensor, memory: EnsembleMemory, src_mask: Tensor,
                    cache: EnsembleCache | None = None, step: int = 0,
                    out_weight: tuple[Tensor | None, ...] | None = None) -> tuple[Tensor, EnsembleCache]:
        """One incremental step of every model (Transformer.decode_step): (B*K, V) mixed scores and
        the extended caches. out_weight: one padded output weight (or None) per model."""
        caches = cache.caches if cache is not None else (None,) * len(self.models)
        weights = out_weight if out_weight is not None else (None,) * len(self.models)
        steps = [m.decode_step(tokens, mem, src_mask, c, step=step, out_weight=w)
                 for m, mem, c, w in zip(self.models, memory.memories, caches, weights)]
        return mix([logits for logits, _ in steps]), EnsembleCache(tuple(c for _, c in steps))
