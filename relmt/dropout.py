"""Dropout (Srivastava et al. 2014; Vaswani §5.4) with cheap masks on CPU.

`nn.Dropout` on CPU draws one Bernoulli sample per element (`bernoulli_`), which a profile of a
small-model training step showed as the largest cost after the matmuls (docs/results/performance/perf_log.md).
Here one 64-bit draw of the default generator gives four 16-bit lanes, so one draw decides four
elements, and the keep mask is one comparison. The drop probability is rounded to a multiple of 2^-15
(p = 0.1 becomes 0.100006), and kept elements are scaled by 1 / (1 - that p), so the expectation
is exact. Masks come from torch's default CPU generator, so seeding and checkpointed RNG state
reproduce them. Off CPU, `F.dropout` (a fused kernel there) is used unchanged.
"""

from __future__ import annotations

import sys
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LANES = 4  # int16 lanes per int64 draw
_BITS = 15  # random_() fills [0, 2^63): the most significant lane has 15 random bits, the others 16


@lru_cache(maxsize=16)  # a handful of distinct p per model; built once, not at every call
def _thresholds(p: float) -> tuple[Tensor, float]:
    """Per-lane int16 thresholds t (keep iff lane >= t) for drop probability p, and the exact p used."""
    drop = round(p * 2 ** _BITS)
    top = 3 if sys.byteorder == "little" else 0  # the lane holding the draw's high (15-bit) part
    t = [drop if lane == top else -2 ** 15 + 2 * drop for lane in range(_LANES)]
    return torch.tensor(t, dtype=torch.int16), drop / 2 ** _BITS


def keep_mask(shape: torch.Size, p: float) -> tuple[Tensor, float]:
    """A bool mask of `shape`, True with probability 1 - p' (p' = p rounded to 2^-15), and p'."""
    n = shape.numel()
    draws = torch.empty(-(-n // _LANES), dtype=torch.int64).random_()
    thresholds, p_used = _thresholds(p)
    keep = draws.view(torch.int16).view(-1, _LANES) >= thresholds
    return keep.view(-1)[:n].view(shape), p_used


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)`, with the cheap mask on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    keep, p_used = keep_mask(x.shape, p)
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - p_used))


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
