"""Every linear map of the model (Vaswani §3.2.2's projections, §3.3's feed-forward layers, §3.4's tied output
layer), and which CPU library multiplies its matrices in training.

On the CPU, torch's fp32 matrix products go to MKL's sgemm. Matrix products are about 80% of a CPU training step
(docs/results/performance/train_floor_cpu.md), and on an AMD EPYC with AVX-512 oneDNN, which torch also carries,
multiplies a training step's shapes about twice as fast as MKL (that page's floor with each library, and
perf_cpu_train.md's relmt rows with each). So in training, forward and backward, a linear map on CPU float32
tensors goes through oneDNN (`torch.ops.mkldnn._linear_pointwise`, on plain tensors: no layout conversion is kept):
y = x W^T + b, and in backward dx = g W and dW = g^T x (or (x^T g)^T), each one oneDNN product, and db = the sum
of g. oneDNN's products have no derivative in torch, so a backward with create_graph=True (a Hessian-vector
product) computes dx and dW with torch's differentiable ones.

It is the same float32 arithmetic in another summation order: results agree with MKL's to float32 rounding
(tests/test_linear.py), and a run is deterministic on either. Elsewhere `F.linear` runs as always: on CUDA,
in float64, under autocast (which casts inside torch's own ops), without gradients (decoding, export), under
torch.func's transforms, and inside torch.compile (Inductor picks its own kernels).

One setting picks the library, like RELMT_ATTENTION for the attention route: the environment variable
RELMT_CPU_GEMM=auto|onednn|mkl (auto when unset: oneDNN where torch has it; mkl: torch's default), read
when relmt is imported; `use_cpu_gemm("mkl")` (a context manager) sets it for a block. It is a property
of the run, not of the model: a checkpoint does not record it.

oneDNN keeps every primitive it creates in two caches keyed by the operands' shapes, its own
(ONEDNN_PRIMITIVE_CACHE_CAPACITY) and ideep's inside torch (LRU_CACHE_CAPACITY), 1,024 entries each, and a
primitive keeps its scratchpad, which holds the weight operand reordered into oneDNN's layout. In training that
operand is g^T for dW: as large as the logits' gradient for the output layer, and of a new shape with nearly every
batch. A Multi30k run grew by about 160 MB an update, and a run of issue 46 was killed at 13 GB.
`bound_onednn_caches` (called by the trainer before its first step) keeps one primitive in each cache: making a
primitive costs far less than its products take, and training runs as fast or faster
(docs/results/performance/onednn_memory.md). Decoding keeps the caches as they are: the compiled and AOTInductor
engines call oneDNN with prepacked weights in every step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmt.errors import UserError

ENV = "RELMT_CPU_GEMM"
CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's and ideep's primitive caches
CHOICES = ("auto", "onednn", "mkl")
_setting = os.environ.get(ENV, "auto").strip().lower() or "auto"


def setting() -> str:
    """The library asked for: RELMT_CPU_GEMM, or what `use_cpu_gemm` set."""
    if _setting not in CHOICES:
        raise UserError(f"{ENV}={_setting}: not a CPU matrix library; use one of {', '.join(CHOICES)}")
    return _setting


def cpu_gemm() -> str:
    """The library CPU training's linear maps use: onednn or mkl (auto: oneDNN where torch has it)."""
    if setting() == "auto":
        return "onednn" if torch.backends.mkldnn.is_available() else "mkl"
    return _setting


@contextlib.contextmanager
def use_cpu_gemm(name: str) -> Iterator[None]:
    """Force a library (or auto) inside the block, as RELMT_CPU_GEMM does for a whole run."""
    global _setting
    old, _setting = _setting, name
    try:
        yield
    finally:
        _setting = old


def bound_onednn_caches() -> dict[str, str]:
    """Keep one primitive in each of oneDNN's caches (see above), unless the environment sets a capacity. Both are
    read once, when the process first calls oneDNN: call this before (the trainer does). Returns the capacities."""
    return {var: os.environ.setdefault(var, "1") for var in CACHES}


def _onednn(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x (M, K) times w (N, K) transposed, plus b: (M, N), by oneDNN. x is read as contiguous rows; w may be any
    view, a transposed one included (oneDNN reorders its weight operand into its own layout anyway), but for a
    broadcast one (`_dense`)."""
    return _pointwise(x.contiguous(), _dense(w), b)


def _pointwise(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """F.linear with oneDNN's products in forward and backward."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = _onednn(x.reshape(-1, x.shape[-1]), w, b)  # (M, N)
        # not a view: autograd refuses in-place ops (relu_, +=) on a view made inside a Function
        return _unsafe_view(y, (*x.shape[:-1], w.shape[0]))

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        if torch.is_grad_enabled():  # create_graph=True: torch's differentiable products, for double backward
            dx = g.matmul(w) if ctx.needs_input_grad[0] else None
            dw = g2.t().mm(x2) if ctx.needs_input_grad[1] else None
        else:
            dx = _unsafe_view(_onednn(g2, w.t()), x.shape) if ctx.needs_input_grad[0] else None
            dw = _weight_grad(x2, g2) if ctx.needs_input_grad[1] else None
        db = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def _dense(t: Tensor) -> Tensor:
    """t with its broadcast (stride-0) dimensions written out. A loss that reduces a linear map's output directly
    (`.sum()`, `.mean()`) hands backward an expanded gradient, and oneDNN given one as its weight operand took about
    750x longer (issue 69's review: 25 s against 0.03 s at (4096, 512); scripts/bench/bench_linear_grad.py measures
    the two now)."""
    return t.contiguous() if t.numel() > 1 and 0 in t.stride() else t


def _unsafe_view(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """t.view(shape) that autograd does not record as a view (torch's matmul folds its products back the same way)."""
    return torch.ops.aten._unsafe_view(t, shape)


def _weight_grad(x: Tensor, g: Tensor) -> Tensor:
    """dW = g^T x (N, K) for x (M, K) and g (M, N). oneDNN reads its first operand as rows, so one of them is
    copied transposed: the narrower one. For a layer wider out than in (the output layer: N is the vocabulary),
    dW^T = x^T g with g read transposed as the weight operand; for one narrower out (the feed-forward layer's
    second map, K = 4 d_model), g^T x with x read transposed (scripts/bench/train_floor.py times the step)."""
    if g.shape[1] < x.shape[1]:
        return _onednn(g.t(), x.t())
    return _onednn(x.t(), g.t()).t().contiguous()


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, w, b); in CPU float32 training through oneDNN where `cpu_gemm()` says so (see above)."""
    if _training_on_cpu(x, w, b) and cpu_gemm() == "onednn":
        return _OneDnnLinear.apply(x, w, b)
    return F.linear(x, w, b)


def _training_on_cpu(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """CPU float32 operands with a gradient to compute, outside autocast, torch.func, torch.compile and
    torch.export."""
    if not torch.is_grad_enabled() or x.device.type != "cpu" or not x.numel():  # decoding leaves at the first test
        return False
    if x.dtype != torch.float32 or w.dtype != torch.float32 or (b is not None and b.dtype != torch.float32):
        return False
    if not (x.requires_grad or w.requires_grad) or torch.is_autocast_enabled("cpu"):
        return False
    if torch._C._are_functorch_transforms_active():  # torch.func: the Function has no setup_context, vmap or jvp
        return False
    return not (torch.compiler.is_compiling() or torch.compiler.is_exporting())


def _plain_cpu_float32(*ts: Tensor) -> bool:
    """Every operand a CPU float32 tensor, outside torch.compile and torch.export: oneDNN's products may serve."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts) and cpu_gemm() == "onednn"
            and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()))


# The three products of a linear map, for code that writes its own gradient (relmt/train/loss.py's chunked output
# layer): no autograd, oneDNN on CPU float32 where `cpu_gemm()` says so, torch's matmul elsewhere.
def product(x: Tensor, w: Tensor) -> Tensor:
    """x (M, K) w (N, K)^T: the forward product, (M, N)."""
    return _onednn(x, w) if _plain_cpu_float32(x, w) else x @ w.t()


def input_grad(g: Tensor, w: Tensor) -> Tensor:
    """g (M, N) w (N, K): the gradient of the input, (M, K)."""
    return _onednn(g, w.t()) if _plain_cpu_float32(g, w) else g @ w


def weight_grad(x: Tensor, g: Tensor) -> Tensor:
    """g (M, N)^T x (M, K): the gradient of the weight, (N, K)."""
    return _weight_grad(x, g) if _plain_cpu_float32(x, g) else g.t() @ x


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state_dict keys) whose product is `linear`'s."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
