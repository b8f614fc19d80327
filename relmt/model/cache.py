"""Decoding state as an explicit value: passed into `decode_step` and returned from it.

Nothing is hidden in module attributes, and no method changes a cache in place. Beam search
reorders all layers at once with `cache.select(beam_origin)`:
- Self-attention keys/values have one row per hypothesis. `select` copies nothing; it records
  which stored row each hypothesis continues (`order`), and the next `decode_step` gathers those
  rows while appending the new position, in one copy instead of two (`extend`).
- Cross-attention keys/values have one row per sentence, shared by that sentence's K beams (the
  decoder groups a sentence's beams as K queries against them), so reordering beams never
  touches them; only dropping finished sentences does.
The cache knows how many target positions it holds (`length`), and `decode_step` checks that
against the step it is given: the relative term at step t needs the distances j - t, and a cache
that loses t makes every distance 0 (HF transformers #19045).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's keys and values: (N, H, T, D) for self-attention over the T target
    positions so far of N stored hypothesis rows, and (B, H, S, D) for cross-attention over the
    B sources."""

    self_k: Tensor
    self_v: Tensor
    cross_k: Tensor
    cross_v: Tensor


def extend(past: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
    """`torch.cat((past[order], new), dim=2)` written in one copy. past: (N, H, T, D); new:
    (B*K, H, n, D); order: (B*K,) rows of past, or None for all of them in order."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (past.requires_grad or new.requires_grad)):
        # out= has neither autograd nor a torch.compile trace; the compiler fuses the two copies itself
        return torch.cat((past if order is None else past.index_select(0, order), new), dim=2)
    t = past.shape[2]
    out = new.new_empty(new.shape[0], new.shape[1], t + new.shape[2], new.shape[3])
    if order is None:
        out[:, :, :t] = past
    else:
        torch.index_select(past, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


@dataclass(frozen=True)
class DecoderCache:
    """Every decoder layer's `LayerCache`, in layer order. Hypothesis b continues stored
    self-attention row order[b] (order None: row b)."""

    layers: tuple[LayerCache, ...]
    order: Tensor | None = None

    @property
    def length(self) -> int:
        """Target positions already decoded, i.e. the step that comes next."""
        return self.layers[0].self_k.shape[2]

    @property
    def batch_size(self) -> int:
        """Hypotheses (rows of the next decode_step's tokens)."""
        return self.layers[0].self_k.shape[0] if self.order is None else len(self.order)

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> DecoderCache:
        """Reorder (or repeat, or drop) hypotheses: hypothesis b becomes what hypothesis rows[b]
        was; with `sentences`, sentence s becomes what sentence sentences[s] was (None: the
        sentences stay as they are)."""
        order = rows if self.order is None else self.order.index_select(0, rows)
        layers = self.layers
        if sentences is not None:
            layers = tuple(LayerCache(lc.self_k, lc.self_v, lc.cross_k.index_select(0, sentences),
                                      lc.cross_v.index_select(0, sentences)) for lc in layers)
        return DecoderCache(layers, order)
