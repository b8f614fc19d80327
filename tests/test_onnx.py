"""ONNX Runtime as the inference engine (issue 33): relmt's searches on the exported graphs decode as eager
relmt does, token for token, with scores within 1e-4, in every position mode and norm."""

from __future__ import annotations

import pytest
import torch

from relmt.config import DecodeConfig, EosCandidates, Norm, PosKind
from relmt.decode.translator import Translator
from relmt.export.onnx import OnnxModel, export_onnx
from tests.tiny_checkpoints import SENTENCES, model_config, random_model, toy_tokenizer

pytest.importorskip("onnxruntime")

CASES = {
    "abs-pre": {"positions": PosKind.abs},
    "abs-post": {"positions": PosKind.abs, "norm": Norm.post},
    "rel-per-head": {"positions": PosKind.rel},
    "rel-shared-post": {"positions": PosKind.rel, "relative_share_heads": True, "norm": Norm.post},
    "both": {"positions": PosKind.both},
    "keys-only": {"positions": PosKind.rel, "relative_values": False},
    "values-only": {"positions": PosKind.rel, "relative_keys": False},
    "none": {"positions": PosKind.none},
    "rope": {"positions": PosKind.rope},
    "alibi": {"positions": PosKind.alibi},
    "t5": {"positions": PosKind.t5},
}
DECODE = DecodeConfig(beam=4, nbest=4, lenpen=0.6, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from relmt.data.tokenizer import Tokenizer

    return Tokenizer(toy_tokenizer(tmp_path_factory.mktemp("spm")))


@pytest.mark.parametrize("case", list(CASES))
def test_the_onnx_engine_decodes_as_eager_relmt(case, tokenizer, tmp_path):
    model = random_model(model_config(**CASES[case]), tokenizer.vocab_size, seed=3).eval()
    engine = OnnxModel(export_onnx(model, tmp_path / "onnx"), threads=1)
    eager = Translator(model, tokenizer, DECODE, torch.device("cpu"))
    onnx = Translator(engine, tokenizer, DECODE, torch.device("cpu"))
    for options in ({}, {"eos_candidates": EosCandidates.fairseq, "beam": 2, "nbest": 2}, {"beam": 1, "nbest": 1},
                    {"sampling": True, "beam": 3, "nbest": 3, "topk": 5}):
        mine, theirs = eager.hypotheses(SENTENCES, **options), onnx.hypotheses(SENTENCES, **options)
        for a, b in zip(mine, theirs):
            assert [h.tokens for h in a] == [h.tokens for h in b], (case, options)
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
