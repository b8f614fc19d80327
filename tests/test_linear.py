"""relmt/model/linear.py: CPU float32 training's linear maps through oneDNN, pinned against float64 and against
torch's own F.linear (MKL), in float32, the precision of CPU training; and where F.linear runs unchanged."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from relmt.config import ModelConfig, PosKind
from relmt.errors import UserError
from relmt.model import linear as linear_module
from relmt.model.linear import Linear, cpu_gemm, linear, use_cpu_gemm
from relmt.model.transformer import build_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def operands(shape=(3, 37, 48), out=80, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(out, shape[-1], generator=g).mul_(0.1).requires_grad_()
    b = torch.randn(out, generator=g, requires_grad=True) if bias else None
    return x, w, b


def run(fn, x, w, b):
    """fn's output and the gradients of every operand, for a fixed upstream gradient."""
    y = fn(x, w, b)
    up = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
    leaves = [t for t in (x, w, b) if t is not None]
    return [y.detach(), *torch.autograd.grad(y, leaves, up)]


def in_float64(x, w, b):
    return [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("out", [80, 24])  # wider out than in (dW^T = x^T g) and narrower (dW = g^T x)
def test_onednn_forward_and_backward_match_float64_as_closely_as_torchs_own(bias, layout, out):
    """y = x W^T + b, dx = g W, dW = g^T x, db = sum g: the oneDNN products against the float64 naive ones
    are as close as torch's float32 F.linear (MKL) is, for a 3-D input, contiguous or a transposed view, and for
    a layer wider or narrower out than in (linear._weight_grad copies the narrower operand)."""
    x, w, b = operands(out=out, bias=bias)
    if layout == "transposed":  # (B, T, d) as a view of (T, B, d), as attention's reshapes leave it
        x = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    with use_cpu_gemm("onednn"):
        y = linear(x, w, b)
        assert type(y.grad_fn).__name__ == "_OneDnnLinearBackward"
        ours = run(linear, x, w, b)
    mkl = run(F.linear, x, w, b)
    reference = run(lambda *t: F.linear(*t), *in_float64(x, w, b))
    for name, a, m, r in zip(("y", "dx", "dW", "db"), ours, mkl, reference):
        assert a.dtype == torch.float32 and a.shape == r.shape, name
        err, torch_err = (a.double() - r).abs().max().item(), (m.double() - r).abs().max().item()
        assert err <= 4 * torch_err + 1e-6, (name, err, torch_err)
        torch.testing.assert_close(a, m, rtol=1e-5, atol=1e-5, msg=name)


def test_f_linear_runs_unchanged_without_gradients_under_autocast_in_float64_and_under_mkl():
    """Decoding (no grad), autocast (which casts inside torch's ops), float64 and RELMT_CPU_GEMM=mkl keep
    torch's F.linear bit for bit."""
    x, w, b = operands()
    with use_cpu_gemm("onednn"):
        with torch.no_grad():
            assert torch.equal(linear(x, w, b), F.linear(x, w, b))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x, w, b)
            assert y.dtype == torch.bfloat16 and torch.equal(y, F.linear(x, w, b))
        x64, w64, b64 = in_float64(x, w, b)
        assert torch.equal(linear(x64, w64, b64), F.linear(x64, w64, b64))
    with use_cpu_gemm("mkl"):
        y = linear(x, w, b)
        assert type(y.grad_fn).__name__ != "_OneDnnLinearBackward" and torch.equal(y, F.linear(x, w, b))


def test_the_setting_auto_means_onednn_and_a_bad_value_names_the_variable(monkeypatch):
    assert cpu_gemm() == "onednn"  # the default, where torch has oneDNN (this module's tests need it)
    with use_cpu_gemm("mkl"):
        assert cpu_gemm() == "mkl"
    with use_cpu_gemm("auto"):
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
        assert cpu_gemm() == "mkl"
    with use_cpu_gemm("blas"), pytest.raises(UserError, match="RELMT_CPU_GEMM=blas: .*auto, onednn, mkl"):
        linear(*operands())


def test_linear_keeps_nn_linears_parameters_and_state_dict():
    torch.manual_seed(0)
    ours, theirs = Linear(8, 4), torch.nn.Linear(8, 4)
    theirs.load_state_dict(ours.state_dict())
    assert isinstance(ours, torch.nn.Linear) and list(ours.state_dict()) == ["weight", "bias"]
    x = torch.randn(5, 8)
    with use_cpu_gemm("onednn"):
        torch.testing.assert_close(ours(x.requires_grad_()), theirs(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("positions", ["abs", "rel"])
def test_a_training_step_through_onednn_matches_mkl_to_float32_rounding(positions):
    """The whole model, teacher-forced loss and every parameter's gradient, with each library: equal to float32
    rounding (the products sum in another order), and the oneDNN route is taken in every linear map."""
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, positions=PosKind(positions),
                      max_relative_position=3)
    torch.manual_seed(0)
    model = build_model(cfg, 50, 0).train()
    src, tgt = torch.randint(1, 50, (4, 9)), torch.randint(1, 50, (4, 7))
    calls, apply = [], linear_module._OneDnnLinear.apply

    def counted(*args):
        calls.append(1)
        return apply(*args)

    results = {}
    for name in ("onednn", "mkl"):
        model.zero_grad(set_to_none=True)
        with use_cpu_gemm(name), pytest.MonkeyPatch.context() as mp:
            mp.setattr(linear_module._OneDnnLinear, "apply", counted)
            logits = model(src, tgt)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
            loss.backward()
        results[name] = [loss.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)]
        if name == "onednn":
            # per encoder layer q, kv, out, fc1, fc2; per decoder layer those and cross-attention's q, kv, out;
            # the output layer
            assert len(calls) == 2 * 5 + 2 * 8 + 1
    assert len(calls) == 2 * 5 + 2 * 8 + 1  # none more under mkl
    for a, b in zip(results["onednn"], results["mkl"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


GROWTH = """
import torch
from relmt.model.linear import bound_onednn_caches, linear, use_cpu_gemm
caps = bound_onednn_caches()  # without this line, the 150 shapes below add about 270 MiB
torch.set_num_threads(1)
w = torch.randn(1024, 32, requires_grad=True)


def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def step(m):  # a training step's dW reads g^T (1024 x m) as oneDNN's weight operand
    x = torch.randn(m, 32, requires_grad=True)
    linear(x, w).backward(torch.randn(m, 1024))


with use_cpu_gemm("onednn"):
    step(500)
    start = rss_mib()
    for m in range(501, 651):  # 150 batches, each of a new shape, as token-budget batches are
        step(m)
print(caps, rss_mib() - start)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident memory from /proc")
def test_bounded_onednn_caches_keep_memory_flat_over_a_new_shape_per_batch():
    """oneDNN caches 1,024 primitives per shape, each keeping its scratchpad: unbounded, 150 shapes add about
    270 MB here (and a Multi30k run by about 160 MB an update); bound_onednn_caches, as the
    trainer calls it in a fresh process, keeps one primitive per cache."""
    env = {k: v for k, v in os.environ.items() if k not in linear_module.CACHES}
    out = subprocess.run([sys.executable, "-c", GROWTH], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    caps, _, growth = out.strip().rpartition(" ")
    assert caps == "{'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '1', 'LRU_CACHE_CAPACITY': '1'}"
    assert float(growth) < 80, f"resident memory grew by {growth} MiB over 150 shapes"


def compare(ours, mkl, reference, names):
    """ours as close to the float64 reference as torch's float32 F.linear (MKL) is, and equal to it to float32
    rounding."""
    for name, a, m, r in zip(names, ours, mkl, reference):
        assert a.dtype == torch.float32 and a.shape == r.shape, name
        err, torch_err = (a.double() - r).abs().max().item(), (m.double() - r).abs().max().item()
        assert err <= 4 * torch_err + 1e-6, (name, err, torch_err)
        torch.testing.assert_close(a, m, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("op", ["relu_", "+=", "masked_fill_"])
def test_the_output_takes_in_place_ops_as_f_linears_does(op):
    """layer(x).relu_(), y += r and y.masked_fill_(...) in training, which nn.Linear allows: the oneDNN output is
    not a view made inside the autograd.Function (autograd refuses in-place ops on one), and the gradients through
    the in-place op match F.linear's."""
    gen = torch.Generator().manual_seed(2)
    r, mask = torch.randn(3, 37, 80, generator=gen), torch.rand(3, 37, 80, generator=gen) < 0.3

    def edited(fn):
        def f(x, w, b):
            y = fn(x, w, b)
            if fn is linear:
                assert type(y.grad_fn).__name__ == "_OneDnnLinearBackward" and not y._is_view()
            if op == "relu_":
                y.relu_()
            elif op == "+=":
                y += r.to(y.dtype)
            else:
                y.masked_fill_(mask, 0.0)
            return y
        return f

    x, w, b = operands()
    with use_cpu_gemm("onednn"):
        ours = run(edited(linear), x, w, b)
    compare(ours, run(edited(F.linear), x, w, b), run(edited(F.linear), *in_float64(x, w, b)), ("y", "dx", "dW", "db"))


def test_a_hessian_vector_product_through_onednn_equals_f_linears(monkeypatch):
    """Double backward: with create_graph=True, backward computes the gradients with torch's differentiable
    products, so a Hessian-vector product of a loss through the layer equals F.linear's (not zero). A backward
    without create_graph keeps oneDNN's products: dx and dW, after forward's one."""
    x, w, b = operands()
    gen = torch.Generator().manual_seed(3)
    v = [torch.randn(t.shape, generator=gen) for t in (x, w, b)]
    calls, onednn = [], linear_module._onednn
    monkeypatch.setattr(linear_module, "_onednn", lambda *t: calls.append(1) or onednn(*t))

    def hvp(fn, x, w, b):
        grads = torch.autograd.grad(fn(x, w, b).tanh().sum(), (x, w, b), create_graph=True)
        assert len(calls) == (4 if fn is linear else 0)  # forward's product only
        dot = sum((g * u.to(g.dtype)).sum() for g, u in zip(grads, v))
        hv = torch.autograd.grad(dot, (x, w, b))  # through _OneDnnLinear's backward again, without create_graph
        assert len(calls) == (6 if fn is linear else 0)
        return [g.detach() for g in grads] + list(hv)

    with use_cpu_gemm("onednn"):
        linear(x, w, b).sum().backward()
        assert len(calls) == 3
        ours = hvp(linear, x, w, b)
    calls.clear()
    names = ("dx", "dW", "db", "Hv_x", "Hv_W", "Hv_b")
    compare(ours, hvp(F.linear, x, w, b), hvp(F.linear, *in_float64(x, w, b)), names)


@pytest.mark.parametrize("transform", ["grad", "vmap(grad)"])
def test_torch_func_transforms_through_linear_equal_f_linears(transform):
    """torch.func's transforms take F.linear's route (the autograd.Function has no setup_context, vmap rule or
    jvp): torch.func.grad, and per-sample gradients by vmap over it, equal F.linear's."""
    x, w, b = operands()
    x = x.detach()

    def transformed(fn):
        def loss(w, b, x):
            return fn(x, w, b).tanh().sum()
        grad = torch.func.grad(loss, argnums=(0, 1))
        return grad if transform == "grad" else torch.func.vmap(grad, in_dims=(None, None, 0))

    with use_cpu_gemm("onednn"):
        ours = transformed(linear)(w, b, x)
    for name, a, m in zip(("dW", "db"), ours, transformed(F.linear)(w, b, x)):
        torch.testing.assert_close(a, m, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_an_expanded_gradient_reaches_onednn_dense(reduce, monkeypatch):
    """Issue 69 defect 8: `linear(x, w).sum().backward()` hands backward a stride-0 gradient, which oneDNN took
    about 750x longer to use as an operand: every operand it gets is dense, and the gradients are torch's."""
    seen = []
    real = linear_module._pointwise

    def spy(a, b, bias):
        seen.extend((a.stride(), b.stride()))
        return real(a, b, bias)

    monkeypatch.setattr(linear_module, "_pointwise", spy)
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(48, 32, requires_grad=True)
    with use_cpu_gemm("onednn"):
        getattr(linear(x, w), reduce)().backward()
    assert seen and all(0 not in stride for stride in seen), seen
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    getattr(F.linear(x2, w2), reduce)().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
