"""Where the model's position information comes from.

Two sources, picked by one enum (`relmt.config.PosKind`):
- absolute sinusoidal encodings added to the input embeddings (Vaswani et al. 2017 §3.5);
- relative position representations inside self-attention (Shaw et al. 2018 §3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_encoding(positions: Tensor, d_model: int) -> Tensor:
    """Vaswani §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same).

    positions: (T,) integer positions. Returns (T, d_model) float32. Computed on the fly, so there
    is no maximum length: a decode step asks for a single row.
    """
    half = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(half * (-math.log(10000.0) / d_model))  # (d/2,)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, d/2)
    pe = torch.empty(positions.shape[0], d_model, device=positions.device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def relative_index(q_len: int, k_len: int, max_relative_position: int, q_offset: int = 0,
                   device: torch.device | None = None) -> Tensor:
    """Shaw §3.2: the label of edge (i, j) is clip(j - i, k) + k, an index into 2k+1 table rows.

    Query row i sits at absolute position i + q_offset, so an incremental decoding step t passes
    q_len=1, q_offset=t and gets the single row of distances j - t (the cache must know t).
    Returns (q_len, k_len) int64.
    """
    k = max_relative_position
    i = torch.arange(q_offset, q_offset + q_len, device=device)
    j = torch.arange(k_len, device=device)
    return (j[None, :] - i[:, None]).clamp(-k, k) + k


class RelativePositions(nn.Module):
    """One layer's edge tables w^K and w^V of shape (heads, 2k+1, d_head) (Shaw §3.2).

    a^K_ij = w^K_{clip(j-i,k)} and a^V_ij = w^V_{clip(j-i,k)} are two separate tables, as in the
    paper and tensor2tensor (OpenNMT-py ties them into one). With `share_heads` one table serves
    every head (the paper's big model, §4.1); otherwise each head has its own (the base model).
    `keys` / `values` switch a^K and a^V for the ablation of Table 3.

    Neither method builds the (n, n, d_head) tensor of a_ij: both work in the 2k+1 label space and
    move between labels and key positions by a gather or a scatter-add over the index matrix.
    """

    def __init__(self, n_heads: int, d_head: int, max_relative_position: int, keys: bool = True,
                 values: bool = True, share_heads: bool = False) -> None:
        super().__init__()
        if max_relative_position < 0:
            raise ValueError(f"max_relative_position must be >= 0, got {max_relative_position}")
        self.max_relative_position = max_relative_position
        n_tables = 1 if share_heads else n_heads
        shape = (n_tables, 2 * max_relative_position + 1, d_head)
        self.w_k = nn.Parameter(torch.empty(shape)) if keys else None
        self.w_v = nn.Parameter(torch.empty(shape)) if values else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.w_k, self.w_v):
            if w is not None:
                nn.init.normal_(w, std=w.shape[-1] ** -0.5)

    def index(self, q_len: int, k_len: int, q_offset: int, device: torch.device) -> Tensor:
        return relative_index(q_len, k_len, self.max_relative_position, q_offset, device)

    def key_logits(self, q: Tensor, index: Tensor) -> Tensor:
        """Shaw §3.3, eq. (5) second term: q_i · a^K_ij for all (i, j).

        q: (B, H, n, D), index: (n, m). R = q · (w^K)^T is (B, H, n, 2k+1); gathering R at the
        labels of the index gives (B, H, n, m).
        """
        assert self.w_k is not None
        r = _per_label(q, self.w_k, "bhnd,hrd->bhnr", "bhnd,rd->bhnr")  # (B, H, n, 2k+1)
        return r.gather(-1, index.expand(*r.shape[:-1], index.shape[-1]))  # (B, H, n, m)

    def value_term(self, attn: Tensor, index: Tensor) -> Tensor:
        """Shaw §3.1, eq. (3) second term: sum_j alpha_ij a^V_ij.

        attn: (B, H, n, m) attention weights. Scatter-adding alpha into the 2k+1 label buckets
        gives S (B, H, n, 2k+1) with S_ir = sum over j with label r of alpha_ij; then S · w^V.
        Returns (B, H, n, D).
        """
        assert self.w_v is not None
        buckets = attn.new_zeros(*attn.shape[:-1], self.w_v.shape[1])  # (B, H, n, 2k+1)
        buckets.scatter_add_(-1, index.expand_as(attn), attn)
        return _per_label(buckets, self.w_v, "bhnr,hrd->bhnd", "bhnr,rd->bhnd")  # (B, H, n, D)


def _per_label(x: Tensor, table: Tensor, per_head: str, shared: str) -> Tensor:
    """Contract x with a (heads, 2k+1, D) table, or a (1, 2k+1, D) one shared by all heads.

    einsum contracts per head without materialising the table broadcast over the batch, which a
    broadcasting matmul does (3x slower and 2x the memory here on CPU).
    """
    if table.shape[0] == 1:
        return torch.einsum(shared, x, table[0])
    return torch.einsum(per_head, x, table)
