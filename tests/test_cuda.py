"""On a CUDA device (../shared/GPU.md check 1): every position mode, and each of Shaw's routes (the SDPA
bias route for a^K alone, the written-out route when a^V is on), gives on the GPU what it gives in float32
on the CPU: to float32 rounding with TF32 off, and within bf16 tolerance under bf16 autocast (the
precision `train.precision=auto` trains in on CUDA), outputs and gradients. Cached decoding equals the
full pass and beam 1 equals greedy on the GPU, and a bf16 run trains, resumes and decodes there.

Selected by `make test-gpu` (pytest -m gpu); `make test` leaves them out, and elsewhere they are skipped
for want of a device (conftest.py).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from relmt.config import ModelConfig, PosKind
from relmt.decode.beam import beam_search
from relmt.decode.greedy import greedy_decode
from relmt.model.transformer import build_model
from relmt.train import loop as loop_module
from tests import test_incremental as inc
from tests.test_train import tiny_config, train_records

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
PAD, V = 0, 40

# k = 4 is shorter than these sentences, so clipping (Shaw §3.2) is exercised; rel-keys-only takes
# the SDPA bias route, rel and both the written-out route with a^V (relmt/model/attention.py).
MODES = {
    "abs": dict(positions=PosKind.abs),
    "rel": dict(positions=PosKind.rel, max_relative_position=4),
    "rel-keys-only": dict(positions=PosKind.rel, max_relative_position=4, relative_values=False),
    "both": dict(positions=PosKind.both, max_relative_position=4),
    "none": dict(positions=PosKind.none),
    "rope": dict(positions=PosKind.rope),
    "alibi": dict(positions=PosKind.alibi),
    "t5": dict(positions=PosKind.t5),
}


@pytest.fixture(autouse=True)
def no_tf32():
    """float32 on the GPU means float32: TF32 matmuls would round inputs to 10 mantissa bits."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def sentences(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """4 padded source rows of up to 21 tokens and target rows (BOS ... ) of up to 19."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (4, 21), generator=g)
    tgt = torch.randint(4, V, (4, 19), generator=g)
    for row, (s, t) in enumerate([(21, 19), (9, 14), (15, 5), (3, 19)]):
        src[row, s - 1], src[row, s:] = inc.EOS, PAD
        tgt[row, 0], tgt[row, t:] = inc.BOS, PAD
    return src, tgt


def loss_and_grads(model, src, tgt, device, amp: torch.dtype | None):
    """Teacher-forced logits (float32, on the CPU) and the flat gradient of the token-level loss."""
    model = copy.deepcopy(model).to(device).train()
    with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        logits = model(src.to(device), tgt[:, :-1].to(device))
    loss = F.cross_entropy(logits.float().reshape(-1, V), tgt[:, 1:].reshape(-1).to(device), ignore_index=PAD)
    loss.backward()
    grads = {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float().cpu(), grads


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm())  # both already detached


@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_equals_cpu_float32_and_bf16(mode):
    torch.manual_seed(sum(map(ord, mode)))
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, **MODES[mode])
    model = build_model(cfg, V, PAD)
    src, tgt = sentences()
    ref_logits, ref_grads = loss_and_grads(model, src, tgt, torch.device("cpu"), None)
    real = tgt[:, :-1] != PAD

    logits, grads = loss_and_grads(model, src, tgt, CUDA, None)
    torch.testing.assert_close(logits[real], ref_logits[real], rtol=1e-4, atol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)

    # bf16 keeps 8 mantissa bits (relative rounding 2^-9 per operation): over two layers about 0.5% in
    # the logits and a few % in the gradients (the backward pass is bf16 too; CPU bf16 autocast gives
    # the same). A wrong distance, a lost mask or a NaN from a fully masked row moves them far more.
    logits, grads = loss_and_grads(model, src, tgt, CUDA, torch.bfloat16)
    errors = {"logits": rel_err(logits[real], ref_logits[real]),
              "grads": rel_err(torch.cat([g.flatten() for g in grads.values()]),
                               torch.cat([ref_grads[n].flatten() for n in grads]))}
    # the position parameters alone: a^K, a^V (Shaw §3.2), T5's bucket biases
    positional = [n for n in grads if ".rel.w_" in n or "positions.table" in n]
    errors.update({n: rel_err(grads[n], ref_grads[n]) for n in positional})
    print(mode, json.dumps(errors))
    assert errors["logits"] < 0.02 and errors["grads"] < 0.06, errors
    assert all(errors[n] < 0.1 for n in positional), errors


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("mode", list(inc.MODES))
def test_cached_decoding_equals_full_pass_on_gpu(mode):
    model = inc.make(mode).to(CUDA)
    src, tgt = (t.to(CUDA) for t in inc.batch())
    memory, src_mask = model.encode(src)
    cache = inc.run_steps(model, tgt, memory, src_mask, None, 0, 4)
    order = torch.tensor([2, 0, 0, 1], device=CUDA)  # beam search reorders rows mid-sentence
    inc.run_steps(model, tgt[order], memory[order], src_mask[order], cache.select(order, order), 4, tgt.shape[1])


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("mode", list(inc.MODES))
def test_beam_one_is_greedy_on_gpu(mode):
    model = inc.make(mode).to(CUDA)
    src = inc.batch()[0].to(CUDA)
    greedy = greedy_decode(model, src, inc.BOS, inc.EOS, max_len_a=0.5, max_len_b=6)
    assert greedy == greedy_decode(model, src, inc.BOS, inc.EOS, max_len_a=0.5, max_len_b=6, use_cache=False)
    beams = beam_search(model, src, beam=1, bos_id=inc.BOS, eos_id=inc.EOS, lenpen=0.0, max_len_a=0.5,
                        max_len_b=6, eos_candidates="fairseq")
    assert [h[0].tokens for h in beams] == greedy


@pytest.mark.parametrize("positions", ["rel", "rope", "t5"])
def test_bf16_training_on_gpu_trains_resumes_and_decodes(tmp_path, positions):
    common = ("train.device=cuda", "train.precision=bf16", "train.save_every=4", "train.eval_every=4",
              f"model.positions={positions}")
    first = loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=4", *common))
    assert first["status"] == "completed" and first["steps"] == 4
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=8", "train.resume=true", *common))
    assert metrics["status"] == "completed" and metrics["steps"] == 8
    losses = {step: r["loss"] for step, r in train_records(tmp_path / "run").items()}
    assert sorted(losses) == list(range(1, 9)) and all(math.isfinite(v) for v in losses.values())
    assert (tmp_path / "run/translations/test.tgt").read_text().strip()
