"""Multi-head attention, with Shaw et al.'s relative position terms when given a table set, and a
stack's `PositionTerms` (rotation, logits bias) in self-attention.

The module takes keys and values already projected (`project_kv`), so the decoder can hand it
cached ones during incremental decoding. Three routes, all exact:
- no logits term: fused `scaled_dot_product_attention` (absolute/none/rope modes, cross-attention);
- a logits bias (q·a^K, ALiBi, T5): an additive float mask, so the fused kernel still serves;
- a^V on: the weights alpha are needed explicitly for sum_j alpha_ij a^V_ij, so attention is
  written out (Shaw §3.3), still without any (n, n, d) tensor.
These are the reference route. Where the (B, H, n, m) logits would be large, relmt/model/routes.py
hands relative and biased self-attention to a route without them (chunked rows, or FlexAttention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmt.dropout import dropout
from relmt.model import routes
from relmt.model.linear import Linear, linear
from relmt.model.positions import NO_TERMS, PositionTerms, RelativePositions, rotate


def keep_mask(mask: Tensor | None, causal: bool, q_len: int, k_len: int, q_offset: int,
              device: torch.device) -> Tensor | None:
    """Combine a padding keep-mask (broadcastable to (B, 1, n, m), True = attend) with causality.

    Query row i sits at position i + q_offset and may see keys j <= i + q_offset.
    """
    if not causal or (q_len == 1 and q_offset + 1 >= k_len):
        return mask
    i = torch.arange(q_offset, q_offset + q_len, device=device)
    j = torch.arange(k_len, device=device)
    tril = j[None, :] <= i[:, None]  # (n, m)
    return tril if mask is None else mask & tril


class MultiHeadAttention(nn.Module):
    """Vaswani §3.2.2 multi-head attention; Shaw §3.1 relative terms when `rel` is given."""

    def __init__(self, d_model: int, n_heads: int, dropout: float,
                 rel: RelativePositions | None = None) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.q_proj = Linear(d_model, d_model)
        # W^K and W^V in one matmul. No key bias: q·b^K is the same for every key j, so the softmax
        # cancels it; its gradient is zero up to rounding, which Adam would turn into noisy updates.
        self.kv_proj = Linear(d_model, 2 * d_model, bias=False)
        self.v_bias = nn.Parameter(torch.zeros(d_model))
        self.out_proj = Linear(d_model, d_model)
        self.rel = rel
        # export only (`freeze_projections`): the scaled W^Q and the concatenated W^Q|W^K|W^V as modules
        self.frozen: nn.ModuleDict | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier-uniform per d_model x d_model projection (fused W^K|W^V initialised as two).
        for w in (self.q_proj.weight, *self.kv_proj.weight.chunk(2), self.out_proj.weight):
            nn.init.xavier_uniform_(w)
        for b in (self.q_proj.bias, self.v_bias, self.out_proj.bias):
            nn.init.zeros_(b)

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, D)

    def scaled_query_weights(self) -> tuple[Tensor, Tensor]:
        """W^Q and b^Q times 1/sqrt(d_z) (Shaw eq. (4)), computed at every call, in training and
        decoding alike, so both compute bitwise the same queries. Nothing is kept between calls: a
        copy keyed on the weights' versions went stale after weight changes that keep the version
        (a fused Adam step, `p.data.copy_()`, `load_state_dict(assign=True)`, `.half().float()`;
        issue 42 §4), and it saved 0.2-0.5% of beam decoding time at 32 sentences per batch, 2-4%
        one sentence at a time (one thread). Under torch.compile with freezing the product folds
        into a constant (relmt/decode/compiled.py)."""
        s = self.d_head ** -0.5
        return self.q_proj.weight * s, self.q_proj.bias * s

    def freeze_projections(self) -> None:
        """For an exported copy of the model whose linear maps become modules of another kind (int8,
        relmt/export/quantize.py): the projections computed at every call (the scaled W^Q, and W^Q|W^K|W^V
        with their biases) as Linear modules holding those products once. Never on a model that trains: they
        are copies, and would go stale."""
        w_q, b_q = self.scaled_query_weights()
        q = Linear(w_q.shape[1], w_q.shape[0])
        q.weight, q.bias = nn.Parameter(w_q.detach().clone()), nn.Parameter(b_q.detach().clone())
        w = torch.cat((w_q, self.kv_proj.weight)).detach()
        qkv = Linear(w.shape[1], w.shape[0])
        qkv.weight = nn.Parameter(w.clone())
        qkv.bias = nn.Parameter(torch.cat((b_q, torch.zeros_like(b_q), self.v_bias)).detach().clone())
        self.frozen = nn.ModuleDict({"q": q, "qkv": qkv})

    def query(self, x: Tensor) -> Tensor:
        """x (B, n, d_model) -> the queries x W^Q / sqrt(d_z) + b^Q / sqrt(d_z), (B, n, d_model)."""
        if self.frozen is not None:
            return self.frozen["q"](x)
        return linear(x, *self.scaled_query_weights())

    def project_kv(self, y: Tensor, terms: PositionTerms = NO_TERMS) -> tuple[Tensor, Tensor]:
        """y: (B, m, d_model) -> keys and values, each (B, H, m, D); keys rotated by `terms` (the new
        keys sit at the query positions of self-attention, so a cache holds rotated keys)."""
        k, v = self.kv_proj(y).chunk(2, dim=-1)
        # under autocast the projection is bf16 and b^V float32: the sum goes back to k's dtype, as project_qkv's
        # (SDPA and the matmuls would cast it; FlexAttention takes q, k and v of one dtype)
        return rotate(self._split(k), terms.rotary), self._split((v + self.v_bias).to(v.dtype))

    def project_qkv(self, x: Tensor, terms: PositionTerms = NO_TERMS) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries (as `forward` makes them), keys and values (as `project_kv`) of x
        (B, n, d_model) in one GEMM over the weights concatenated. For a compiled decoder step, where the
        concatenation folds into a constant: at one sentence a GEMM call costs about as much as its weights
        take to read, so two calls cost twice one (issue 44 §7)."""
        if self.frozen is not None:
            q, k, v = self.frozen["qkv"](x).chunk(3, dim=-1)
        else:
            w_q, b_q = self.scaled_query_weights()
            bias = torch.cat((b_q, torch.zeros_like(b_q), self.v_bias))  # no key bias (see __init__)
            q, k, v = linear(x, torch.cat((w_q, self.kv_proj.weight)), bias).chunk(3, dim=-1)
        return rotate(self._split(q), terms.rotary), rotate(self._split(k), terms.rotary), self._split(v)

    def probabilities(self, x: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """The attention weights alpha_ij (B, H, n, m) of queries x (B, n, d_model) over keys k (B, H, m, D), for
        attention without positions (cross-attention, Shaw §3): softmax of q_i·k_j / sqrt(d_z), masked by the
        keep-mask. The weights `forward` averages the values with, computed apart (word alignments, issue 60)."""
        q = self._split(self.query(x))
        logits = (q @ k.transpose(-1, -2)).float()
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                causal: bool = False, q_offset: int = 0, terms: PositionTerms = NO_TERMS,
                q: Tensor | None = None, written: bool = False) -> Tensor:
        """x: (B, n, d_model) queries; k, v: (B, H, m, D); mask: bool keep-mask broadcastable
        to (B, 1, n, m). Query row i is position i + q_offset (for relative distances and
        causality); `terms` are the stack's rotation and logits bias for these positions; q: the
        queries (B, H, n, D) where `project_qkv` made them; written: softmax(q k^T) v written out instead of
        scaled_dot_product_attention (a compiled decoder step: at a few queries per sentence, SDPA's CPU kernel
        costs more than the products it does; docs/results/engines/step_profile.md). Returns (B, n, d_model)."""
        # The 1/sqrt(d_z) of Shaw eq. (4) is folded into W^Q and b^Q: a (d, d) multiply instead of
        # a scaled copy of q, and both terms of e_ij get it. The fused kernels then use scale=1.
        if q is None:
            q = rotate(self._split(self.query(x)), terms.rotary)  # (B, H, n, D)
        n, m = q.shape[2], k.shape[2]
        p = self.dropout if self.training else 0.0
        if (self.rel is not None or terms.bias is not None) and (route := routes.choose(q, m, p)) != "reference":
            # the same attention without the (B, H, n, m) logits: blocks of rows, or FlexAttention (routes.py)
            z = routes.attend(route, q, k, v, self.rel, terms.bias, mask, causal, q_offset, p)  # (B, H, n, D)
            return self.out_proj(z.transpose(1, 2).reshape(x.shape[0], n, -1))
        rel, bias, index = self.rel, terms.bias, None  # bias: (H, n, m) or None
        if rel is not None:
            index = rel.index(n, m, q_offset, q.device)  # (n, m) labels clip(j - i, k) + k
            if rel.w_k is not None and rel.w_v is None:
                # Shaw §3.3: e_ij = (q_i·k_j + q_i·a^K_ij) / sqrt(d_z); the second term is a bias.
                logits = rel.key_logits(q, index, q_offset)
                bias = logits if bias is None else bias + logits
        if rel is not None and rel.w_v is not None:
            z = self._relative(q, k, v, keep_mask(mask, causal, n, m, q_offset, q.device), index, q_offset, bias, p)
        elif bias is None and causal and mask is None and q_offset == 0 and n == m and n > 1:
            # a Python branch, not is_causal=n > 1: with symbolic sizes (compiled training) that is a SymBool,
            # which SDPA refuses, and the graph would break in every decoder layer
            z = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=1.0)
        else:
            keep = keep_mask(mask, causal, n, m, q_offset, q.device)
            if bias is not None and keep is not None:
                bias = bias.masked_fill(~keep, float("-inf"))
            if written and not p:  # Vaswani eq. (1): softmax(q k^T) v, the scale folded into W^Q
                scores = torch.matmul(q, k.transpose(-1, -2))
                if bias is not None:  # masked above
                    scores = scores + bias
                elif keep is not None:
                    scores = scores.masked_fill(~keep, float("-inf"))
                z = torch.matmul(torch.softmax(scores, dim=-1), v)
            else:
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=keep if bias is None else bias, dropout_p=p,
                                                   scale=1.0)
        b = x.shape[0]
        return self.out_proj(z.transpose(1, 2).reshape(b, n, -1))

    def _relative(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, index: Tensor, q_offset: int,
                  bias: Tensor | None, p: float) -> Tensor:
        """Attention written out for a^V; q is already scaled by 1/sqrt(d_z). Returns (B, H, n, D)."""
        rel = self.rel
        # Shaw §3.1 eq. (4): e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z)
        # At long n the (B, H, n, m) buffers dominate memory, so the q·a^K term is added and the
        # mask applied in place (autograd saves neither buffer): two of them alive at once, not three.
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, n, m)
        if rel.w_k is not None:
            scores += rel.key_logits(q, index, q_offset)
        if bias is not None:
            scores += bias
        if keep is not None:
            scores.masked_fill_(~keep, float("-inf"))
        attn = dropout(torch.softmax(scores, dim=-1), p)  # alpha_ij
        # Shaw §3.1 eq. (3): z_i = sum_j alpha_ij (x_j W^V + a^V_ij)
        return torch.matmul(attn, v) + rel.value_term(attn, index, q_offset)

