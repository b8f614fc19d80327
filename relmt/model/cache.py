"""Decoding state as an explicit value: passed into `decode_step` and returned from it.

Nothing is hidden in module attributes. Beam search reorders all layers at once with
`cache.select(beam_origin)`. The cache knows how many target positions it holds (`length`), and
`decode_step` checks that against the step it is given: the relative term at step t needs the
distances j - t, and a cache that loses t makes every distance 0 (HF transformers #19045).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's keys and values, each (B, H, T, D) for self-attention over the T
    target positions so far and (B, H, S, D) for cross-attention over the source."""

    self_k: Tensor
    self_v: Tensor
    cross_k: Tensor
    cross_v: Tensor

    def select(self, index: Tensor) -> LayerCache:
        return LayerCache(*(t.index_select(0, index) for t in
                            (self.self_k, self.self_v, self.cross_k, self.cross_v)))


@dataclass(frozen=True)
class DecoderCache:
    """Every decoder layer's `LayerCache`, in layer order."""

    layers: tuple[LayerCache, ...]

    @property
    def length(self) -> int:
        """Target positions already decoded, i.e. the step that comes next."""
        return self.layers[0].self_k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.layers[0].self_k.shape[0]

    def select(self, index: Tensor) -> DecoderCache:
        """Reorder (or repeat, or drop) batch rows in every layer: row b becomes row index[b]."""
        return DecoderCache(tuple(layer.select(index) for layer in self.layers))
