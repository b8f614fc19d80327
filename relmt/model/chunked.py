"""The "chunked" attention route: the written-out attention of `MultiHeadAttention`, one block of c
queries at a time, exact on every device, with no (B, H, n, m) tensor alive.

Shaw et al. 2018 §3.3 computes relative attention in two terms per equation:
    eq. (4)  e_ij  = (q_i·k_j + q_i·a^K_ij) / sqrt(d_z)            (+ an ALiBi or T5 bias, beyond the paper)
    eq. (3)  z_i   = sum_j alpha_ij v_j + sum_j alpha_ij a^V_ij,   alpha_i = softmax(e_i)
Every query row i is independent of the others, so the rows split into blocks [i0, i0 + c) without any
change to the arithmetic. Each block runs under `torch.utils.checkpoint` (non-reentrant, RNG state
preserved): autograd keeps only the block's inputs (views of q, k, v and the bias), and backward
recomputes the block's (B, H, c, m) logits and weights, drawing the same attention-dropout mask again.
Peak memory is O(B·H·c·m) instead of the reference route's O(B·H·n·m), for one extra forward pass of the
attention core in backward.

c comes from a memory budget (`BLOCK_BYTES`, for the few (B, H, c, m) buffers one block has alive).
Without gradients (inference) the blocks run plainly, one after the other.

Dropout: a block draws its own (B, H, c, m) mask, so at p > 0 the masks differ from the reference route's
one (B, H, n, m) draw (the same distribution, other samples); at p = 0 both routes compute the same values.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from relmt.dropout import dropout
from relmt.model.positions import RelativePositions

# Bytes of (B, H, c, m) buffers one block may have alive (logits, weights, their gradients, the dropout mask).
BLOCK_BYTES = 64 * 2**20
_BUFFERS = 4  # how many (B, H, c, m) buffers a block's backward holds at once, about
_MIN_ROWS = 16  # fewer rows per block only pay Python overhead


def block_rows(b: int, h: int, n: int, m: int, itemsize: int, budget: int | None = None) -> int:
    """Query rows per block: the largest power of two (at least 16) whose buffers fit the budget, at most n."""
    per_row = _BUFFERS * b * h * m * itemsize
    rows = max(1, (BLOCK_BYTES if budget is None else budget) // max(per_row, 1))
    rows = max(_MIN_ROWS, 1 << (rows.bit_length() - 1))
    return min(n, rows)


def _rows(t: Tensor | None, i0: int, i1: int, n: int) -> Tensor | None:
    """Rows i0:i1 of a tensor broadcastable to (..., n, m); a dimension of 1 broadcasts and is kept."""
    if t is None or t.dim() < 2 or t.shape[-2] == 1:
        return t
    assert t.shape[-2] == n, f"expected {n} query rows, got shape {tuple(t.shape)}"
    return t[..., i0:i1, :]


def _keep(mask: Tensor | None, causal: bool, c: int, m: int, q_offset: int, device: torch.device) -> Tensor | None:
    """The block's keep-mask: padding rows combined with causality (query row i is position i + q_offset).
    attention.keep_mask's few lines again: attention.py imports the routes, so they cannot import it back."""
    if not causal or (c == 1 and q_offset + 1 >= m):
        return mask
    i = torch.arange(q_offset, q_offset + c, device=device)
    tril = torch.arange(m, device=device)[None, :] <= i[:, None]  # (c, m)
    return tril if mask is None else mask & tril


def _block(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, rel: RelativePositions | None,
           causal: bool, q_offset: int, p: float) -> Tensor:
    """One block of c query rows, written out as the reference route writes it. q: (B, H, c, D) scaled by
    1/sqrt(d_z); k, v: (B, H, m, D); bias: broadcastable to (B, H, c, m). Returns (B, H, c, D)."""
    c, m = q.shape[2], k.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, c, m)
    index = None
    if rel is not None:
        index = rel.index(c, m, q_offset, q.device)  # (c, m) labels clip(j - i, k) + k
        if rel.w_k is not None:  # Shaw §3.3: the q_i·a^K_ij term of eq. (4)
            scores += rel.key_logits(q, index, q_offset)
    if bias is not None:
        scores += bias
    keep = _keep(mask, causal, c, m, q_offset, q.device)
    if keep is not None:
        scores.masked_fill_(~keep, float("-inf"))
    attn = dropout(torch.softmax(scores, dim=-1), p)  # alpha_ij
    z = torch.matmul(attn, v)  # Shaw eq. (3), first term
    if rel is not None and rel.w_v is not None:
        z = z + rel.value_term(attn, index, q_offset)  # second term: sum_j alpha_ij a^V_ij
    return z


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, rel: RelativePositions | None, bias: Tensor | None,
                      mask: Tensor | None, causal: bool, q_offset: int, p: float, rows: int | None = None) -> Tensor:
    """Attention with Shaw's terms (when `rel` has tables) and an additive logits bias, in blocks of `rows`
    query rows (default: `block_rows`). q: (B, H, n, D) already scaled; k, v: (B, H, m, D); bias: (H, n, m)
    or broadcastable to (B, H, n, m); mask: bool keep-mask broadcastable to (B, 1, n, m); query row i is
    position i + q_offset. Returns (B, H, n, D)."""
    b, h, n, _ = q.shape
    m = k.shape[2]
    c = rows or block_rows(b, h, n, m, q.element_size())
    tensors = [q, k, v, bias, *(rel.parameters() if rel is not None else ())]
    recompute = c < n and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    blocks = []
    for i0 in range(0, n, c):
        i1 = min(n, i0 + c)
        args = (q[:, :, i0:i1], k, v, _rows(bias, i0, i1, n), _rows(mask, i0, i1, n), rel, causal, q_offset + i0, p)
        if recompute:
            blocks.append(checkpoint(_block, *args, use_reentrant=False, preserve_rng_state=True))
        else:
            blocks.append(_block(*args))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)
