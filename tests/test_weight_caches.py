"""Nothing the model keeps between calls goes stale when its weights change (issue 42 §4).

Eval-mode decoding once kept the scaled W^Q and the ALiBi/T5 bias keyed on the parameters' version
counters, and these weight changes leave the counter (and the data pointer) as it was: a fused Adam
step, `p.data.copy_()`, `load_state_dict(assign=True)`, `.half().float()`. Each case here fills
whatever the model might keep (a forward pass and cached decoding steps without gradients), changes
the weights that way without switching train/eval mode, and compares the model with a fresh one built
from the same new weights.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from relmt.config import ModelConfig, PosKind
from relmt.model.transformer import Transformer, build_model

PAD, BOS, EOS, V = 0, 2, 3, 40
MODES = [PosKind.abs, PosKind.rel, PosKind.both, PosKind.rope, PosKind.alibi, PosKind.t5]


def config(positions: PosKind) -> ModelConfig:
    return ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0,
                       attention_dropout=0.0, activation_dropout=0.0, positions=positions,
                       max_relative_position=2)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[5, 9, 12, 7, 30, EOS], [8, 11, EOS, PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 6, 7, 11, 4, 20], [BOS, 13, 14, 9, PAD, PAD]])
    return src, tgt


@torch.no_grad()
def outputs(model: Transformer) -> list[torch.Tensor]:
    """The teacher-forced logits and three cached decoding steps' logits, without gradients (where
    the model may reuse what it kept)."""
    src, tgt = batch()
    out = [model(src, tgt)]
    memory, src_mask = model.encode(src)
    cache = None
    for t in range(3):
        logits, cache = model.decode_step(tgt[:, t], memory, src_mask, cache, step=t)
        out.append(logits)
    return out


def adam_step(fused: bool) -> Callable[[Transformer, ModelConfig], None]:
    def change(model: Transformer, cfg: ModelConfig) -> None:
        opt = torch.optim.Adam(model.parameters(), lr=0.05, fused=fused, foreach=None if fused else True)
        src, tgt = batch()
        model(src, tgt).logsumexp(-1).mean().backward()
        opt.step()
    return change


def data_copy(model: Transformer, cfg: ModelConfig) -> None:
    other = build_model(cfg, V, PAD)
    for p, q in zip(model.parameters(), other.parameters()):
        p.data.copy_(q.data)


def assign(model: Transformer, cfg: ModelConfig) -> None:
    model.load_state_dict(build_model(cfg, V, PAD).state_dict(), assign=True)


def half_float(model: Transformer, cfg: ModelConfig) -> None:
    model.half().float()


CASES = {"fused_adam": adam_step(True), "foreach_adam": adam_step(False), "data_copy": data_copy,
         "load_assign": assign, "half_float": half_float}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("positions", MODES, ids=[m.value for m in MODES])
def test_changed_weights_are_used(positions: PosKind, case: str) -> None:
    torch.manual_seed(1)
    cfg = config(positions)
    model = build_model(cfg, V, PAD).eval()
    before = outputs(model)  # fills anything the model keeps
    outputs(model)
    CASES[case](model, cfg)
    fresh = build_model(cfg, V, PAD).eval()
    fresh.load_state_dict(model.state_dict())
    changed = False
    for got, want, old in zip(outputs(model), outputs(fresh), before):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        changed = changed or not torch.allclose(old, want, atol=1e-3)
    assert changed, "the case did not change the weights"
