"""The device lane: relmt's CUDA code paths run on a CPU-only machine, failing where a GPU would fail.

A GPU is lent here rarely (../shared/GPU.md), and code written on a CPU takes its CUDA branches only there: the
decoding crash of 2026-11-28 (a CPU mask meeting CUDA logits in beam.py) sat in main for two days. Inside
`fake_cuda()`:

- A tensor "on CUDA" is a `LaneTensor`: a wrapper whose C++ device is PrivateUse1 (renamed `lane`, with torch's
  Python device guard, so autograd's engine takes it) and which holds a real CPU tensor. To Python it says
  `device == cuda:0` and `is_cuda`, so relmt takes its CUDA branches, and `device=x.device` names CUDA.
- A `TorchFunctionMode` maps every device argument that names CUDA (`"cuda"`, `torch.device("cuda", 0)`,
  `.cuda()`, `.to("cuda")`) to the lane, and `torch.autocast("cuda")` to the lane's autocast (so bf16 paths
  run in bf16, with CUDA's autocast op lists).
- A `TorchDispatchMode` sees every aten op. Where an op takes tensors of both devices it applies CUDA's rule
  and raises CUDA's error ("Expected all tensors to be on the same device ...") naming the op; otherwise it
  runs the op on the CPU data and tags its outputs with the device the op would give them on a GPU.
- `torch.cuda`'s functions that relmt calls answer as one device would (available, one device, RNG states, no
  memory counted).

CUDA's device rules, as the lane applies them (ATen's TensorIterator and the ops' own checks):
- every tensor operand of an op is on one device, except: a 0-d CPU tensor in a pointwise op (CUDA reads it as
  a scalar), but never as masked_fill's mask; CPU indices in advanced indexing (index, index_put_); the two
  sides of a copy (`copy_`, `.to`), which cross devices.

The values are real: `.item()`, boolean indexing, and whole search and training loops run, and their results
equal the CPU's. Every read of a CUDA value by the host is counted in `lane.syncs` (with where it happened):
`.item()` / `bool()`, a copy to the CPU, and the ops whose output size depends on the data (nonzero, boolean
indexing, masked_select, repeat_interleave without output_size, unique); a GPU stalls at each.

Out of its reach: torch.compile (Dynamo and Inductor see the wrapper, not CUDA), streams, events, NCCL and
`torch.distributed`, CUDA graphs, kernels' numerics (bf16 runs on the CPU's bf16 kernels), memory limits, and
a CUDA op that the CPU lacks (or the reverse), except those in `_CUDA_ONLY`, computed as CUDA computes them.
A metadata-changing in-place op (`resize_`, `set_`, `t_`) is refused rather than mis-tracked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "lane"  # PrivateUse1's name in this process
CUDA = torch.device("cuda", 0)
aten = torch.ops.aten


def _flat(x) -> list:
    return tree_flatten(x)[0]


def _register() -> torch.device:
    """Name PrivateUse1 `lane` once per process, with a device guard, hooks and a module that offers autocast."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        from torch.utils.backend_registration import _DummyBackendModule, _setup_privateuseone_for_python_backend

        class _Module(_DummyBackendModule):
            def get_amp_supported_dtype(self):
                return [torch.float16, torch.bfloat16]

        _setup_privateuseone_for_python_backend(NAME, backend_module=_Module())
        _autocast_as_cuda()
    return torch.device(NAME, 0)


# CUDA's autocast op lists (ATen's autocast_mode.cpp): run in the autocast dtype, in float32, or in the widest
# dtype of the operands; every other op falls through
_LOWER = ("_convolution conv1d conv2d conv3d convolution prelu addmm addmv addr matmul einsum mm mv linear addbmm "
          "baddbmm bmm chain_matmul linalg_multi_dot _scaled_dot_product_flash_attention "
          "scaled_dot_product_attention").split()
_FP32 = ("acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm "
         "native_layer_norm group_norm frobenius_norm nuclear_norm cosine_similarity nll_loss nll_loss2d kl_div "
         "l1_loss smooth_l1_loss huber_loss mse_loss binary_cross_entropy_with_logits dist cdist renorm logsumexp "
         "prod softmax log_softmax cumprod cumsum linalg_vector_norm sum").split()
_PROMOTE = "addcdiv addcmul atan2 cross dot vdot index_put tensordot scatter_add stack cat".split()
_LIBS: list = []


def _autocast_as_cuda() -> None:
    """Autocast kernels for the lane with CUDA's op lists (torch registers none for PrivateUse1)."""
    key = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _LIBS.extend((fallback, lib))

    def floats(args, kwargs) -> list[Tensor]:
        return [t for t in _flat((args, kwargs)) if isinstance(t, Tensor) and t.is_floating_point()]

    def kernel(op, rule):
        def run(*args, **kwargs):
            if rule == "lower":
                dtype = torch.get_autocast_dtype(NAME)
            elif rule == "fp32":
                dtype = torch.float32
            else:
                dtype = functools.reduce(torch.promote_types, [t.dtype for t in floats(args, kwargs)], torch.bfloat16)

            def cast(x):
                usable = isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64
                return x.to(dtype) if usable else x

            with torch._C._ExcludeDispatchKeyGuard(key):
                return op(*tree_map(cast, args), **tree_map(cast, kwargs))
        return run

    for rule, names in (("lower", _LOWER), ("fp32", _FP32), ("promote", _PROMOTE)):
        for name in names:
            packet = getattr(aten, name)
            for overload in packet.overloads():
                if "out" in overload:
                    continue
                lib.impl(name if overload == "default" else f"{name}.{overload}",
                         kernel(getattr(packet, overload), rule), "AutocastPrivateUse1")


LANE = _register()


class LaneTensor(Tensor):
    """A tensor on the lane: its CPU data in `inner`; `device` says cuda:0."""

    inner: Tensor

    @staticmethod
    def __new__(cls, inner: Tensor, requires_grad: bool = False):
        r = Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                          storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                          layout=inner.layout, device=LANE, requires_grad=requires_grad)
        r.inner = inner
        return r

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    def get_device(self) -> int:
        return 0

    def __repr__(self, **kwargs) -> str:
        return f"LaneTensor({self.inner!r}, device='cuda:0')"

    def __reduce_ex__(self, protocol):  # torch.save writes its data as a CPU tensor's (map_location="cpu" reads both)
        return self.inner.__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _current is None:
            raise RuntimeError(f"a lane tensor met {func} outside fake_cuda()")
        return _current.run(func, args, kwargs or {})


@dataclass
class Sync:
    op: str
    where: str  # the innermost relmt frame that asked


@dataclass
class Lane:
    """What one `fake_cuda()` saw: each host read, in order."""

    syncs: list[Sync] = field(default_factory=list)
    counting: bool = True
    data: str = "cpu"  # where the values live: "meta" for shapes alone (no values: nothing may read one)
    on_op: object = None  # called as on_op(func, args, kwargs, out) after each op on the lane, args unwrapped

    def run(self, func, args, kwargs):
        flat, _ = tree_flatten((args, kwargs))
        lanes = [t for t in flat if isinstance(t, LaneTensor)]
        to_lane = _names_lane(kwargs.get("device"))
        if not lanes and not to_lane:
            return func(*args, **kwargs)
        if lanes:
            _check(func, args, kwargs)
            self._count(func, args, kwargs)
        unwrapped = tree_map(lambda x: x.inner if isinstance(x, LaneTensor) else x, (args, kwargs))
        uargs, ukwargs = unwrapped
        if to_lane:
            ukwargs = {**ukwargs, "device": torch.device(self.data)}
        if func in _CUDA_ONLY and self.data != "meta":
            out = _CUDA_ONLY[func](*uargs, **ukwargs)
        else:
            out = func(*uargs, **ukwargs)
        if self.on_op is not None:
            self.on_op(func, uargs, ukwargs, out)
        if func in _TRANSFERS:
            dest = kwargs.get("device")
            on_lane = _names_lane(dest) if dest is not None else isinstance(args[0], LaneTensor)
        elif func.overloadpacket in (aten.copy_, aten.copy):
            on_lane = isinstance(args[0], LaneTensor)
        else:
            on_lane = True
        inners = {id(x.inner): x for x in lanes}

        def wrap(x):
            if not isinstance(x, Tensor):
                return x
            if id(x) in inners:  # an in-place op gives back its operand
                return inners[id(x)]
            return LaneTensor(x) if on_lane else x

        return tree_map(wrap, out)

    def _count(self, func, args, kwargs) -> None:
        if not self.counting:
            return
        packet = func.overloadpacket
        sync = packet in _SYNCING
        if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
            sync = any(isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in _flat(args[1]))
        if packet is aten.repeat_interleave:
            sync = kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
        if func in _TRANSFERS:
            sync = isinstance(args[0], LaneTensor) and not _names_lane(kwargs.get("device", LANE))
        if packet is aten.copy_:
            sync = not isinstance(args[0], LaneTensor)
        if sync:
            self.syncs.append(Sync(str(func), _where()))

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Host reads inside are not counted (a test's own checks)."""
        old, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = old


_TRANSFERS = {aten._to_copy.default}
# ops that CUDA has and the CPU lacks, run on the CPU data as CUDA computes them: bmm with a float32 output for
# half-precision operands (cuBLAS accumulates and writes in float32)
_CUDA_ONLY = {aten.bmm.dtype: lambda a, b, out_dtype: torch.bmm(a.to(out_dtype), b.to(out_dtype))}
_SYNCING = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_dim, aten._unique2,
            aten._unique, aten.unique_consecutive, aten.equal, aten.is_nonzero, aten.nonzero_static}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index,
             aten._unsafe_index_put}
_REFUSED = {aten.resize_, aten.set_, aten.t_, aten.transpose_, aten.squeeze_, aten.unsqueeze_, aten.as_strided_,
            aten.swapdims_, aten.swapaxes_}


def _names_lane(device) -> bool:
    return device is not None and torch.device(device).type == NAME


def _check(func, args, kwargs) -> None:
    """CUDA's device rules for one op (the module's docstring)."""
    packet = func.overloadpacket
    if packet in _REFUSED:
        raise NotImplementedError(f"the device lane does not track {func} on a CUDA tensor")
    if packet in (aten.copy_, aten.copy) or func in _TRANSFERS or packet is aten._local_scalar_dense:
        return
    operands = list(enumerate(_flat((args, kwargs))))
    if packet in _INDEXING:  # CUDA moves CPU indices itself
        operands = [(i, t) for i, t in enumerate(_flat((args[0], args[2:], kwargs)))]
    pointwise = torch.Tag.pointwise in func.tags
    for i, t in operands:
        if not isinstance(t, Tensor) or isinstance(t, LaneTensor):
            continue
        if t.dim() == 0 and pointwise and not (packet is aten.masked_fill and i == 1):
            continue  # a CPU scalar
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:0 and {t.device}! (device lane: {func}, a CPU operand of shape "
                           f"{tuple(t.shape)}, at {_where()})")


def _where() -> str:
    """The innermost frame of relmt's own code (or a test's) on the stack."""
    for frame in reversed(traceback.extract_stack()):
        if "/relmt/" in frame.filename or "/tests/test_" in frame.filename or "/scripts/" in frame.filename:
            return f"{frame.filename.rsplit('/relmt/', 1)[-1]}:{frame.lineno} {frame.line}"
    return "?"


class _Dispatch(TorchDispatchMode):
    def __init__(self, lane: Lane):
        super().__init__()
        self.lane = lane

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.lane.run(func, args, kwargs or {})


def _while_loop(cond_fn, body_fn, carried_inputs):
    """torch's while_loop (relmt.export.graphs.LoopGraph) as the plain loop it means, run eagerly: torch's own
    eager while_loop goes through Dynamo, which the lane's tensors are out of reach of. The host reads the
    predicate at each iteration, a counted sync, as an eager loop on a GPU does."""
    carried = tuple(carried_inputs)
    while bool(cond_fn(*carried)):
        carried = tuple(body_fn(*carried))
    return carried


def _to_lane_device(x):
    if isinstance(x, (str, torch.device)) and not isinstance(x, Tensor):
        try:
            d = torch.device(x)
        except (RuntimeError, TypeError):
            return x
        if d.type == "cuda":
            return LANE
    return x


class _Functions(TorchFunctionMode):
    """CUDA device arguments named in Python become the lane."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (Tensor.tolist, Tensor.numpy) and isinstance(args[0], LaneTensor):
            if _current.counting:  # a copy to the host
                _current.syncs.append(Sync(str(func.__name__), _where()))
            return func(args[0].inner, *args[1:], **kwargs)
        if func in (Tensor.__getitem__, Tensor.__setitem__) and isinstance(args[0], LaneTensor):
            args = (args[0], _list_indices(args[1]), *args[2:])  # torch would build them on the lane in C++
        if func is Tensor.new_tensor and isinstance(args[0], LaneTensor) and _names_lane(kwargs.get("device", LANE)):
            dtype = kwargs.get("dtype") or args[0].dtype  # a copy from the host, which torch makes in C++
            return torch.tensor(args[1], dtype=dtype).to(LANE).requires_grad_(kwargs.get("requires_grad", False))
        if func is Tensor.cuda:
            return args[0].to(LANE, **{k: v for k, v in kwargs.items() if k == "non_blocking"})
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _to_lane_device(kwargs["device"])}
            if func in (torch.tensor, torch.as_tensor, torch.asarray) and _names_lane(kwargs["device"]):
                return func(*args, **{**kwargs, "device": "cpu"}).to(LANE)  # torch.tensor fills the device itself
        if func in (Tensor.to, Tensor.new_tensor, Tensor.new_empty, Tensor.new_zeros, Tensor.new_ones,
                    Tensor.new_full):
            args = tuple(_to_lane_device(a) for a in args)
        return func(*args, **kwargs)


def _list_indices(index):
    """Python lists in an index as CPU index tensors (CUDA takes CPU indices; the module's docstring)."""
    if isinstance(index, list):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    return index


def _as_cuda(real, device_type=None):
    """torch.is_autocast_enabled / get_autocast_dtype with "cuda" answered for the lane."""
    if device_type is None:
        return real()
    return real(NAME if device_type == "cuda" else device_type)


class _Autocast(torch.autocast):
    """torch.autocast("cuda") as the lane's autocast."""

    def __init__(self, device_type, *args, **kwargs):
        super().__init__(NAME if device_type == "cuda" else device_type, *args, **kwargs)


_current: Lane | None = None


@contextlib.contextmanager
def fake_cuda(data: str = "cpu") -> Iterator[Lane]:
    """Run relmt as if on one CUDA device (the module's docstring); yields the Lane that counts host reads.
    data="meta": the tensors hold shapes alone (scripts/gpu/roofline.py), so nothing may read a value."""
    global _current
    lane = Lane(data=data)
    state = {"cuda": None}

    def get_rng_state_all():
        return [torch.get_rng_state()]

    def set_rng_state_all(states):
        state["cuda"] = states

    patches = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda d: None, "synchronize": lambda d=None: None, "get_device_name": lambda d=None: "lane",
        "get_device_capability": lambda d=None: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "manual_seed": lambda s: None, "manual_seed_all": lambda s: None,
        "get_rng_state_all": get_rng_state_all, "set_rng_state_all": set_rng_state_all,
        "reset_peak_memory_stats": lambda d=None: None, "memory_allocated": lambda d=None: 0,
        "max_memory_allocated": lambda d=None: 0, "empty_cache": lambda: None,
    }
    with contextlib.ExitStack() as stack:
        mp = stack.enter_context(_patch())
        try:
            # the module, not the function of the same name that torch._higher_order_ops exports
            mp.setattr(importlib.import_module("torch._higher_order_ops.while_loop"), "while_loop", _while_loop)
        except ImportError:  # a torch without while_loop: nothing of relmt's uses it there
            pass
        for name, fn in patches.items():
            mp.setattr(torch.cuda, name, fn)
        engine = torch.autograd._engine_run_backward

        def run_backward(*args, **kwargs):  # autograd's engine runs a backward with the modes on the stack then,
            with _Functions():  # and a mode handling a call (Tensor.backward) is off it
                return engine(*args, **kwargs)
        mp.setattr(torch.autograd, "_engine_run_backward", run_backward)
        mp.setattr(torch, "autocast", _Autocast)
        mp.setattr(torch.amp, "autocast", _Autocast)
        # CUDA's autocast state is the lane's (torch.utils.checkpoint reads it to recompute a block as it ran)
        for name in ("is_autocast_enabled", "get_autocast_dtype"):
            mp.setattr(torch, name, functools.partial(_as_cuda, getattr(torch, name)))
        old, _current = _current, lane
        stack.callback(_restore, old)
        stack.enter_context(_Functions())
        stack.enter_context(_Dispatch(lane))
        yield lane


def _restore(old: Lane | None) -> None:
    global _current
    _current = old


@contextlib.contextmanager
def _patch():
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        yield mp


def on_cpu(x):
    """A lane tensor's data (or a structure of them) as plain CPU tensors, for a test's comparisons."""
    return tree_map(lambda t: t.inner if isinstance(t, LaneTensor) else t, x)
