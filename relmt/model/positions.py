"""Where the model's position information comes from.

One enum picks the source (`relmt.config.PosKind`):
- absolute sinusoidal encodings added to the input embeddings (Vaswani et al. 2017 §3.5);
- relative position representations inside self-attention (Shaw et al. 2018 §3): per-layer
  tables, `RelativePositions`;
- beyond the paper, three methods of one stack each (encoder or decoder self-attention, never
  cross-attention): rotary embeddings (`Rotary`, Su et al. 2021), linear biases (`ALiBi`, Press
  et al. 2022) and T5's bucketed biases (`T5Bias`, Raffel et al. 2020). Each gives attention its
  `PositionTerms` through one method, `terms(n, m, q_offset, device, dtype)`, computed once per
  stack and pass, so attention has no branch per method: it rotates q and the new keys when the
  terms have a rotation, and adds a logits bias when they have one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmt.model.labels import gather_labels, sum_labels


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

    def key_logits(self, q: Tensor, index: Tensor, q_offset: int) -> Tensor:
        """Shaw §3.3, eq. (5) second term: q_i · a^K_ij for all (i, j).

        q: (B, H, n, D), index: (n, m), the labels of query positions q_offset.. R = q · (w^K)^T is
        (B, H, n, 2k+1); gathering R at the labels of the index gives (B, H, n, m) (relmt/model/labels.py).
        """
        assert self.w_k is not None
        if q.shape[2] == 1 and in_graph():
            # A compiled decoder step (one query row): a broadcast multiply and a sum over (B, H, 1, 2k+1, D)
            # elements, which the compiler (engine=aoti) computes in its own fused loops, instead of a batched
            # GEMM call for a (4, 64) x (64, 2k+1) product (issue 44 §7). Eager torch would write that product
            # out, so it keeps the einsum; value_term does the same.
            r = (q[:, :, :, None, :] * self.w_k[None, :, None]).sum(-1)  # (B, H, 1, 2k+1)
        else:
            r = _per_label(q, self.w_k, "bhnd,hrd->bhnr", "bhnd,rd->bhnr")  # (B, H, n, 2k+1)
        return gather_labels(r, index, self.max_relative_position, q_offset)  # (B, H, n, m)

    def value_term(self, attn: Tensor, index: Tensor, q_offset: int) -> Tensor:
        """Shaw §3.1, eq. (3) second term: sum_j alpha_ij a^V_ij.

        attn: (B, H, n, m) attention weights, index: their (n, m) labels. Adding alpha up per label
        gives S (B, H, n, 2k+1) with S_ir = sum over j with label r of alpha_ij (relmt/model/labels.py);
        then S · w^V. Returns (B, H, n, D).
        """
        assert self.w_v is not None
        buckets = sum_labels(attn, index, self.max_relative_position, q_offset)  # (B, H, n, 2k+1)
        if attn.shape[2] == 1 and in_graph():  # a compiled decoder step: see key_logits
            return (buckets[..., None] * self.w_v[None, :, None]).sum(-2)  # (B, H, 1, D)
        return _per_label(buckets, self.w_v, "bhnr,hrd->bhnd", "bhnr,rd->bhnd")  # (B, H, n, D)


def in_graph() -> bool:
    """Whether this code is being traced into a compiled graph (torch.compile, torch.export)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _per_label(x: Tensor, table: Tensor, per_head: str, shared: str) -> Tensor:
    """Contract x with a (heads, 2k+1, D) table, or a (1, 2k+1, D) one shared by all heads.

    einsum contracts per head without materialising the table broadcast over the batch, which a
    broadcasting matmul does (3x slower and 2x the memory here on CPU).
    """
    if table.shape[0] == 1:
        return torch.einsum(shared, x, table[0])
    return torch.einsum(per_head, x, table)


@dataclass(frozen=True)
class PositionTerms:
    """What self-attention takes from a stack's position method, for n query positions
    q_offset..q_offset+n-1 against m keys 0..m-1 (the n new keys sit at the query positions).

    rotary: (cos, sin) of pos * theta_i, (n, d_head / 2) each: rotate q and the new keys (`rotate`).
    bias: (H, n, m), added to the scaled logits q·k / sqrt(d_z)."""

    rotary: tuple[Tensor, Tensor] | None = None
    bias: Tensor | None = None


NO_TERMS = PositionTerms()


def rotate(x: Tensor, rotary: tuple[Tensor, Tensor] | None) -> Tensor:
    """Su et al. 2021 eq. (34): each pair of neighbouring dimensions (2i, 2i + 1) turned by the angle
    pos * theta_i. x: (B, H, n, D); rotary: (cos, sin) of those angles, (n, D/2) each. Eagerly, one complex
    multiplication per pair (as Llama's reference code does: half the memory passes of real arithmetic);
    bf16 and fp16, which have no complex type here, rotate in float32. Under torch.compile and export
    (ONNX has no complex numbers) the same rotation in real arithmetic."""
    if rotary is None:
        return x
    cos, sin = rotary
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if torch.compiler.is_compiling():
        pairs = work.unflatten(-1, (-1, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        cos, sin = cos.to(work.dtype), sin.to(work.dtype)
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
    pairs = work.unflatten(-1, (-1, 2))
    if pairs.storage_offset() % 2 or any(stride % 2 for stride in pairs.stride()[:-1]):
        pairs = pairs.contiguous()  # view_as_complex needs whole complex numbers in memory
    turn = torch.complex(cos.to(work.dtype), sin.to(work.dtype))
    return torch.view_as_real(torch.view_as_complex(pairs) * turn).flatten(-2).to(x.dtype)


class Rotary(nn.Module):
    """RoPE (Su et al. 2021): no parameters; theta_i = base^(-2i / D), i < D / 2, base 10000."""

    def __init__(self, d_head: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary embeddings need an even d_head, got {d_head}")
        self.d_head, self.base = d_head, base

    def terms(self, n: int, m: int, q_offset: int, device: torch.device, dtype: torch.dtype) -> PositionTerms:
        # float64 angles: pos * theta in float32 is off by ~1e-4 rad at position 1000; cos and sin are then
        # rounded once, to float32 (float64 for float64 models)
        inv_freq = self.base ** (-torch.arange(0, self.d_head, 2, device=device, dtype=torch.float64) / self.d_head)
        angles = torch.arange(q_offset, q_offset + n, device=device, dtype=torch.float64)[:, None] * inv_freq
        keep = torch.float64 if dtype == torch.float64 else torch.float32
        return PositionTerms(rotary=(angles.cos().to(keep), angles.sin().to(keep)))


def distances(n: int, m: int, q_offset: int, device: torch.device) -> Tensor:
    """(n, m) int64: j - i for query positions i = q_offset.. and key positions j = 0.."""
    i = torch.arange(q_offset, q_offset + n, device=device)
    return torch.arange(m, device=device)[None, :] - i[:, None]


class _CachedBias(nn.Module):
    """A bias that depends on the distance j - i alone, in two parts: an index of distances that holds no
    parameter (|j - i| for ALiBi, T5's bucket), and the lookup of the weights at that index. The index of n
    queries from q_offset against m keys is the window [q_offset:q_offset + n, :m] of one square (L, L)
    index: one tensor per stack, grown (to the next power of two) when a longer pass comes, serves every
    shape and decoding step (the a^K route's per-length reuse). The lookup (a multiply for ALiBi, a gather
    for T5) runs at every call, so the bias follows every change of the weights, however it was made: an
    earlier cache of the bias itself, keyed on the weights' versions, went stale after a fused Adam step or
    `p.data.copy_()`, which keep the version (issue 42 §4)."""

    def __init__(self) -> None:
        super().__init__()
        self._index: Tensor | None = None  # (L, L) int64, on the last pass's device

    def index(self, n: int, m: int, q_offset: int, device: torch.device) -> Tensor:
        """(n, m) int64, parameter-free: what the bias of (query q_offset + i, key j) is looked up by."""
        raise NotImplementedError

    def lookup(self, index: Tensor) -> Tensor:
        """(n, m) index -> (H, n, m) bias."""
        raise NotImplementedError

    def bias(self, n: int, m: int, q_offset: int, device: torch.device) -> Tensor:
        return self.lookup(self.index(n, m, q_offset, device))

    def terms(self, n: int, m: int, q_offset: int, device: torch.device, dtype: torch.dtype) -> PositionTerms:
        if torch.compiler.is_compiling():
            return PositionTerms(bias=self.bias(n, m, q_offset, device).to(dtype))
        need = max(q_offset + n, m)
        if self._index is None or self._index.device != device or self._index.shape[-1] < need:
            size = 1 << max(need - 1, 1).bit_length()
            self._index = self.index(size, size, 0, device)
        return PositionTerms(bias=self.lookup(self._index[q_offset:q_offset + n, :m]).to(dtype))


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al. 2022 §3: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8); for a head count
    that is no power of 2, the nearest power's slopes and every other slope of twice it (their code)."""
    if math.log2(n_heads).is_integer():
        return [2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)]
    power = 2 ** math.floor(math.log2(n_heads))
    return alibi_slopes(power) + alibi_slopes(2 * power)[0::2][: n_heads - power]


class ALiBi(_CachedBias):
    """ALiBi: bias_h(i, j) = -m_h |i - j|, fixed slopes m_h (`alibi_slopes`). The paper defines the
    causal case, -m_h (i - j) for j <= i; the encoder uses the symmetric -m_h |i - j|, the choice of the
    paper's authors for bidirectional models (ofirpress/attention_with_linear_biases, issue 5). In the
    decoder the two agree, since causality masks j > i."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def index(self, n: int, m: int, q_offset: int, device: torch.device) -> Tensor:
        return distances(n, m, q_offset, device).abs()

    def lookup(self, index: Tensor) -> Tensor:
        return -self.slopes.to(index.device)[:, None, None] * index


def t5_buckets(relative: Tensor, bidirectional: bool, n_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each distance j - i (Raffel et al. 2020 §2.1; transformers' T5Attention): half
    the buckets (bidirectional: per direction) hold distances 0..b/2-1 exactly, the rest grow
    logarithmically up to max_distance, beyond which all share the last bucket. Causal: j > i is
    bucket 0 (masked anyway)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        buckets += (relative > 0).long() * n_buckets
        relative = relative.abs()
    else:
        relative = -relative.clamp(max=0)
    exact = n_buckets // 2
    large = exact + (torch.log(relative.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (n_buckets - exact)).long()
    return buckets + torch.where(relative < exact, relative, large.clamp(max=n_buckets - 1))


class T5Bias(_CachedBias):
    """T5's relative attention bias: a learned scalar per head and distance bucket (`t5_buckets`), one
    table per stack shared by its layers, as in T5 (where only the first layer holds it); initialised
    N(0, d_model^-1/2) as transformers' T5 does."""

    def __init__(self, n_heads: int, d_model: int, bidirectional: bool, n_buckets: int = 32,
                 max_distance: int = 128) -> None:
        super().__init__()
        self.bidirectional, self.n_buckets, self.max_distance = bidirectional, n_buckets, max_distance
        self.table = nn.Embedding(n_buckets, n_heads)
        nn.init.normal_(self.table.weight, std=d_model ** -0.5)

    def index(self, n: int, m: int, q_offset: int, device: torch.device) -> Tensor:
        return t5_buckets(distances(n, m, q_offset, device), self.bidirectional, self.n_buckets, self.max_distance)

    def lookup(self, index: Tensor) -> Tensor:
        return self.table(index).permute(2, 0, 1)  # (H, n, m)
