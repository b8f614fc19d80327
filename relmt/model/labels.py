"""Between key positions and Shaw's labels (§3.2): edge (i, j) has label clip(j - i, k) + k, one of 2k+1 table
rows, and query row i sits at position i + q_offset.

- `gather_labels`: a per-label table R (..., n, 2k+1) read at every key's label, (..., n, m): q·a^K of
  eq. (5)'s second term, from R = q·(w^K)^T.
- `sum_labels`: the values of every key added up per label, (..., n, m) -> (..., n, 2k+1): the buckets
  S_ir = sum over j of label r of alpha_ij in eq. (3)'s second term, and the gradient of `gather_labels`.

On the CPU these are torch's gather and scatter_add. On CUDA scatter_add is one atomic add per key, and all
the keys of a clipped tail (j - i <= -k, or >= k) add into the same address of their row, so they queue.
There `sum_labels` reads the band |j - i| < k with a gather (one key per label) and both tails with one
batched product against the rows' tail masks, (n, B*H, m) @ (n, m, 2): x is read once, on the matrix units,
deterministic, and with no subtraction; `gather_labels`' backward is that sum.

The tails are accumulated in float32 (or wider) by construction, not by a global flag: the product runs
outside autocast, in x's own dtype, and bf16/fp16 operands write a float32 output (`bmm(..., out_dtype=
float32)` on CUDA), so cuBLAS's reduced-precision reduction (`allow_bf16_reduced_precision_reduction`, on by
default), which reduces in the output's dtype, has no bf16 to reduce in. The sums are rounded to x's dtype once.
(Until 2026-11-28 the tails were prefix and suffix scans: two cumsums and a flip of (B, H, n, m) each, 113 ms
of rel's 471 ms step on an H200.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def atomic_free(t: Tensor) -> bool:
    """Whether sums per label avoid scatter_add's atomics on this tensor's device (tests force it on the CPU)."""
    return t.is_cuda


def sum_labels(x: Tensor, index: Tensor, k: int, q_offset: int) -> Tensor:
    """S (..., n, 2k+1) with S_ir = sum of x_ij over the keys j of label r; index: the (n, m) labels."""
    if atomic_free(x):
        return _sum_without_atomics(x, k, q_offset)
    out = x.new_zeros(*x.shape[:-1], 2 * k + 1)
    return out.scatter_add_(-1, index.expand_as(x), x)


def gather_labels(r: Tensor, index: Tensor, k: int, q_offset: int) -> Tensor:
    """R (..., n, 2k+1) read at the labels of index (n, m): (..., n, m)."""
    if atomic_free(r):
        return _GatherLabels.apply(r, index, k, q_offset)
    return r.gather(-1, index.expand(*r.shape[:-1], index.shape[-1]))


class _GatherLabels(torch.autograd.Function):
    """gather, whose gradient is summed per label without atomics."""

    @staticmethod
    def forward(ctx, r: Tensor, index: Tensor, k: int, q_offset: int) -> Tensor:
        ctx.k, ctx.q_offset = k, q_offset
        return r.gather(-1, index.expand(*r.shape[:-1], index.shape[-1]))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _sum_without_atomics(grad, ctx.k, ctx.q_offset), None, None, None


def _sum_without_atomics(x: Tensor, k: int, q_offset: int) -> Tensor:
    """sum_labels by a gather for the band and one batched product with the tails' masks."""
    n, m = x.shape[-2:]
    if k == 0:  # one label for every key
        return x.sum(-1, keepdim=True)
    lead = x.shape[:-1]
    i = torch.arange(q_offset, q_offset + n, device=x.device)[:, None]  # (n, 1) query positions
    j = i + torch.arange(-k + 1, k, device=x.device)  # (n, 2k - 1): the band's key of each label 1 .. 2k-1
    band = x.gather(-1, j.clamp(0, m - 1).expand(*lead, 2 * k - 1))
    band = band.masked_fill((j < 0) | (j >= m), 0)
    d = torch.arange(m, device=x.device) - i  # (n, m): j - i
    tails = torch.stack((d <= -k, d >= k), dim=-1).to(x.dtype)  # (n, m, 2): the lower and the upper tail
    rows = x.reshape(-1, n, m).transpose(0, 1)  # (n, B*H, m), a view where x is contiguous
    sums = _tail_sums(rows, tails).to(x.dtype).transpose(0, 1).reshape(*lead, 2)  # (..., n, 2)
    return torch.cat((sums[..., :1], band, sums[..., 1:]), dim=-1)


def _tail_sums(rows: Tensor, tails: Tensor) -> Tensor:
    """(n, B*H, m) @ (n, m, 2) in float32 or wider, whatever autocast or cuBLAS's flags say (the module's
    docstring): half-precision rows give a float32 product, written by the GEMM itself on CUDA."""
    with torch.autocast(rows.device.type, enabled=False):
        if rows.dtype not in (torch.float16, torch.bfloat16):
            return torch.bmm(rows, tails.to(rows.dtype))
        if rows.is_cuda:
            return torch.bmm(rows, tails.to(rows.dtype), out_dtype=torch.float32)
        return torch.bmm(rows.float(), tails.float())
