"""A training step that feeds a GPU (issue 43 §3): train.pad_to_multiple leaves every update as it was,
train.compile keeps to a bounded number of graphs over any number of batch shapes, and Adam is the fused
kernel on CUDA (the default form on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from relmt.config import ModelConfig, PosKind, TrainConfig
from relmt.data.batching import collate
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import EOS_ID, PAD_ID
from relmt.model.transformer import build_model
from relmt.train import loop as loop_module
from relmt.train.distributed import Dist
from relmt.train.loss import label_smoothed_nll
from relmt.train.optim import build_optimizer
from relmt.train.step import compile_for_training, train_step

VOCAB = 40


def split_ids(lengths: list[tuple[int, int]], seed: int = 0) -> SplitIds:
    """Random token ids of the given (source, target) lengths, the source ending in EOS as prepared."""
    rng = np.random.default_rng(seed)
    src = [np.append(rng.integers(4, VOCAB, s - 1), EOS_ID) for s, _ in lengths]
    tgt = [rng.integers(4, VOCAB, t) for _, t in lengths]
    offsets = [np.concatenate([[0], np.cumsum([len(x) for x in side])]).astype(np.int64) for side in (src, tgt)]
    return SplitIds(np.concatenate(src).astype(np.int32), offsets[0], np.concatenate(tgt).astype(np.int32),
                    offsets[1])


def tiny(positions: PosKind, dtype: torch.dtype = torch.float64, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=layers, decoder_layers=layers,
                      max_relative_position=3,
                      dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, positions=positions)
    return build_model(cfg, VOCAB, PAD_ID).to(dtype)


def loss_and_grads(model: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss, nll = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1)
    loss.backward()
    return loss.detach(), nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_collate_rounds_the_lengths_up_and_pads_only():
    ids = split_ids([(5, 3), (9, 7), (2, 1)])
    plain, padded = collate(ids, np.arange(3)), collate(ids, np.arange(3), 8)
    assert plain.src.shape == (3, 9) and plain.tgt_in.shape == (3, 8)
    assert padded.src.shape == (3, 16) and padded.tgt_in.shape == padded.tgt_out.shape == (3, 8)
    assert torch.equal(padded.src[:, :9], plain.src) and (padded.src[:, 9:] == PAD_ID).all()
    assert padded.n_src_tokens == plain.n_src_tokens and padded.n_tgt_tokens == plain.n_tgt_tokens
    assert collate(ids, np.arange(3), 1).src.shape == plain.src.shape  # 0 and 1: no rounding


@pytest.mark.parametrize("positions", [p for p in PosKind])
def test_padding_to_a_multiple_leaves_loss_and_gradients_unchanged(positions):
    """The added positions are masked keys and targets left out of the loss: in float64 the loss, the
    NLL and every gradient equal the unpadded batch's up to summation order, for every positions mode."""
    model = tiny(positions)
    ids = split_ids([(6, 5), (11, 9), (3, 12), (8, 2)])
    index = np.arange(4)
    want = loss_and_grads(model, collate(ids, index))
    for multiple in (8, 16):
        got = loss_and_grads(model, collate(ids, index, multiple))
        torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=0)
        assert got[2].keys() == want[2].keys()
        for name in want[2]:
            torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-10, atol=1e-13, msg=name)


def random_batches(n: int, multiple: int, seed: int = 0, min_sentences: int = 1) -> list:
    """n batches of random shapes (min_sentences to 7 sentences of 2 to 40 tokens a side), as a token-budget
    sampler makes them: nearly every one a new (B, S, T)."""
    rng = np.random.default_rng(seed)
    batches = []
    for i in range(n):
        b = int(rng.integers(min_sentences, 8)) if i else 3
        ids = split_ids([(int(rng.integers(2, 41)), int(rng.integers(1, 40))) for _ in range(b)], seed=i)
        batches.append(collate(ids, np.arange(b), multiple))
    return batches


@pytest.mark.parametrize(("positions", "multiple", "backend"), [
    (PosKind.rel, 0, "aot_eager"), (PosKind.t5, 8, "eager"), (PosKind.alibi, 0, "eager"),
    (PosKind.abs, 8, "eager"), (PosKind.rope, 0, "eager")])
def test_compiled_training_keeps_to_a_few_graphs_over_many_batch_shapes(positions, multiple, backend):
    """train.compile: training steps on batches of 12 to 20 different shapes compile a small constant number
    of graphs (symbolic sizes; a batch of one sentence specialised), with no graph break and no fall-back
    to eager at dynamo's recompile limit. With aot_eager, AOTAutograd traces the backward as inductor's would
    (batches of 2 or more sentences there: each graph costs seconds to trace)."""
    torch._dynamo.reset()
    counters.clear()
    model = tiny(positions, torch.float32, layers=1).train()  # one layer a stack: compiling costs seconds
    counter = CompileCounterWithBackend(backend)
    net = compile_for_training(model, backend=counter)
    optimizer = build_optimizer(model, TrainConfig())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    batches = random_batches(20, multiple, min_sentences=2 if backend == "aot_eager" else 1)
    assert len({(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in batches}) >= (12 if multiple else 19)
    for batch in batches:
        loss, *_ = train_step(model, net, optimizer, scaler, [batch], 1e-3, 0.1, None, Dist(0, 1, torch.device("cpu")))
        assert np.isfinite(loss)
        assert not counters["graph_break"], list(counters["graph_break"])[:1]
    assert 1 <= counter.frame_count <= 3
    assert not counters["recompile_limit"] and not counters["cache_size_limit"]
    model.eval()  # no dropout: the compiled forward is the model's own
    batch = batches[-1]
    torch.testing.assert_close(net(batch.src, batch.tgt_in), model(batch.src, batch.tgt_in))


def test_the_trainer_compiles_and_pads_as_configured(tmp_path, monkeypatch):
    """relmt-train with train.compile=true train.pad_to_multiple=8: the model goes through
    compile_for_training, and every training batch it steps on has lengths rounded up to multiples of 8."""
    from tests.test_train import tiny_config

    compiled, shapes = [], []
    real_step = loop_module.train_step

    def compile_spy(net):
        compiled.append(net)
        return compile_for_training(net, backend="eager")

    def step_spy(model, net, optimizer, scaler, batches, *args, **kwargs):
        shapes.extend((b.src.shape[1], b.tgt_in.shape[1]) for b in batches)
        return real_step(model, net, optimizer, scaler, batches, *args, **kwargs)

    monkeypatch.setattr(loop_module, "compile_for_training", compile_spy)
    monkeypatch.setattr(loop_module, "train_step", step_spy)
    torch._dynamo.reset()
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.compile=true", "train.pad_to_multiple=8",
                                            "train.max_steps=3", "train.valid_bleu=false"))
    assert metrics["steps"] == 3 and len(compiled) == 1
    assert len(shapes) == 3 and all(s % 8 == 0 and t % 8 == 0 for s, t in shapes)


def test_adam_keeps_torchs_default_form_on_the_cpu():
    optimizer = build_optimizer(tiny(PosKind.rel, torch.float32), TrainConfig())
    assert not optimizer.defaults["fused"] and optimizer.defaults["foreach"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_adam_is_fused_on_cuda_and_updates_as_the_unfused_one():
    """On CUDA build_optimizer gives the fused Adam; three training steps with it leave the weights where
    torch's multi-tensor Adam leaves them (float32, TF32 off)."""
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    batches = [b.to(device) for b in random_batches(3, 8)]
    weights = {}
    for fused in (True, False):
        model = tiny(PosKind.rel, torch.float32).to(device).train()
        optimizer = build_optimizer(model, TrainConfig())
        assert optimizer.defaults["fused"] is True
        if not fused:
            optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, foreach=True)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        for batch in batches:
            train_step(model, model, optimizer, scaler, [batch], 1e-3, 0.1, None, Dist(0, 1, device))
        weights[fused] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, value in weights[True].items():
        torch.testing.assert_close(value, weights[False][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_bf16_training_on_cuda_keeps_to_a_few_graphs():
    """The GPU's form of the compile test above: inductor, bf16 autocast, rel, 12 batch shapes."""
    device = torch.device("cuda")
    torch._dynamo.reset()
    counters.clear()
    model = tiny(PosKind.rel, torch.float32).to(device).train()
    backend = CompileCounterWithBackend("inductor")
    net = compile_for_training(model, backend=backend)
    optimizer = build_optimizer(model, TrainConfig())
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for batch in random_batches(12, 8):
        loss, *_ = train_step(model, net, optimizer, scaler, [batch.to(device)], 1e-3, 0.1, torch.bfloat16,
                              Dist(0, 1, device))
        assert np.isfinite(loss)
    assert 1 <= backend.frame_count <= 3 and not counters["recompile_limit"]
