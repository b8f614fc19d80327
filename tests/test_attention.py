"""The efficient relative attention equals Shaw et al. §3 written out naively in float64.

The reference loops over (i, j), materialises a^K_ij and a^V_ij, and follows eqs. (3)-(4) of the
paper literally. The layer under test never builds those (n, m, d) tensors.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import RelativePositions, relative_index

pytestmark = pytest.mark.usefixtures("float64")


def naive_attention(mha: MultiHeadAttention, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor,
                    q_offset: int) -> torch.Tensor:
    """x: (B, n, d) queries, y: (B, m, d) keys/values input, keep: (B, n, m) bool."""
    B, n, d = x.shape
    m = y.shape[1]
    H, D = mha.n_heads, mha.d_head
    rel = mha.rel
    W_k, W_v = mha.kv_proj.weight.chunk(2)
    q = (x @ mha.q_proj.weight.T + mha.q_proj.bias).view(B, n, H, D)
    k = (y @ W_k.T).view(B, m, H, D)
    v = (y @ W_v.T + mha.v_bias).view(B, m, H, D)
    z = torch.zeros(B, n, H, D)
    for i in range(n):
        e = torch.full((B, H, m), float("-inf"))
        a_v = torch.zeros(m, H, D)
        for j in range(m):
            a_k = torch.zeros(H, D)
            if rel is not None:
                # a_ij = w_{clip(j - i, k)} (Shaw §3.2), with query i at absolute position i + q_offset
                kk = rel.max_relative_position
                label = max(-kk, min(kk, j - (i + q_offset))) + kk
                if rel.w_k is not None:
                    a_k = rel.w_k[:, label].expand(H, D)
                if rel.w_v is not None:
                    a_v[j] = rel.w_v[:, label].expand(H, D)
            # eq. (4): e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_z)
            score = ((q[:, i] * (k[:, j] + a_k)).sum(-1)) / D ** 0.5  # (B, H)
            e[:, :, j] = torch.where(keep[:, i, j, None], score, e[:, :, j])
        alpha = torch.softmax(e, dim=-1)  # (B, H, m)
        for j in range(m):
            # eq. (3): z_i = sum_j alpha_ij (v_j + a^V_ij)
            z[:, i] += alpha[:, :, j, None] * (v[:, j] + a_v[j])
    return z.reshape(B, n, d) @ mha.out_proj.weight.T + mha.out_proj.bias


def make_layer(k: int | None, keys: bool, values: bool, share: bool, d_model: int = 12,
               heads: int = 3) -> MultiHeadAttention:
    rel = None if k is None else RelativePositions(heads, d_model // heads, k, keys, values, share)
    mha = MultiHeadAttention(d_model, heads, dropout=0.0, rel=rel)
    with torch.no_grad():  # non-zero biases so that they are checked too
        for p in mha.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return mha.eval()


CASES = list(itertools.product(
    [0, 1, 2, 11],  # k: none, small, and larger than every distance here
    [(True, True), (True, False), (False, True)],  # (a^K, a^V)
    [False, True],  # heads share one table
    ["padding", "causal", "cross", "offset"],
))


@pytest.mark.parametrize("k,kv,share,mode", CASES)
def test_efficient_equals_naive_outputs_and_gradients(k, kv, share, mode):
    torch.manual_seed(hash((k, kv, share, mode)) % 2**31)
    mha = make_layer(k, *kv, share)
    B, n, m = 3, 7, 7
    q_offset, causal = 0, mode in ("causal", "offset")
    if mode == "cross":
        m = 5
    if mode == "offset":  # the last 3 queries of a causal sequence of 7 (a multi-token decode step)
        n, q_offset = 3, 4
    x = torch.randn(B, n, 12, requires_grad=True)
    y = torch.randn(B, m, 12, requires_grad=True) if mode == "cross" else None
    lengths = torch.tensor([m, m - 2, 1 if mode == "cross" else m - 3])
    pad_keep = torch.arange(m)[None, :] < lengths[:, None]  # (B, m)
    keep = pad_keep[:, None, :].expand(B, n, m)
    if causal:
        i = torch.arange(q_offset, q_offset + n)
        keep = keep & (torch.arange(m)[None, :] <= i[:, None])

    if mode == "offset":
        full = torch.cat((torch.randn(B, m - n, 12), x), dim=1)  # earlier positions + the queries
        kv_in = full
    else:
        kv_in = y if y is not None else x
    ref = naive_attention(mha, x, kv_in, keep, q_offset)
    out = mha(x, *mha.project_kv(kv_in), mask=pad_keep[:, None, None, :], causal=causal,
              q_offset=q_offset)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)

    w = torch.randn_like(ref)
    leaves = [x] + ([y] if y is not None else []) + list(mha.parameters())
    grads_ref = torch.autograd.grad((ref * w).sum(), leaves)
    grads = torch.autograd.grad((out * w).sum(), leaves)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-10)


def test_relative_index_clips_and_offsets():
    idx = relative_index(3, 5, max_relative_position=2)
    # row i holds clip(j - i, 2) + 2
    assert idx.tolist() == [[2, 3, 4, 4, 4], [1, 2, 3, 4, 4], [0, 1, 2, 3, 4]]
    # a decode step at t = 4 sees distances j - 4 for j = 0..4
    assert relative_index(1, 5, 2, q_offset=4).tolist() == [[0, 0, 0, 1, 2]]
    assert relative_index(2, 2, 0).tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize("kv", [(True, True), (True, False), (False, True)])
def test_zeroed_tables_equal_plain_attention(kv):
    torch.manual_seed(0)
    rel_layer = make_layer(3, *kv, share=False)
    plain = MultiHeadAttention(12, 3, dropout=0.0).eval()
    plain.load_state_dict({n: p for n, p in rel_layer.state_dict().items() if not n.startswith("rel.")})
    with torch.no_grad():
        for p in rel_layer.rel.parameters():
            p.zero_()
    x = torch.randn(2, 6, 12)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    for causal in (False, True):
        torch.testing.assert_close(
            rel_layer(x, *rel_layer.project_kv(x), mask=keep, causal=causal),
            plain(x, *plain.project_kv(x), mask=keep, causal=causal), rtol=1e-12, atol=1e-12)


def test_tables_are_separate_and_shaped_by_sharing():
    per_head = RelativePositions(n_heads=4, d_head=8, max_relative_position=3)
    shared = RelativePositions(n_heads=4, d_head=8, max_relative_position=3, share_heads=True)
    assert per_head.w_k.shape == per_head.w_v.shape == (4, 7, 8)
    assert shared.w_k.shape == (1, 7, 8)
    assert per_head.w_k.data_ptr() != per_head.w_v.data_ptr()
    assert RelativePositions(4, 8, 3, keys=False).w_k is None
    with pytest.raises(ValueError, match="max_relative_position"):
        RelativePositions(4, 8, -1)
