"""RoPE, ALiBi and T5 biases (issue 31) equal each paper's formula written out naively, in float64 and in
float32, outputs and gradients; and none has a length limit.

The references loop over (i, j) and follow the formulas literally: Su et al. 2021 eq. (34) with explicit
2x2 rotations per pair of dimensions; Press et al. 2022 §3, q_i·k_j / sqrt(d) - m_h |i - j|; Raffel et al.
2020's bucket function transcribed with Python scalars, plus a learned scalar per head and bucket.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from relmt.config import ModelConfig, PosKind
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import ALiBi, Rotary, T5Bias, alibi_slopes, t5_buckets
from relmt.model.transformer import build_model

D_MODEL, HEADS = 12, 3


def t5_bucket_scalar(rel: int, bidirectional: bool, n_buckets: int = 32, max_distance: int = 128) -> int:
    """T5's _relative_position_bucket for one distance j - i, with Python ints and floats."""
    bucket = 0
    if bidirectional:
        n_buckets //= 2
        bucket += n_buckets if rel > 0 else 0
        n = abs(rel)
    else:
        n = max(-rel, 0)
    exact = n_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (n_buckets - exact))
    return bucket + min(large, n_buckets - 1)


def rotation(pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """The (d, d) block-diagonal rotation of Su et al. eq. (34): dimensions 2i and 2i + 1 turned by
    pos * theta_i, theta_i = base^(-2i/d)."""
    r = torch.zeros(d, d)
    for i in range(d // 2):
        theta = pos * base ** (-2 * i / d)
        a, b = 2 * i, 2 * i + 1
        r[a, a], r[a, b], r[b, a], r[b, b] = math.cos(theta), -math.sin(theta), math.sin(theta), math.cos(theta)
    return r


def naive(mha: MultiHeadAttention, method: str, table: torch.Tensor | None, x: torch.Tensor, y: torch.Tensor,
          keep: torch.Tensor, q_offset: int, causal: bool) -> torch.Tensor:
    """x: (B, n, d) queries at positions q_offset.., y: (B, m, d) keys/values at 0.., keep: (B, n, m)."""
    B, n, d = x.shape
    m, H, D = y.shape[1], mha.n_heads, mha.d_head
    W_k, W_v = mha.kv_proj.weight.chunk(2)
    q = (x @ mha.q_proj.weight.T + mha.q_proj.bias).view(B, n, H, D)
    k = (y @ W_k.T).view(B, m, H, D)
    v = (y @ W_v.T + mha.v_bias).view(B, m, H, D)
    slopes = alibi_slopes(H)
    z = torch.zeros(B, n, H, D)
    for i in range(n):
        pos_i = i + q_offset
        e = torch.full((B, H, m), float("-inf"))
        for j in range(m):
            if method == "rope":  # eq. (34): (R_i q_i)·(R_j k_j) = q_i R_{j-i} k_j
                score = ((q[:, i] @ rotation(pos_i, D).T) * (k[:, j] @ rotation(j, D).T)).sum(-1) / D ** 0.5
            else:
                score = (q[:, i] * k[:, j]).sum(-1) / D ** 0.5  # (B, H)
                if method == "alibi":
                    score = score - torch.tensor(slopes) * abs(pos_i - j)
                else:
                    score = score + table[t5_bucket_scalar(j - pos_i, bidirectional=not causal)]
            e[:, :, j] = torch.where(keep[:, i, j, None], score, e[:, :, j])
        alpha = torch.softmax(e, dim=-1)
        for j in range(m):
            z[:, i] += alpha[:, :, j, None] * v[:, j]
    return z.reshape(B, n, d) @ mha.out_proj.weight.T + mha.out_proj.bias


def stack_module(method: str, causal: bool):
    if method == "rope":
        return Rotary(D_MODEL // HEADS)
    if method == "alibi":
        return ALiBi(HEADS)
    module = T5Bias(HEADS, D_MODEL, bidirectional=not causal)
    with torch.no_grad():
        module.table.weight.normal_()
    return module


CASES = list(itertools.product(["rope", "alibi", "t5"], ["padding", "causal", "offset"]))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("method,mode", CASES)
def test_equals_the_papers_formula_outputs_and_gradients(method, mode, dtype, tol):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(hash((method, mode)) % 2**31)
        mha = MultiHeadAttention(D_MODEL, HEADS, dropout=0.0)
        with torch.no_grad():
            for p in mha.parameters():
                p.add_(0.1 * torch.randn_like(p))
        causal = mode != "padding"
        positions = stack_module(method, causal)
        B, n, m, q_offset = 3, 7, 7, 0
        if mode == "offset":  # the last 3 queries of 7 positions, as a multi-token decode step
            n, q_offset = 3, 4
        x = torch.randn(B, n, D_MODEL, requires_grad=True)
        kv_in = torch.cat((torch.randn(B, m - n, D_MODEL), x), dim=1) if mode == "offset" else x
        lengths = torch.tensor([m, m - 2, m - 3])
        pad_keep = torch.arange(m)[None, :] < lengths[:, None]
        keep = pad_keep[:, None, :].expand(B, n, m)
        if causal:
            keep = keep & (torch.arange(m)[None, :] <= torch.arange(q_offset, q_offset + n)[:, None])
        table = positions.table.weight if method == "t5" else None
        ref = naive(mha, method, table, x, kv_in, keep, q_offset, causal)
        # the keys at positions 0..m-1 (a cache holds them rotated at their own positions)
        k, v = mha.project_kv(kv_in, positions.terms(m, m, 0, x.device, dtype))
        out = mha(x, k, v, mask=pad_keep[:, None, None, :], causal=causal, q_offset=q_offset,
                  terms=positions.terms(n, m, q_offset, x.device, dtype))
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        w = torch.randn_like(ref)
        leaves = [x, *mha.parameters(), *positions.parameters()]
        for g, g_ref in zip(torch.autograd.grad((out * w).sum(), leaves), torch.autograd.grad((ref * w).sum(), leaves)):
            torch.testing.assert_close(g, g_ref, rtol=tol, atol=tol)
    finally:
        torch.set_default_dtype(old)


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2 ** -i for i in range(1, 9)]
    assert alibi_slopes(4) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]
    # not a power of 2: the 4-head slopes, then every other one of the 8-head slopes
    assert alibi_slopes(6) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


def test_t5_buckets_are_t5s():
    rel = torch.arange(-400, 401)
    for bidirectional in (True, False):
        assert t5_buckets(rel, bidirectional).tolist() == [t5_bucket_scalar(r, bidirectional) for r in rel.tolist()]
    assert t5_buckets(torch.tensor([0, 1, -1, 7, 1000, -1000]), True).tolist() == [0, 17, 1, 23, 31, 15]
    assert t5_buckets(torch.tensor([5, 0, -1, -15, -16, -1000]), False).tolist() == [0, 0, 1, 15, 16, 31]


def test_t5_table_is_one_per_stack_and_shared_by_its_layers():
    model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, positions=PosKind.t5), 40, 0)
    names = [n for n, _ in model.named_parameters() if "table" in n]
    assert names == ["encoder_positions.table.weight", "decoder_positions.table.weight"]
    assert model.encoder_positions.bidirectional and not model.decoder_positions.bidirectional


@pytest.mark.parametrize("positions", [PosKind.rope, PosKind.alibi, PosKind.t5])
def test_no_sinusoids_no_tables_and_no_length_limit(positions):
    """None of these adds sinusoidal inputs or has a length table: 600 tokens, beyond T5's 128 and any
    training length, encode and decode to finite scores; the model is no copy of the none mode."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, positions=positions), 40, 0).eval()
    assert not model.absolute and all(layer.self_attn.rel is None for layer in model.encoder_layers)
    src = torch.randint(4, 40, (2, 600))
    with torch.no_grad():
        logits = model(src, src[:, :300])
    assert torch.isfinite(logits).all()
    # positions matter: swapping two source tokens changes the encoder's output at an unswapped position
    swapped = src.clone()
    swapped[:, [3, 9]] = swapped[:, [9, 3]]
    with torch.no_grad():
        assert not torch.allclose(model.encode(src)[0][:, 0], model.encode(swapped)[0][:, 0])


def test_rope_in_real_arithmetic_under_compile_equals_the_complex_rotation(monkeypatch):
    """torch.compile and ONNX export take the real-arithmetic rotation (ONNX has no complex numbers)."""
    from relmt.model.positions import rotate

    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8).transpose(1, 2)  # (B, H, n, D), a non-contiguous view like attention's heads
    rotary = Rotary(8).terms(5, 5, 7, x.device, x.dtype).rotary
    eager = rotate(x, rotary)
    half = x.bfloat16()
    eager_half = rotate(half, rotary)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(rotate(x, rotary), eager, rtol=1e-6, atol=1e-6)
    # bf16 rotates in float32 on both paths, as eager does: the same bf16 result
    assert rotate(half, rotary).dtype == torch.bfloat16
    torch.testing.assert_close(rotate(half, rotary), eager_half, rtol=0, atol=0)


def test_bias_index_is_one_square_per_stack_and_the_weights_are_looked_up_every_call():
    """The index of the bias (|j - i| for ALiBi, T5's bucket) has no parameters: one square index serves every
    shape, each pass taking its window (a decode step is one row of it, however long the output). The weights
    are looked up at every call, so the bias follows any change of them (issue 42 §4)."""
    alibi, t5 = ALiBi(4), T5Bias(4, 16, bidirectional=True)
    cpu = torch.device("cpu")

    def index_storage(module, *shape):
        terms = module.terms(*shape, cpu, torch.float32).bias
        torch.testing.assert_close(terms, module.bias(*shape, cpu), rtol=0, atol=0)  # the window is the bias
        return module._index.untyped_storage().data_ptr()

    for module in (alibi, t5):
        first = index_storage(module, 5, 5, 0)
        assert all(index_storage(module, 1, t + 1, t) == first for t in range(8))  # decode steps: one square
        assert all(index_storage(module, *shape) == first for shape in [(3, 3, 0), (8, 8, 0), (2, 6, 4)])
        longer = index_storage(module, 1, 201, 200)  # a longer pass grows it once ...
        assert all(index_storage(module, 1, t + 1, t) == longer for t in range(150, 200))  # ... then every step hits
    with torch.no_grad():
        before = t5.terms(5, 5, 0, cpu, torch.float32).bias.clone()
        t5.table.weight.data.copy_(t5.table.weight + 1.0)  # a change that keeps the tensor's version
        assert torch.equal(t5.terms(5, 5, 0, cpu, torch.float32).bias, before + 1.0)
