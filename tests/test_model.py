"""Model-level properties of the position modes (Shaw et al. §3, §4.3)."""

from __future__ import annotations

import math

import pytest
import torch

from relmt.config import ModelConfig, Norm, PosKind
from relmt.model.positions import sinusoidal_encoding
from relmt.model.transformer import build_model

pytestmark = pytest.mark.usefixtures("float64")
PAD, V = 0, 40


def tiny(**kw) -> ModelConfig:
    base = dict(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("kv", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("share", [False, True])
def test_k0_encoder_has_no_position_information(kv, share):
    """Shaw §3.2: with k = 0 there is one label; a^K shifts every score in a row equally and a^V
    adds a constant, so permuting the real source tokens permutes the encoder output."""
    torch.manual_seed(1)
    cfg = tiny(positions=PosKind.rel, max_relative_position=0, relative_keys=kv[0],
               relative_values=kv[1], relative_share_heads=share)
    model = build_model(cfg, V, PAD).eval()
    src = torch.tensor([[5, 9, 12, 7, 30, 3, PAD, PAD]])  # 6 real tokens, then padding
    perm = torch.tensor([4, 0, 5, 2, 1, 3, 6, 7])  # permutes the real tokens only
    out, _ = model.encode(src)
    out_perm, _ = model.encode(src[:, perm])
    torch.testing.assert_close(out_perm[:, :6], out[:, perm[:6]], rtol=1e-10, atol=1e-10)


def test_k1_encoder_does_see_order():
    torch.manual_seed(1)
    model = build_model(tiny(positions=PosKind.rel, max_relative_position=1), V, PAD).eval()
    src = torch.tensor([[5, 9, 12, 7, 30, 3]])
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    out, _ = model.encode(src)
    out_perm, _ = model.encode(src[:, perm])
    assert not torch.allclose(out_perm, out[:, perm], atol=1e-4)


@pytest.mark.parametrize("kv", [(True, True), (True, False), (False, True)])
def test_zeroed_tables_equal_no_positions(kv):
    torch.manual_seed(2)
    rel = build_model(tiny(positions=PosKind.rel, relative_keys=kv[0], relative_values=kv[1]), V, PAD)
    none = build_model(tiny(positions=PosKind.none), V, PAD)
    none.load_state_dict({n: p for n, p in rel.state_dict().items() if ".rel." not in n})
    with torch.no_grad():
        for name, p in rel.named_parameters():
            if ".rel." in name:
                p.zero_()
    src = torch.tensor([[5, 9, 12, 3], [8, 3, PAD, PAD]])
    tgt = torch.tensor([[2, 6, 7, 11], [2, 13, 14, PAD]])
    torch.testing.assert_close(rel.eval()(src, tgt), none.eval()(src, tgt), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("positions", list(PosKind))
def test_relative_tables_only_in_self_attention(positions):
    model = build_model(tiny(positions=positions), V, PAD)
    for layer in model.decoder_layers:
        assert layer.cross_attn.rel is None
        assert (layer.self_attn.rel is not None) == positions.relative
    for layer in model.encoder_layers:
        assert (layer.self_attn.rel is not None) == positions.relative
    # one table set per layer: distinct parameters in every self-attention
    tables = [layer.self_attn.rel.w_k for layer in [*model.encoder_layers, *model.decoder_layers]
              if layer.self_attn.rel is not None]
    assert len({t.data_ptr() for t in tables}) == len(tables)


def test_both_a_k_and_a_v_off_builds_no_tables():
    model = build_model(tiny(positions=PosKind.rel, relative_keys=False, relative_values=False), V, PAD)
    assert all(layer.self_attn.rel is None for layer in model.encoder_layers)


@pytest.mark.parametrize("positions", list(PosKind))
def test_embeddings_scaled_and_dropped_in_every_mode(positions):
    """sqrt(d_model) scaling and embedding dropout apply whatever the position mode."""
    torch.manual_seed(3)
    model = build_model(tiny(positions=positions, dropout=0.5), V, PAD)
    tokens = torch.tensor([[4, 5, 6, 7]])
    scaled = model.src_embed(tokens) * 16 ** 0.5
    model.eval()
    expected = scaled + (sinusoidal_encoding(torch.arange(4), 16) if positions.absolute else 0)
    torch.testing.assert_close(model._embed(model.src_embed, tokens), expected)
    model.train()
    dropped = model._embed(model.src_embed, tokens)
    assert (dropped == 0).float().mean() > 0.2  # dropout is active in training mode


def test_sinusoid_matches_formula():
    pe = sinusoidal_encoding(torch.arange(50), 8)
    pos, i = 37, 3  # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
    angle = pos / 10000 ** (2 * i / 8)
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("norm", list(Norm))
def test_share_embeddings_and_norm_options(norm):
    shared = build_model(tiny(share_embeddings=True, norm=norm), V, PAD)
    separate = build_model(tiny(share_embeddings=False, norm=norm), V, PAD)
    assert shared.src_embed is shared.tgt_embed
    assert separate.src_embed is not separate.tgt_embed
    src = torch.tensor([[5, 9, 3]])
    tgt = torch.tensor([[2, 6]])
    assert shared(src, tgt).shape == separate(src, tgt).shape == (1, 2, V)


@pytest.mark.parametrize("key,value", [("max_relative_position", -1), ("n_heads", 3),
                                       ("dropout", 1.0), ("d_model", 0)])
def test_bad_model_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"model.{key}"):
        tiny(**{key: value})
