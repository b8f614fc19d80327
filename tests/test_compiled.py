"""Compiled decoding (relmt/decode/compiled.py): the same hypotheses as eager decoding, scores equal
up to float rounding, for relative positions (a^K and a^V, the written-out attention path) and for
an ensemble, and `relmt-translate compile=true` compiles."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import relmt.decode.translator as translator_module
from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.config import PosKind
from relmt.decode.translator import Translator
from tests.tiny_checkpoints import SENTENCES, model_config, toy_tokenizer, write_checkpoint


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compiled")
    spm = toy_tokenizer(tmp)
    cfg = model_config(positions=PosKind.both, decoder_layers=1, encoder_layers=1)
    return [write_checkpoint(tmp, f"{seed}.pt", spm, seed=seed, model=cfg) for seed in (1, 2)]


def assert_same_hypotheses(compiled: list, eager: list) -> None:
    assert [[h.tokens for h in hs] for hs in compiled] == [[h.tokens for h in hs] for hs in eager]
    got = torch.tensor([h.score for hs in compiled for h in hs])
    want = torch.tensor([h.score for hs in eager for h in hs])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_decoding_gives_the_eager_hypotheses(ckpts):
    eager = Translator.from_checkpoint(ckpts[0])
    compiled = Translator.from_checkpoint(ckpts[0], compile=True)
    assert "decode_step" in vars(compiled.model) and "decode_step" not in vars(eager.model)
    counters.clear()
    settings = dict(nbest=3, beam=3, max_len_b=8)
    # one batch of 5 sentences of different lengths: sentences finish and leave the batch
    assert_same_hypotheses(compiled.hypotheses(SENTENCES, **settings), eager.hypotheses(SENTENCES, **settings))
    # the whole step is one graph: a graph break (say, a data_ptr check in the model) falls back to eager
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    # again with other shapes (longer outputs, two batches), served by the graphs compiled above
    settings = dict(nbest=2, beam=2, max_len_b=12, max_sentences=3)
    assert_same_hypotheses(compiled.hypotheses(SENTENCES, **settings), eager.hypotheses(SENTENCES, **settings))


def test_an_ensemble_compiles_every_model(ckpts):
    compiled = Translator.from_checkpoints(ckpts, compile=True)
    eager = Translator.from_checkpoints(ckpts)
    counters.clear()
    assert_same_hypotheses(compiled.hypotheses(SENTENCES, beam=2, max_len_b=6),
                           eager.hypotheses(SENTENCES, beam=2, max_len_b=6))
    # both models got their own graphs (steps 0, 1 and later at least), none fell back to eager at
    # dynamo's limit on graphs per code object, which this process's earlier compiled model shares
    assert counters["stats"]["unique_graphs"] >= 2 * 3
    assert not any("recompile_limit" in reason or "cache_size_limit" in reason
                   for reason in counters["recompile_limit"] | counters["cache_size_limit"])


def test_relmt_translate_compile_true_compiles(ckpts, tmp_path, capsys, monkeypatch):
    compiled = []
    monkeypatch.setattr(translator_module, "compile_decoding", compiled.append)
    src = tmp_path / "in.txt"
    src.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpts[0]}", f"input={src}"]) == 0
    assert compiled == []
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpts[0]}", f"input={src}", "compile=true"]) == 0
    assert len(compiled) == 1
    assert len(capsys.readouterr().out.splitlines()) == 2 * len(SENTENCES)


def test_compile_without_torch_212s_per_function_limits(monkeypatch):
    """torch 2.11 (the GPU machine's) has no recompile_limit / isolate_recompiles keywords: compile_decoding then
    raises dynamo's shared limit to room for every model's graphs instead of passing them."""
    from relmt.decode import compiled as compiled_module
    from relmt.decode.ensemble import Ensemble
    from relmt.model.transformer import build_model

    calls = []

    def old_compile(fn, *, dynamic=None, options=None):  # torch 2.11's keywords, as far as relmt uses them
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", old_compile)
    models = [build_model(model_config(), 40, 0) for _ in range(2)]
    with torch._dynamo.config.patch(recompile_limit=8):  # put back after (monkeypatch would delete the key)
        compiled_module.compile_decoding(Ensemble(models))
        assert len(calls) == 2 and torch._dynamo.config.recompile_limit == 2 * compiled_module.GRAPHS_PER_MODEL
