"""The attention routes without (B, H, n, m) logits equal the reference route (relmt/model/routes.py).

- chunked (relmt/model/chunked.py): blocks of query rows, recomputed in backward, equal the reference
  route's outputs and every gradient in float64 (to rounding) and float32; with attention dropout, a
  block's recomputation draws the mask it drew in forward, and the blocks equal the reference route run
  on the same rows one block after the other.
- flex (relmt/model/flex.py): the decomposition (kernel out and lse, the band's weights, the two tails'
  masses) equals the reference with the written-out core (`dense_core`), outputs and gradients with
  respect to q, k, v (through the projections), w^K, w^V and T5's table; with FlexAttention itself on
  the CPU (inference only there) forward; on CUDA (make test-gpu) forward and backward, bf16 included;
  with attention dropout, against the chunked route with the same hashed mask.
Each is checked in encoder self-attention with padding, causal decoder self-attention, a multi-token
step at an offset and a cached decoding step (one query), for every mode that adds to the logits or
uses a^V. Then the chooser and its setting.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from relmt.config import ModelConfig
from relmt.dropout import counter_keep, counter_threshold
from relmt.errors import UserError
from relmt.model import chunked, flex, routes
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import NO_TERMS, ALiBi, RelativePositions, T5Bias
from relmt.model.transformer import build_model
from tests import test_incremental as inc

D_MODEL, HEADS = 32, 2  # d_head 16: a head size FlexAttention takes on CUDA

# (relative tables: k, a^K, a^V, shared across heads) or a stack's bias; every mode with a logits term or a^V
MODES = {
    "rel": dict(rel=(2, True, True, False)),
    "rel-keys-only": dict(rel=(2, True, False, False)),
    "rel-values-only": dict(rel=(3, False, True, False)),
    "rel-shared-heads": dict(rel=(2, True, True, True)),
    "rel-k0": dict(rel=(0, True, True, False)),
    "rel-k-beyond-n": dict(rel=(11, True, True, False)),
    "alibi": dict(bias="alibi"),
    "t5": dict(bias="t5"),
}
CALLS = ["encoder", "decoder", "offset", "step"]
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-5)}


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 2 query rows, so that every chunked call here has several (and a partial last one)."""
    monkeypatch.setattr(chunked, "BLOCK_BYTES", 1)
    monkeypatch.setattr(chunked, "_MIN_ROWS", 2)


def make(mode: str, call: str, dtype: torch.dtype, dropout: float = 0.0, seed: int = 0):
    """A self-attention layer, its stack's position module (alibi, t5) or None, and the call's inputs."""
    torch.manual_seed(seed + sum(map(ord, mode + call)))
    spec = MODES[mode]
    rel = RelativePositions(HEADS, D_MODEL // HEADS, *spec["rel"]) if "rel" in spec else None
    mha = MultiHeadAttention(D_MODEL, HEADS, dropout, rel)
    positions = {None: None, "alibi": ALiBi(HEADS),
                 "t5": T5Bias(HEADS, D_MODEL, bidirectional=call == "encoder")}[spec.get("bias")]
    with torch.no_grad():  # non-zero biases, so that they are checked too
        for p in mha.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mha.to(dtype).train(dropout > 0)
    if positions is not None:
        positions.to(dtype)
    B, m = 3, 7
    n, q_offset = {"encoder": (m, 0), "decoder": (m, 0), "offset": (3, 4), "step": (1, 6)}[call]
    x = torch.randn(B, n, D_MODEL, dtype=dtype, requires_grad=True)
    earlier = torch.randn(B, m - n, D_MODEL, dtype=dtype)
    mask = None
    if call == "encoder":
        mask = (torch.arange(m)[None, :] < torch.tensor([m, m - 2, m - 4])[:, None])[:, None, None, :]
    inputs = dict(x=x, earlier=earlier, mask=mask, causal=call != "encoder", q_offset=q_offset)
    return mha, positions, inputs


def run(route: str, mha: MultiHeadAttention, positions, inputs: dict, seed: int = 1):
    """The layer's output and the gradients of a fixed weighting of it, by `route`."""
    x, mask, q_offset = inputs["x"], inputs["mask"], inputs["q_offset"]
    n = x.shape[1]
    with routes.use_route(route):
        torch.manual_seed(seed)
        kv_in = torch.cat((inputs["earlier"], x), dim=1)
        m = kv_in.shape[1]
        terms = NO_TERMS if positions is None else positions.terms(n, m, q_offset, x.device, x.dtype)
        out = mha(x, *mha.project_kv(kv_in, terms), mask=mask, causal=inputs["causal"], q_offset=q_offset,
                  terms=terms)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype).to(out.device)
    leaves = [x, *mha.parameters(), *(positions.parameters() if positions is not None else ())]
    grads = torch.autograd.grad((out * w).sum(), leaves)
    return [out, *grads]


def assert_all_close(got: list, want: list, dtype: torch.dtype, names: str = "") -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda m, i=i: f"{names} tensor {i}: {m}")


CASES = [(mode, call, dtype) for mode in MODES for call in CALLS for dtype in (torch.float64, torch.float32)]


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("mode,call,dtype", CASES)
def test_chunked_equals_reference(mode, call, dtype):
    mha, positions, inputs = make(mode, call, dtype)
    assert_all_close(run("chunked", mha, positions, inputs), run("reference", mha, positions, inputs), dtype)


@pytest.mark.parametrize("mode,call,dtype", CASES)
def test_flex_decomposition_with_the_dense_core_equals_reference(mode, call, dtype, monkeypatch):
    """The flex route's math (band + tails for a^V; score_mod for q·a^K and the bias; block masks),
    with the kernel written out, so that gradients can be checked on the CPU."""
    monkeypatch.setattr(flex, "flex_core", flex.dense_core)
    monkeypatch.setattr(routes, "choose", lambda q, m, p: "flex")
    mha, positions, inputs = make(mode, call, dtype)
    got = run("flex", mha, positions, inputs)
    assert_all_close(got, run("reference", mha, positions, inputs), dtype)


SEED = 0x5EED


def counter_dropout(seed: int, p: float):
    """relmt.dropout's dropout with Dropped's hashed mask in place of its draws: the weights (B, H, n, m) of one
    block holding every row (the chunked route's blocks at its default budget, at these sizes)."""
    threshold, scale = counter_threshold(p)

    def apply(a: torch.Tensor, p_: float) -> torch.Tensor:
        b, h, n, m = a.shape
        idx = [torch.arange(s, device=a.device).view([s if d == i else 1 for d in range(4)])
               for i, s in enumerate((b, h, n, m))]
        keep = counter_keep(torch.tensor(seed, device=a.device), threshold, *idx)
        return a * (keep.to(a.dtype) * scale)

    return apply


@pytest.mark.parametrize("mode,call", [(m, c) for m in ("rel", "rel-keys-only", "rel-values-only", "rel-k0",
                                                         "rel-shared-heads", "t5", "alibi")
                                       for c in ("encoder", "decoder", "offset")])
def test_flex_dropout_equals_the_written_out_attention_with_the_same_mask(mode, call, monkeypatch):
    """The flex route's attention dropout (relmt/model/flex.py's Dropped: the kept keys' pass scaled by their
    share of the weight, the band and the tails over kept keys only) equals the chunked route, which writes
    the weights out, with the same hashed mask applied to them: outputs and every gradient, float64."""
    p = 0.3
    monkeypatch.setattr(flex, "flex_core", flex.dense_core)
    monkeypatch.setattr(flex.Dropped, "draw", classmethod(
        lambda cls, p, device: cls(torch.tensor(SEED, device=device), *counter_threshold(p))))
    monkeypatch.setattr(chunked, "dropout", counter_dropout(SEED, p))
    monkeypatch.setattr(routes, "choose", lambda q, m, p: routes.setting())  # flex with gradients on the CPU
    mha, positions, inputs = make(mode, call, torch.float64, dropout=p)
    got = run("flex", mha, positions, inputs)
    want = run("chunked", mha, positions, inputs)
    assert_all_close(got, want, torch.float64)
    mha.eval()
    assert (run("flex", mha, positions, inputs)[0] - got[0]).abs().max() > 1e-3  # the dropout was on


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("mode,call", [("rel", "encoder"), ("rel", "decoder"), ("t5", "encoder")])
def test_flex_kernel_with_dropout_on_cpu_equals_the_written_out_core(mode, call, monkeypatch):
    """FlexAttention itself (eager on the CPU, forward: its -inf scores for dropped keys, rows left empty, the
    block mask shared by the two full passes) against the written-out core, with the same hashed mask."""
    monkeypatch.setattr(flex.Dropped, "draw", classmethod(
        lambda cls, p, device: cls(torch.tensor(SEED, device=device), *counter_threshold(p))))
    mha, positions, inputs = make(mode, call, torch.float32, dropout=0.3)
    with torch.no_grad():
        got = run_forward("flex", mha, positions, inputs)
        monkeypatch.setattr(flex, "flex_core", flex.dense_core)
        want = run_forward("flex", mha, positions, inputs)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    mha.eval()
    with torch.no_grad():
        assert (run_forward("flex", mha, positions, inputs) - want).abs().max() > 1e-3  # the dropout was on


def test_the_hashed_mask_keeps_one_minus_p_and_changes_with_the_seed():
    threshold, scale = counter_threshold(0.1)
    idx = [torch.arange(s).view([s if d == i else 1 for d in range(4)]) for i, s in enumerate((4, 8, 64, 64))]
    keep = counter_keep(torch.tensor(SEED), threshold, *idx)
    n = keep.numel()
    assert abs(keep.float().mean().item() - 0.9) < 4 * (0.09 / n) ** 0.5  # within 4 standard deviations
    assert scale == pytest.approx(1 / 0.9, rel=1e-9)
    other = counter_keep(torch.tensor(SEED + 1), threshold, *idx)
    assert 0.1 < (keep != other).float().mean().item() < 0.25  # independent draws differ in ~18% of places


def test_the_upper_tail_has_its_own_pass():
    """The upper tail's mass comes from its own masked pass, exp(lse_upper - lse), so where it is light
    (~1e-8 of the row) it keeps its relative precision; 1 - band - lower would be off by ~1e-16
    absolute there, ~1e-8 relative. v = 0 and w^V zero but for the upper label isolate it: z = S_upper w^V."""
    torch.manual_seed(0)
    rel = RelativePositions(1, 16, 1, keys=False, values=True).double()
    with torch.no_grad():
        rel.w_v[:, :2] = 0.0
    q = torch.randn(1, 1, 6, 16, dtype=torch.float64)
    k = torch.zeros(1, 1, 6, 16, dtype=torch.float64)
    k[..., 1:, :] = -20 * q[..., :1, :] / q[0, 0, 0].pow(2).sum()  # q_0·k_j = -20 for j >= 1, 0 for j = 0
    v = torch.zeros(1, 1, 6, 16, dtype=torch.float64)
    alpha = torch.softmax(q @ k.transpose(-1, -2), -1)[0, 0, 0]
    upper = alpha[1:].sum()  # query 0, k = 1: the keys j >= 1 share label 2k
    assert 1e-9 < upper < 1e-7
    z = flex.flex_attention(q, k, v, rel, None, None, False, 0, core=flex.dense_core)
    torch.testing.assert_close(z[0, 0, 0], upper * rel.w_v[0, 2], rtol=1e-13, atol=0)


FLEX_CPU_CASES = [("rel", "encoder"), ("rel", "decoder"), ("rel-shared-heads", "offset"), ("rel", "step"),
                  ("rel-keys-only", "encoder"), ("t5", "encoder"), ("alibi", "decoder")]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("mode,call", FLEX_CPU_CASES)
def test_flex_kernel_on_cpu_equals_reference_in_inference(mode, call):
    """FlexAttention itself (eager on the CPU, where it has no backward): the forward pass."""
    mha, positions, inputs = make(mode, call, torch.float32)
    mha.eval()
    with torch.no_grad():
        got = run_forward("flex", mha, positions, inputs)
        want = run_forward("reference", mha, positions, inputs)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def run_forward(route: str, mha, positions, inputs) -> torch.Tensor:
    x, q_offset = inputs["x"], inputs["q_offset"]
    with routes.use_route(route):
        kv_in = torch.cat((inputs["earlier"], x), dim=1)
        terms = NO_TERMS if positions is None else positions.terms(x.shape[1], kv_in.shape[1], q_offset,
                                                                    x.device, x.dtype)
        return mha(x, *mha.project_kv(kv_in, terms), mask=inputs["mask"], causal=inputs["causal"],
                   q_offset=q_offset, terms=terms)


# --- attention dropout: the chunked route's masks, drawn per block and replayed in backward ---

@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("call", ["encoder", "decoder"])
def test_chunked_backward_replays_each_blocks_dropout_mask(mode, call, monkeypatch):
    """The same seed gives the same forward and gradients with the blocks recomputed in backward
    (checkpoint) as with every block's tensors kept: the recomputation drew the forward's masks."""
    mha, positions, inputs = make(mode, call, torch.float64, dropout=0.3)
    recomputed = run("chunked", mha, positions, inputs)
    monkeypatch.setattr(chunked, "checkpoint", lambda fn, *args, **kwargs: fn(*args))
    kept = run("chunked", mha, positions, inputs)
    assert_all_close(recomputed, kept, torch.float64)
    mha.eval()
    assert (run("chunked", mha, positions, inputs)[0] - recomputed[0]).abs().max() > 1e-2  # dropout was on


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("mode", ["rel", "rel-values-only", "rel-shared-heads"])
def test_chunked_dropout_equals_the_reference_run_block_by_block(mode):
    """With a^V the reference route writes attention out and draws its dropout mask as a block does: the
    reference route run on the same rows, one block after the other, gives the chunked route's output."""
    mha, positions, inputs = make(mode, "encoder", torch.float64, dropout=0.3)
    got = run("chunked", mha, positions, inputs)[0]
    x, mask = inputs["x"], inputs["mask"]
    kv = mha.project_kv(torch.cat((inputs["earlier"], x), dim=1))
    with routes.use_route("reference"):
        torch.manual_seed(1)
        rows = [mha(x[:, i:i + 2], *kv, mask=mask, q_offset=i) for i in range(0, x.shape[1], 2)]
    torch.testing.assert_close(got, torch.cat(rows, dim=1), rtol=1e-12, atol=1e-12)


# --- memory: what autograd keeps for backward ---

def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while fn() runs (deterministic)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("mode", ["rel", "rel-keys-only", "t5"])
def test_chunked_keeps_no_logits_for_backward(mode, monkeypatch):
    """The reference keeps at least one (B, H, n, m) tensor for backward; the chunked route (blocks of 16
    rows here) keeps the blocks' inputs (views of q, k, v and of the stack's bias) and their outputs: beside
    the stack's (H, n, m) bias (T5, ALiBi), less than half of one."""
    monkeypatch.setattr(chunked, "BLOCK_BYTES", 1)
    B, n = 2, 256
    mha, positions, _ = make(mode, "encoder", torch.float32)
    x = torch.randn(B, n, D_MODEL, requires_grad=True)
    terms = NO_TERMS if positions is None else positions.terms(n, n, 0, x.device, x.dtype)
    logits = B * HEADS * n * n * 4
    saved = {}
    for route in ("reference", "chunked"):
        with routes.use_route(route):
            saved[route] = saved_bytes(lambda: mha(x, *mha.project_kv(x, terms), terms=terms))
    stack_bias = 0 if terms.bias is None else terms.bias.untyped_storage().nbytes()  # (H, n, m), one per stack
    assert saved["reference"] >= logits
    assert saved["chunked"] - stack_bias < logits / 2, (saved, logits)


# --- the chooser and its setting ---

def q_of(b: int, n: int, device: str = "cpu", d: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(b, 8, n, d, dtype=dtype, device=device)


def test_auto_on_the_cpu_chunks_long_rows_with_large_logits(monkeypatch):
    """auto on the CPU: chunked from CPU_MIN_ROWS rows on, where the (B, H, n, m) logits exceed CHUNK_BYTES;
    never flex; the reference for a decoding step (one row) and under torch.compile."""
    assert routes.choose(q_of(4, 1024), 1024, 0.1) == "chunked"  # 128 MiB of logits (bench: 617 -> 174 MiB)
    assert routes.choose(q_of(4, 1024), 1024, 0.0) == "chunked"  # never flex on the CPU in auto
    assert routes.choose(q_of(1, 1024), 1024, 0.1) == "reference"  # 32 MiB
    assert routes.choose(q_of(64, 512), 512, 0.1) == "reference"  # large logits but short rows: time first
    assert routes.choose(q_of(64, 1), 10**6, 0.0) == "reference"  # a decoding step
    monkeypatch.setattr(routes, "CHUNK_BYTES", 8 * 1024 * 64 * 4)
    monkeypatch.setattr(routes, "CPU_MIN_ROWS", 64)
    assert routes.choose(q_of(1, 64), 1024, 0.0) == "reference"  # exactly the threshold
    assert routes.choose(q_of(2, 64), 1024, 0.0) == "chunked"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert routes.choose(q_of(2, 64), 1024, 0.0) == "reference"


def test_auto_on_cuda_takes_flex_or_chunked_only_where_the_logits_are_large():
    """auto on CUDA (fake CUDA tensors: the rule reads shapes, dtypes and devices only): the reference while
    the (B, H, n, m) logits fit in CHUNK_BYTES, whatever the length; beyond, flex without attention dropout
    and chunked with it; the reference for a decoding step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert routes.choose(q_of(4, 128, "cuda"), 128, 0.0) == "reference"  # 2 MiB of logits
        assert routes.choose(q_of(1, 1024, "cuda"), 1024, 0.0) == "reference"  # 32 MiB
        assert routes.choose(q_of(4, 1024, "cuda"), 1024, 0.0) == "flex"  # 128 MiB
        assert routes.choose(q_of(4, 1024, "cuda"), 1024, 0.1) == "chunked"
        assert routes.choose(q_of(4, 1024, "cuda", d=24), 1024, 0.0) == "chunked"  # a head size flex lacks
        assert routes.choose(q_of(64, 1, "cuda"), 10**6, 0.0) == "reference"  # a decoding step


def test_the_layer_takes_the_chosen_route(monkeypatch, small_blocks):
    """MultiHeadAttention asks the chooser only when it has a relative term or a bias, and runs its pick."""
    calls = []
    monkeypatch.setattr(routes, "chunked_attention", lambda *a: calls.append("chunked") or torch.zeros(3, 2, 7, 16))
    for mode in ("rel", "t5"):
        mha, positions, inputs = make(mode, "encoder", torch.float32)
        with routes.use_route("chunked"):
            run_forward("chunked", mha, positions, inputs)
    plain = MultiHeadAttention(D_MODEL, HEADS, 0.0)
    x = torch.randn(3, 7, D_MODEL)
    with routes.use_route("chunked"):
        plain(x, *plain.project_kv(x))  # no term to route: SDPA
    assert calls == ["chunked", "chunked"]


def test_forced_routes_and_their_refusals():
    with routes.use_route("chunked"):
        assert routes.choose(q_of(1, 4), 4, 0.1) == "chunked"
    with routes.use_route("flex"):
        assert routes.choose(q_of(1, 4), 4, 0.0) == "flex"  # CPU inference
        assert routes.choose(q_of(1, 4), 4, 0.1) == "flex"  # with attention dropout (flex.py's Dropped)
        with pytest.raises(UserError, match="no backward on the CPU"):
            routes.choose(q_of(1, 4).requires_grad_(), 4, 0.0)
    with routes.use_route("reference"):
        assert routes.choose(q_of(64, 1024), 1024, 0.0) == "reference"
    with pytest.raises(UserError, match="RELMT_ATTENTION=fast: not an attention route"):
        with routes.use_route("fast"):
            pass


def test_flex_serves_only_without_dropout_and_for_kernel_head_sizes():
    assert routes.flex_serves(q_of(1, 4), 0.0)
    assert not routes.flex_serves(q_of(1, 4), 0.1)
    assert not routes.flex_serves(q_of(1, 4, d=8), 0.0)
    assert not routes.flex_serves(q_of(1, 4, d=48), 0.0)
    assert not routes.flex_serves(q_of(1, 4, dtype=torch.float64), 0.0)


def test_the_environment_variable_sets_the_route():
    code = "from relmt.model import routes; print(routes.setting())"
    env = {**os.environ, "RELMT_ATTENTION": "Chunked"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "chunked"


def test_export_traces_the_reference_route(monkeypatch):
    """Exported graphs (ONNX, AOTInductor) hold the reference route whatever the setting: torch.export
    of a relative layer with the chunked route forced never reaches it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the chunked route was traced into an export")

    monkeypatch.setattr(routes, "chunked_attention", refuse)
    mha, _, inputs = make("rel", "encoder", torch.float32)
    mha.eval()

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, *self.mha.project_kv(x))

    x = inputs["x"].detach()
    with routes.use_route("chunked"):
        program = torch.export.export(Layer(), (x,))
        with pytest.raises(AssertionError, match="traced into an export"):
            Layer()(x)
    torch.testing.assert_close(program.module()(x), Layer()(x))


# --- the whole model: every position mode, training and cached decoding, through the routes ---

def model(mode: str):
    cfg = ModelConfig(d_model=D_MODEL, n_heads=HEADS, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, **inc.MODES[mode])
    torch.manual_seed(sum(map(ord, mode)))
    return build_model(cfg, inc.V, inc.PAD)


MODEL_MODES = ["rel", "both", "rel-keys-only", "rel-values-only", "rel-shared-heads", "alibi", "t5"]


@pytest.mark.usefixtures("float64", "small_blocks")
@pytest.mark.parametrize("mode", MODEL_MODES)
def test_model_chunked_equals_reference_training_and_decoding(mode):
    net = model(mode).train()
    src, tgt = inc.batch()
    results = {}
    for route in ("reference", "chunked"):
        with routes.use_route(route):
            logits = net(src, tgt)
            grads = torch.autograd.grad(logits.pow(2).mean(), list(net.parameters()))
            results[route] = [logits, *grads]
    assert_all_close(results["chunked"], results["reference"], torch.float64)
    net.eval()
    with routes.use_route("chunked"), torch.no_grad():  # full pass and every cached step in the chunked route
        memory, src_mask = net.encode(src)
        inc.run_steps(net, tgt, memory, src_mask, None, 0, tgt.shape[1])


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("mode", ["rel", "t5"])
def test_model_flex_decomposition_equals_reference_in_training(mode, monkeypatch):
    monkeypatch.setattr(flex, "flex_core", flex.dense_core)
    net = model(mode).train()
    src, tgt = inc.batch()
    results = {}
    for route in ("reference", "flex"):
        monkeypatch.setattr(routes, "choose", lambda q, m, p, route=route: route)
        logits = net(src, tgt)
        results[route] = [logits, *torch.autograd.grad(logits.pow(2).mean(), list(net.parameters()))]
    assert_all_close(results["flex"], results["reference"], torch.float64)


@pytest.mark.parametrize("mode", ["rel", "t5"])
def test_compiled_flex_keeps_to_a_few_graphs_over_a_runs_batches(mode, monkeypatch):
    """torch.compile guards on the Python values in score_mod's and mask_mod's closures, and past its limit of
    graphs for one function it falls back to the unfused kernel, which writes the logits out (an H200 run of
    2026-11-27 did so: docs/results/gpu/issue43/log.txt). The full pass, both tails and the dropout passes
    share one graph per variant, so a model's encoder and decoder, trained with attention dropout and then
    validated, over batches of changing size, one sentence alone among them, compile at most 8 graphs, under
    the route's limit. Counted on the CPU with a backend that records each graph (the guards are the same)."""
    graphs = []
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):  # put back after
        compiled = flex.compile_flex(backend=lambda gm, inputs: graphs.append(gm) or gm.forward)
        limit = torch._dynamo.config.recompile_limit
        monkeypatch.setattr(flex, "_kernel", lambda q: compiled)
        net = model(mode)
        gen = torch.Generator().manual_seed(0)
        with routes.use_route("flex"), torch.no_grad():
            for training in (True, False):  # training with attention dropout (flex.py's Dropped), then validation
                net.train(training)
                for layer in net.modules():
                    if isinstance(layer, MultiHeadAttention):
                        layer.dropout = 0.1
                for b, s, t in ((3, 9, 8), (5, 12, 10), (2, 7, 11), (1, 10, 6), (4, 16, 13), (6, 11, 9)):
                    src = torch.randint(4, inc.V, (b, s), generator=gen)
                    src[0, -2:] = inc.PAD  # padding in the batch
                    net(src, torch.randint(4, inc.V, (b, t), generator=gen))
    assert 0 < len(graphs) <= 8 < limit, len(graphs)
    torch._dynamo.reset()


def compound_captures(gm) -> list[str]:
    """The values a graph's FlexAttention calls capture (score_mod's and mask_mod's other buffers) that are
    symbolic expressions other than a plain size symbol: -s79, 2*s3 + 1."""
    import sympy

    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "flex_attention" in str(node.target):
            for value in (a.meta.get("example_value") for group in node.args[7:9] for a in group):
                if isinstance(value, torch.SymInt) and not isinstance(value.node.expr, sympy.Symbol):
                    found.append(str(value))
    return found


@pytest.mark.parametrize("mode", ["rel", "t5", "alibi"])
def test_compiled_flex_captures_no_symbolic_expression(mode, monkeypatch):
    """torch 2.11 (the GPU machine's, 2026-11-28) lowers a captured symbolic expression as a buffer and fails
    ('ShapeAsConstantBuffer' object has no attribute 'dtype'; its flex common.maybe_realize skips plain symbols
    only): every value score_mod and mask_mod capture is a tensor or a plain size, in training with dropout and in
    validation, encoder and decoder. Checked on the graphs dynamo hands its backend, the same on any device."""
    graphs = []
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):
        compiled = flex.compile_flex(backend=lambda gm, inputs: graphs.append(gm) or gm.forward)
        monkeypatch.setattr(flex, "_kernel", lambda q: compiled)
        net = model(mode)
        gen = torch.Generator().manual_seed(0)
        with routes.use_route("flex"), torch.no_grad():
            for training in (True, False):
                net.train(training)
                for layer in net.modules():
                    if isinstance(layer, MultiHeadAttention):
                        layer.dropout = 0.1
                for b, s, t in ((3, 9, 8), (5, 12, 10), (1, 10, 6)):
                    src = torch.randint(4, inc.V, (b, s), generator=gen)
                    src[0, -2:] = inc.PAD
                    net(src, torch.randint(4, inc.V, (b, t), generator=gen))
    assert graphs and [e for gm in graphs for e in compound_captures(gm)] == []
    torch._dynamo.reset()


# --- CUDA (make test-gpu) ---

CUDA = torch.device("cuda")


@pytest.fixture
def fresh_dynamo():
    """Each case is a model of its own kind (keys, values, biases, masks, dtypes), which a run never mixes:
    a fresh compile cache per test keeps one process's cases from adding up to torch's limit of 8 graphs
    per function (past it, flex falls back to the unfused kernel)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def to_cuda(mha, positions, inputs):
    mha, positions = copy.deepcopy(mha).to(CUDA), copy.deepcopy(positions)
    if positions is not None:
        positions.to(CUDA)
    moved = {k: (v.detach().to(CUDA).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
             for k, v in inputs.items()}
    return mha, positions, moved


# Each variant of score_mod and mask_mod compiles its own FlexAttention kernels (forward and backward), so
# the CUDA cases are a covering subset: every call, every kind of logits term, a^V on and off.
GPU_CASES = [("rel", "encoder"), ("rel", "decoder"), ("rel", "step"), ("rel-shared-heads", "offset"),
             ("rel-keys-only", "encoder"), ("rel-values-only", "decoder"), ("rel-k0", "encoder"),
             ("t5", "encoder"), ("alibi", "decoder")]


@pytest.mark.gpu
@pytest.mark.usefixtures("no_tf32", "fresh_dynamo")
@pytest.mark.parametrize("mode,call", GPU_CASES)
def test_gpu_flex_and_chunked_equal_reference_float32(mode, call):
    mha, positions, inputs = to_cuda(*make(mode, call, torch.float32))
    want = run("reference", mha, positions, inputs)
    for route in ("flex", "chunked"):
        got = run(route, mha, positions, inputs)
        for i, (a, b) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, i=i, r=route: f"{r} {i}: {m}")


@pytest.mark.gpu
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("mode,call", GPU_CASES[:4] + GPU_CASES[7:])
def test_gpu_flex_bf16_within_bf16_tolerance(mode, call):
    """Under bf16 autocast the flex route is as close to the float32 reference as the reference route
    under bf16 is (tests/test_cuda.py's tolerances: 2% in outputs, 6% in gradients)."""
    mha, positions, inputs = to_cuda(*make(mode, call, torch.float32))
    want = run("reference", mha, positions, inputs)
    with torch.autocast(CUDA.type, dtype=torch.bfloat16):
        got = run("flex", mha, positions, inputs)
        ref16 = run("reference", mha, positions, inputs)

    def rel_err(a: list, b: list) -> float:
        a, b = (torch.cat([t.detach().float().flatten() for t in ts]) for ts in (a, b))
        return float((a - b).norm() / b.norm())

    assert rel_err(got[:1], want[:1]) < 0.02 and rel_err(got[1:], want[1:]) < 0.06
    assert rel_err(got, want) < 2 * rel_err(ref16, want) + 1e-3


@pytest.mark.gpu
@pytest.mark.usefixtures("no_tf32", "fresh_dynamo")
@pytest.mark.parametrize("mode,call", [("rel", "encoder"), ("rel", "decoder"), ("t5", "encoder")])
def test_gpu_flex_dropout_equals_the_written_out_attention_with_the_same_mask(mode, call, monkeypatch):
    """The compiled kernel recomputes the hashed dropout mask in every pass as the CPU's test of the route does:
    float32 on CUDA, outputs and every gradient against the chunked route with the same mask."""
    p = 0.3
    monkeypatch.setattr(flex.Dropped, "draw", classmethod(
        lambda cls, p, device: cls(torch.tensor(SEED, device=device), *counter_threshold(p))))
    monkeypatch.setattr(chunked, "dropout", counter_dropout(SEED, p))
    mha, positions, inputs = to_cuda(*make(mode, call, torch.float32, dropout=p))
    want = run("chunked", mha, positions, inputs)
    for i, (a, b) in enumerate(zip(run("flex", mha, positions, inputs), want)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"tensor {i}: {m}")


@pytest.mark.gpu
def test_gpu_auto_chooses_flex_without_dropout_and_chunked_with_it(monkeypatch):
    monkeypatch.setattr(routes, "CHUNK_BYTES", 0)
    assert routes.choose(q_of(2, 64, "cuda"), 64, 0.0) == "flex"
    assert routes.choose(q_of(2, 64, "cuda"), 64, 0.1) == "chunked"
    assert routes.choose(q_of(2, 1, "cuda"), 64, 0.0) == "reference"


def test_bench_attention_routes_runs(tmp_path):
    """scripts/bench/bench_attention_routes.py at a tiny size (its figures are not checked here)."""
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "scripts", "bench", "bench_attention_routes.py")
    subprocess.run([sys.executable, script, "--lengths", "16",
                    "--tokens", "64", "--d-model", "32", "--heads", "2", "--k", "2", "--repeats", "1",
                    "--min-seconds", "0", "--cases", "abs", "rel:reference", "rel:chunked@1", "t5:chunked",
                    "rel:reference+scatter", "--out", str(out), "--md", str(md)],
                   check=True, capture_output=True, text=True, cwd=root)
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["abs", "rel:reference", "rel:chunked@1", "t5:chunked", "rel:reference+scatter"]
    assert all(r["ms"] > 0 and r["peak_mib"] > 0 and r["auto"] == "reference" for r in rows)
    assert "| n " in md.read_text()


def test_bench_attention_routes_saves_each_case_memory_before_timing(monkeypatch):
    """A run that its time box cuts off keeps the memory of every case measured so far: measure_length hands
    save() the rows after each case, rel's peak over abs's included, before any time is taken."""
    from tests.scripts_import import load_script

    bench = load_script("bench_attention_routes")
    args = argparse.Namespace(tokens=64, d_model=32, heads=2, k=2, dropout=0.0, repeats=1, min_seconds=0.0,
                              precision="fp32", cases=["abs", "rel:reference", "rel:bogus"])
    saved = []
    monkeypatch.setattr(bench, "time_interleaved", lambda *a, **k: saved.append("timed") or {})
    with pytest.raises(KeyError):  # the timing, stubbed out above, never comes back
        bench.measure_length(16, args, torch.device("cpu"), save=lambda rows: saved.append(copy.deepcopy(rows)))
    assert [[r["case"] for r in rows] for rows in saved[:3]] == [["abs"], ["abs", "rel:reference"],
                                                                 ["abs", "rel:reference", "rel:bogus"]]
    assert saved[3] == "timed"
    rel = saved[1][1]
    assert rel["peak_mib"] > 0 and rel["peak_over_abs"] == rel["peak_mib"] / saved[1][0]["peak_mib"]
    assert "ms" not in rel and "error" in saved[2][2]


@pytest.mark.gpu
@pytest.mark.usefixtures("no_tf32", "fresh_dynamo")
@pytest.mark.parametrize("mode", ["rel", "t5"])
def test_gpu_model_trains_and_decodes_through_auto_as_through_the_reference(mode, monkeypatch):
    """A model whose heads flex takes (d_head 16) and no attention dropout, with CHUNK_BYTES 0 so that its
    small logits count as large: auto runs flex on CUDA for the teacher-forced pass and its gradients, and
    the reference route gives the same; cached decoding (steps by the reference, the prefix-free pass by
    flex) equals the full pass."""
    monkeypatch.setattr(routes, "CHUNK_BYTES", 0)
    cfg = ModelConfig(d_model=64, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, **inc.MODES[mode])
    torch.manual_seed(0)
    net = build_model(cfg, inc.V, inc.PAD).to(CUDA).train()
    src, tgt = (t.to(CUDA) for t in inc.batch())
    picked, choose = [], routes.choose
    monkeypatch.setattr(routes, "choose", lambda q, m, p: picked.append(choose(q, m, p)) or picked[-1])
    results = {}
    for route in ("auto", "reference"):
        with routes.use_route(route):
            logits = net(src, tgt)
            results[route] = [logits, *torch.autograd.grad(logits.pow(2).mean(), list(net.parameters()))]
    assert "flex" in picked
    for a, b in zip(results["auto"], results["reference"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    net.eval()
    with torch.no_grad():
        memory, src_mask = net.encode(src)
        full = net.decode(tgt, memory, src_mask)
        cache = None
        for t in range(tgt.shape[1]):
            logits, cache = net.decode_step(tgt[:, t], memory, src_mask, cache, step=t)
            real = tgt[:, t] != inc.PAD
            torch.testing.assert_close(logits[real], full[real, t], rtol=1e-4, atol=1e-4)


def test_a_flex_that_does_not_compile_falls_back_to_chunked_under_auto(monkeypatch, caplog):
    """A route never crashes a run: where the compiled kernel fails to build (torch 2.11 on 2026-11-28), auto's
    call takes chunked and so does every later one, with one warning; routes.report() says so. A forced flex
    is a UserError naming torch's version."""
    import torch._inductor.exc

    def broken(*args, **kwargs):
        raise torch._inductor.exc.InductorError(AttributeError("'ShapeAsConstantBuffer' has no 'dtype'"), None)

    monkeypatch.setattr(flex, "_kernel", lambda q: broken)
    monkeypatch.setattr(routes, "_flex_failure", None)
    monkeypatch.setattr(routes, "_ran", set())
    mha, positions, inputs = make("rel", "encoder", torch.float32)
    want = run("reference", mha, positions, inputs)
    q, k, v = (torch.randn(3, HEADS, 7, D_MODEL // HEADS) for _ in range(3))
    refusal = rf"RELMT_ATTENTION=flex: FlexAttention does not compile here \(torch {re.escape(torch.__version__)}\)"
    with routes.use_route("flex"), pytest.raises(UserError, match=refusal + ".*InductorError"):
        routes.attend("flex", q, k, v, mha.rel, None, None, False, 0, 0.0)
    monkeypatch.setattr(routes, "choose", lambda q, m, p: "flex")  # as auto chooses on CUDA for large logits
    with caplog.at_level("WARNING"):
        assert_all_close(run("auto", mha, positions, inputs), want, torch.float32)
        assert_all_close(run("auto", mha, positions, inputs), want, torch.float32)
    assert sum("takes the chunked route" in r.message for r in caplog.records) == 1
    report = routes.report()
    assert report["ran"] == ["chunked"] and "ShapeAsConstantBuffer" in report["flex_failed"]
