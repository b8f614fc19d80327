"""Dropout (Srivastava et al. 2014; Vaswani §5.4) with cheap masks on CPU.

`nn.Dropout` on CPU draws one Bernoulli sample per element (`bernoulli_`), which a profile of a
small-model training step showed as the largest cost after the matmuls (docs/results/performance/perf_log.md).
Here one 64-bit draw of the default generator gives four 16-bit lanes, so one draw decides four
elements, and the keep mask is one comparison with a scalar. The drop probability is rounded to a
multiple of 2^-16 (p = 0.1 becomes 0.100006), and kept elements are scaled by 1 / (1 - that p), so
the expectation is exact. The mask is applied as one multiplication by a float tensor of 0 and that
scale, which autograd also uses for the gradient (`torch.where`, which applied the mask before,
was the slow part on CPU: docs/results/performance/perf_log_wave4.md). The saved mask is float, four
bytes an element where a bool mask took one. Masks come from torch's default CPU generator, so seeding
and checkpointed RNG state reproduce them. Off CPU, `F.dropout` (a fused kernel there) is used
unchanged.

`counter_keep` is the other kind of mask: a hash of a seed and each element's coordinates, so that a fused
attention kernel and plain torch can recompute the same mask wherever they need it without storing it
(the flex attention route's dropout, relmt/model/flex.py). `hash32` is the hash; decoding's sampling draws
its numbers with it too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LANES = 4  # int16 lanes per int64 draw
_BITS = 16  # random bits per lane: the draws fill the whole int64 range


def keep_mask(shape: torch.Size, p: float) -> tuple[Tensor, float]:
    """A bool mask of `shape`, True with probability 1 - p' (p' = p rounded to 2^-16), and p'."""
    n = shape.numel()
    drop = round(p * 2 ** _BITS)
    draws = torch.empty(-(-n // _LANES), dtype=torch.int64).random_(-2 ** 63, 2 ** 63 - 1)
    keep = draws.view(torch.int16) >= -2 ** 15 + drop  # each lane uniform on [-2^15, 2^15)
    return keep[:n].view(shape), drop / 2 ** _BITS


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)`, with the cheap mask on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    keep, p_used = keep_mask(x.shape, p)
    # float32 at least, so that x * scale rounds once, in the precision a multiplication by the scale uses
    scaled = keep.to(torch.promote_types(x.dtype, torch.float32)).mul_(1.0 / (1.0 - p_used))
    return (x * scaled).to(x.dtype)


class Dropout(nn.Module):
    """Drop-in for `nn.Dropout` (not in place)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, a: int) -> Tensor:
    """(x * a) mod 2^32 for x in [0, 2^32) held in int64, without overflowing int64: a is split
    into 16-bit halves, so that no product exceeds 2^48."""
    return (x * (a & 0xFFFF) + (((x * (a >> 16)) & 0xFFFF) << 16)) & MASK32


def hash32(x: Tensor) -> Tensor:
    """A 32-bit integer hash of each element (Chris Wellons' `lowbias32`, an avalanching mix)."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_threshold(p: float) -> tuple[int, float]:
    """`counter_keep`'s threshold for drop probability p (rounded to a multiple of 2^-32) and the scale of
    the kept elements, 1 / (1 - that probability)."""
    t = min(round(p * 2**32), 2**32 - 1)
    return t, 2**32 / (2**32 - t)


def counter_key(seed: Tensor, b: Tensor, h: Tensor) -> Tensor:
    """The 32-bit key of a (batch row, head) pair of an attention-weights tensor: one hash of the seed and b, h
    (b below 2^19, h below 2^12). A fused kernel reads it from a (B, H) table instead of hashing it per weight."""
    return hash32(((b.to(torch.int64) << 12) | h.to(torch.int64)) ^ seed)


def keep_from_key(key: Tensor, threshold: int | Tensor, i: Tensor, j: Tensor) -> Tensor:
    """`counter_keep` given the key of (b, h): one hash of the key and the row and key positions (below 2^16)."""
    return hash32(((i.to(torch.int64) << 16) | j.to(torch.int64)) ^ key) >= threshold


def counter_keep(seed: Tensor, threshold: int | Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """Keep element (b, h, i, j) of an attention-weights tensor unless the hash of the seed and its coordinates
    falls below threshold. The coordinates are any broadcastable integer tensors (a kernel's scalars, or
    aranges); the packing takes rows and keys below 2^16, heads below 2^12 and batches below 2^19, and uses no
    sizes, so a compiled kernel's closure holds none."""
    return keep_from_key(counter_key(seed, b, h), threshold, i, j)
