"""int8 for engine=aoti (issue 62): an exported copy's computed projections (the scaled W^Q, W^Q|W^K|W^V and
the tied output layer) become modules of their own (freeze_projections), so that a quantizer can turn every
linear map into an int8 one; frozen, the float32 model computes exactly what it did."""

from __future__ import annotations

import copy

import pytest
import torch

from relmt.config import DecodeConfig, PosKind
from relmt.decode.search import decode_sources
from tests.tiny_checkpoints import model_config, random_model


@pytest.mark.parametrize("positions", ["rel", "abs", "rope", "t5"])
def test_frozen_projections_compute_what_the_model_computes(positions):
    model = random_model(model_config(positions=PosKind(positions)), vocab_size=60, seed=3)
    frozen = copy.deepcopy(model)
    frozen.freeze_projections()
    src = torch.randint(4, 60, (3, 7))
    tgt = torch.randint(4, 60, (3, 5))
    with torch.no_grad():
        assert torch.equal(frozen(src, tgt), model(src, tgt))
    ids = [[5, 9, 11, 3], [7, 8, 3], [3]]
    cfg = DecodeConfig(beam=3, max_len_b=6)
    a = decode_sources(model, ids, cfg, torch.device("cpu"))
    b = decode_sources(frozen, ids, cfg, torch.device("cpu"))
    assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
    assert [[h.score for h in hs] for hs in a] == [[h.score for h in hs] for hs in b]
    # every attention: 2 encoder layers' self-attention, 2 decoder layers' self- and cross-attention
    assert sum(isinstance(m, torch.nn.ModuleDict) for m in frozen.modules()) == 2 + 2 * 2
    assert frozen.out_layer is not None and model.out_layer is None
