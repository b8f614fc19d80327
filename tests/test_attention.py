"""The efficient relative attention equals Shaw et al. §3 written out naively.

The reference loops over (i, j), materialises a^K_ij and a^V_ij, and follows eqs. (3)-(4) of the
paper literally. The layer under test never builds those (n, m, d) tensors. It is pinned in float64
(to rounding) and in float32, the precision training uses on CPU, through the routes training takes.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from relmt.dropout import keep_mask as dropout_keep_mask
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import RelativePositions, relative_index


def naive_attention(mha: MultiHeadAttention, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor,
                    q_offset: int, dropped: torch.Tensor | None = None) -> torch.Tensor:
    """x: (B, n, d) queries, y: (B, m, d) keys/values input, keep: (B, n, m) bool. `dropped`, if given,
    multiplies the attention weights alpha (B, H, n, m): a dropout mask already scaled by 1 / (1 - p)."""
    B, n, d = x.shape
    m = y.shape[1]
    H, D = mha.n_heads, mha.d_head
    rel = mha.rel
    W_k, W_v = mha.kv_proj.weight.chunk(2)
    q = (x @ mha.q_proj.weight.T + mha.q_proj.bias).view(B, n, H, D)
    k = (y @ W_k.T).view(B, m, H, D)
    v = (y @ W_v.T + mha.v_bias).view(B, m, H, D)
    z = torch.zeros(B, n, H, D, dtype=x.dtype)
    for i in range(n):
        e = torch.full((B, H, m), float("-inf"), dtype=x.dtype)
        a_v = torch.zeros(m, H, D, dtype=x.dtype)
        for j in range(m):
            a_k = torch.zeros(H, D, dtype=x.dtype)
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
        if dropped is not None:  # dropout on the weights, before both terms of eq. (3)
            alpha = alpha * dropped[:, :, i]
        for j in range(m):
            # eq. (3): z_i = sum_j alpha_ij (v_j + a^V_ij)
            z[:, i] += alpha[:, :, j, None] * (v[:, j] + a_v[j])
    return z.reshape(B, n, d) @ mha.out_proj.weight.T + mha.out_proj.bias


def make_layer(k: int | None, keys: bool, values: bool, share: bool, d_model: int = 12,
               heads: int = 3, dropout: float = 0.0) -> MultiHeadAttention:
    rel = None if k is None else RelativePositions(heads, d_model // heads, k, keys, values, share)
    mha = MultiHeadAttention(d_model, heads, dropout=dropout, rel=rel)
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


@pytest.mark.usefixtures("float64")
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


@pytest.mark.usefixtures("float64")
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


# --- float32, through the routes training takes -------------------------------------------------
# MultiHeadAttention picks its route from the table set: no tables (abs positions, and every
# cross-attention) -> fused SDPA; a^K only -> SDPA with q·a^K as a float bias; a^V on -> attention
# written out (Shaw §3.3). Training calls it as: encoder self-attention with a padding mask; decoder
# self-attention with causal=True and no mask (so abs takes SDPA's is_causal kernel); cross-attention
# with the source padding mask.
#
# Dropout in train mode: the written-out route draws its mask from relmt.dropout, which takes it from
# the default generator, so reseeding replays the very mask and the reference applies it (p = 0.1).
# The SDPA routes drop inside the kernel, whose mask cannot be replayed; there the layer runs in train
# mode with attention dropout 0, which is the same kernel call training makes, minus the mask.
#
# Tolerances (rtol = atol): float32 has eps 1.2e-7. Over 200 seeds of every case below, the smallest
# tolerance that passed was 8.7e-7 for outputs and 6.1e-6 for gradients (parameter gradients sum
# over B x n positions, so they round more). 5e-6 and 3e-5 leave a margin of about 5x, and stay far
# below the error of a real mistake (a wrong distance label or a missing bias moves outputs by ~1e-1).
F32_ROUTES = {  # route: (k, a^K, a^V)
    "abs": (None, False, False),  # fused SDPA (also every cross-attention)
    "keys": (4, True, False),  # SDPA with the a^K bias
    "values": (4, False, True),  # written out
    "both": (4, True, True),  # written out
}
F32_CASES = [(route, call, train) for route in F32_ROUTES for call in ("encoder", "decoder")
             for train in (False, True)] + [("abs", "cross", False), ("abs", "cross", True)]
F32_TOL = {"output": 5e-6, "grad": 3e-5}  # rtol = atol


def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records how the layer calls SDPA: "is_causal", "bool mask", "float bias" or "no mask"."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        kind = "is_causal" if is_causal else "no mask" if attn_mask is None else (
            "bool mask" if attn_mask.dtype == torch.bool else "float bias")
        calls.append(kind)
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def float32_case(route: str, call: str, train: bool, seed: int) -> tuple[list[str], list, list]:
    """Names, the layer's float32 output and gradients, and the float64 reference's, for one call."""
    k, keys, values = F32_ROUTES[route]
    written_out = values  # a^V on: attention is written out and its dropout mask can be replayed
    p = 0.1 if train and written_out else 0.0
    torch.manual_seed(seed)
    mha = make_layer(k, keys, values, share=seed % 2 == 1, dropout=p).train(train)  # float32
    ref = copy.deepcopy(mha).double()
    B, n, m, d = 3, 7, 7, 12
    if call == "cross":
        m = 5
    x = torch.randn(B, n, d, requires_grad=True)
    y = torch.randn(B, m, d, requires_grad=True) if call == "cross" else None
    lengths = torch.tensor([m, m - 2, 1 if call == "cross" else m - 3])
    pad_keep = torch.arange(m)[None, :] < lengths[:, None]  # (B, m)
    if call == "decoder":  # training: causal, no padding mask (padded targets only leave the loss)
        mask, keep = None, (torch.arange(m)[None, :] <= torch.arange(n)[:, None]).expand(B, n, m)
    else:
        mask, keep = pad_keep[:, None, None, :], pad_keep[:, None, :].expand(B, n, m)
    kv_in = y if y is not None else x

    torch.manual_seed(seed + 1)
    out = mha(x, *mha.project_kv(kv_in), mask=mask, causal=call == "decoder")
    dropped = None
    if p:
        torch.manual_seed(seed + 1)  # the same draw as the layer's, on a (B, H, n, m) tensor
        drop_keep, p_used = dropout_keep_mask(torch.Size([B, mha.n_heads, n, m]), p)
        dropped = drop_keep.double() / (1 - p_used)
    x64 = x.detach().double().requires_grad_()
    y64 = y.detach().double().requires_grad_() if y is not None else None
    expected = naive_attention(ref, x64, y64 if y64 is not None else x64, keep, 0, dropped)

    w = torch.randn(B, n, d)
    leaves = [x] + ([y] if y is not None else []) + list(mha.parameters())
    leaves64 = [x64] + ([y64] if y64 is not None else []) + list(ref.parameters())
    grads = torch.autograd.grad((out * w).sum(), leaves)
    grads64 = torch.autograd.grad((expected * w.double()).sum(), leaves64)
    names = ["output", "grad x", *(["grad y"] if y is not None else []),
             *(f"grad {name}" for name, _ in mha.named_parameters())]
    return names, [out, *grads], [expected, *grads64]


@pytest.mark.parametrize("route,call,train", F32_CASES)
def test_float32_equals_naive_reference_on_training_routes(route, call, train, monkeypatch):
    calls = sdpa_calls(monkeypatch)
    names, got, want = float32_case(route, call, train, seed=sum(map(ord, route + call)) + train)
    # the route the comment above names for this case is the one taken
    expected_route = {"abs": ["is_causal" if call == "decoder" else "bool mask"],
                      "keys": ["float bias"], "values": [], "both": []}[route]
    assert calls == expected_route
    assert all(t.dtype == torch.float32 for t in got) and all(t.dtype == torch.float64 for t in want)
    for name, a, b in zip(names, got, want, strict=True):
        tol = F32_TOL["output" if name == "output" else "grad"]
        torch.testing.assert_close(a, b.float(), rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


def test_float32_train_mode_replays_the_dropout_mask():
    """The train-mode comparison of the written-out route really has dropout in it: the same layer
    gives other outputs in eval mode, and the reference given the replayed mask matches."""
    names, train_out, want = float32_case("both", "encoder", True, seed=3)
    _, eval_out, _ = float32_case("both", "encoder", False, seed=3)
    assert (train_out[0] - eval_out[0]).abs().max() > 1e-2
    tol = F32_TOL["output"]
    torch.testing.assert_close(train_out[0], want[0].float(), rtol=tol, atol=tol)


def test_the_query_scale_follows_every_weight_update():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, 0.0).eval()
    x = torch.randn(2, 3, 16)
    k, v = mha.project_kv(torch.randn(2, 4, 16))
    k, v = k.detach(), v.detach()
    with torch.no_grad():
        before, w = mha(x, k, v), mha.q_proj.weight.clone()
        assert torch.equal(mha(x, k, v), before)
        mha.q_proj.weight.add_(0.5)  # an in-place update, as an optimizer step makes
        after = mha(x, k, v)
    assert not torch.allclose(after, before)
    assert torch.equal(after, mha(x, k, v).detach())  # with gradients: computed afresh, bitwise equal
    with torch.no_grad():
        mha.q_proj.weight.data.copy_(w)  # a change that keeps the version (issue 42 §4)
        assert torch.equal(mha(x, k, v), before)
    other = MultiHeadAttention(16, 2, 0.0).eval()
    with torch.no_grad():
        mha.load_state_dict(other.state_dict())
        assert torch.equal(mha(x, k, v), other(x, k, v))


@pytest.mark.parametrize("case", ["cross", "causal step", "bias"])
def test_written_attention_equals_the_fused_kernel(case, monkeypatch):
    """`written` (a compiled decoder step's softmax(q k^T) v, issue 76) gives what scaled_dot_product_attention
    gives: cross-attention under a source keep-mask, a causal step at an offset, and a logits bias (ALiBi/T5's
    route) with a mask; in float32, the precision decoding uses."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, 0.0).eval()
    x = torch.randn(3, 4 if case == "cross" else 1, 32)
    k, v = attn.project_kv(torch.randn(3, 7, 32))
    kwargs = {}
    if case == "cross":
        kwargs["mask"] = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5], dtype=torch.bool)[:, None, None]
    elif case == "causal step":
        kwargs |= {"causal": True, "q_offset": 6}
    else:
        from relmt.model.positions import PositionTerms

        kwargs |= {"causal": True, "q_offset": 6, "terms": PositionTerms(bias=torch.randn(4, 1, 7)),
                   "mask": torch.tensor([[1] * 7, [0] + [1] * 6, [0] * 3 + [1] * 4], dtype=torch.bool)[:, None, None]}
    with torch.no_grad():
        fused = attn(x, k, v, **kwargs)
        with monkeypatch.context() as m:  # the written route calls no fused kernel
            m.setattr(torch.nn.functional, "scaled_dot_product_attention", None)
            written = attn(x, k, v, written=True, **kwargs)
    assert written.dtype == torch.float32
    torch.testing.assert_close(written, fused, rtol=1e-5, atol=1e-6)
