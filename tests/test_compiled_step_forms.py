"""The forms a compiled decoder step takes (issue 44 §7) compute what the eager forms do: the self-attention
projections in one GEMM (MultiHeadAttention.project_qkv) and the relative-table products of one query row as a
multiply and a sum (RelativePositions.key_logits, value_term), in float64 so that they agree to rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relmt.model import positions
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import Rotary


@pytest.mark.parametrize("rotary", [False, True])
def test_one_gemm_gives_the_queries_keys_and_values_of_two(rotary):
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, 0.0).double()
    with torch.no_grad():
        attn.q_proj.bias.normal_()
        attn.v_bias.normal_()
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    terms = Rotary(8).terms(5, 5, 0, x.device, x.dtype) if rotary else positions.NO_TERMS
    q, k, v = attn.project_qkv(x, terms)
    k2, v2 = attn.project_kv(x, terms)
    q2 = positions.rotate(attn._split(F.linear(x, *attn.scaled_query_weights())), terms.rotary)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_under_autocast_the_keys_and_values_share_the_queries_dtype():
    """b^V is a float32 parameter: under bf16 autocast v + b^V would be float32 beside bf16 queries and keys,
    which SDPA casts but FlexAttention refuses (the flex route's bf16 tests failed on an H200, 2026-11-27).
    project_kv gives v in k's dtype, as project_qkv does."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, 0.0)
    x = torch.randn(3, 5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        k, v = attn.project_kv(x)
        q3, k3, v3 = attn.project_qkv(x)
    assert k.dtype == v.dtype == q3.dtype == k3.dtype == v3.dtype == torch.bfloat16
    k32, v32 = attn.project_kv(x)
    assert k32.dtype == v32.dtype == torch.float32


@pytest.mark.parametrize("share_heads", [False, True])
def test_one_row_table_products_equal_the_einsum(share_heads, monkeypatch):
    torch.manual_seed(1)
    rel = positions.RelativePositions(4, 8, 3, share_heads=share_heads).double()
    q = torch.randn(6, 4, 1, 8, dtype=torch.float64)
    index = rel.index(1, 9, 8, q.device)  # the last of 9 positions: every key to its left
    attn = torch.softmax(torch.randn(6, 4, 1, 9, dtype=torch.float64), dim=-1)
    eager = rel.key_logits(q, index, 8), rel.value_term(attn, index, 8)
    monkeypatch.setattr(positions, "in_graph", lambda: True)
    graph = rel.key_logits(q, index, 8), rel.value_term(attn, index, 8)
    for a, b in zip(eager, graph):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
