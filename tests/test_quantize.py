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


def test_int8_is_for_engine_aoti_and_keys_its_own_artefact(tmp_path):
    from relmt.errors import UserError
    from relmt.export.engines import Engine, artefact_dir, check_quantization, dependencies

    check_quantization(Engine.aoti, "int8")
    with pytest.raises(UserError, match="format=onnx writes float32 weights only .* quantization=int8 is for "
                                        "format=ctranslate2 or format=aoti"):
        check_quantization(Engine.onnx, "int8")
    ck = tmp_path / "last.pt"
    float32, int8 = (artefact_dir(ck, Engine.aoti, "abc", quantization=q) for q in ("float32", "int8"))
    assert float32.name.startswith("aoti-") and int8.name.startswith("aoti_int8-")  # kept and pruned apart
    assert "quantization" not in dependencies(Engine.aoti)  # a float32 artefact keeps the key it had
    assert dependencies(Engine.aoti, "int8")["quantization"] == "int8"


def test_a_translator_refuses_int8_off_engine_aoti(tmp_path):
    from relmt.decode.translator import Translator
    from relmt.errors import UserError

    with pytest.raises(UserError, match="quantization=int8: engine=aoti runs float32 or int8 weights"):
        Translator.from_checkpoint(tmp_path / "missing.pt", engine="torch", quantization="int8")
