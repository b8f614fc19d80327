"""Which code computes self-attention that has relative terms (Shaw et al. 2018 §3) or a logits bias
(ALiBi, T5): all routes compute the same function (Shaw §3.1 eqs. (3)-(4), computed as in §3.3), they
differ in memory and speed.

- reference: `MultiHeadAttention`'s own code (relmt/model/attention.py): SDPA with a float bias for
  q·a^K, ALiBi and T5; the attention written out when a^V is on. It holds (B, H, n, m) logits (and
  autograd keeps them for backward). Tests pin the other routes against it, and exports trace it.
- chunked (relmt/model/chunked.py): the written-out attention over blocks of query rows, each block
  recomputed in backward: O(B·H·c·m) memory, exact on every device, with attention dropout.
- flex (relmt/model/flex.py): FlexAttention with Shaw's terms as a score_mod and a band-plus-tails
  value term: O(B·H·n·k) memory. CUDA only for training (on the CPU torch has no backward for it).
  Attention dropout is a mask hashed from each weight's coordinates that every pass recomputes (one
  pass more than without dropout).

A route never crashes a run on its own: where auto's flex fails to compile (torch 2.11 did, 2026-11-28), the
call and every later one take chunked, with one warning, and `report()` (in a training run's metrics.json)
names the routes that ran and why flex stopped. A forced flex that cannot compile is a UserError.

One setting picks the route, for training, validation and decoding alike: the environment variable
RELMT_ATTENTION=auto|reference|chunked|flex (auto when unset), read when relmt is imported; in code,
`use_route("chunked")` (a context manager) sets it for a block. It is a property of the run, not of the
model: a checkpoint does not record it, and every route reads the same weights.

auto picks, per call:
- reference when exporting (ONNX, torch.export, AOTInductor: the graphs must not hold a Python loop
  or a FlexAttention kernel), for a single query row (a decoding step: no n x m tensor exists), and
  under torch.compile on the CPU;
- on CUDA, the reference until its (B, H, n, m) logits would exceed `CHUNK_BYTES`; beyond, flex where
  it serves (no attention dropout, a head size that is a power of two >= 16, a float32/bf16/fp16 dtype),
  else chunked. The one CUDA measurement so far (docs/results/gpu/gpu_issue43.md, an H200) found the
  reference as fast as chunked at n = 128 (flex there had fallen back to its unfused kernel after torch's
  8 compilations, since fixed in flex.py), and each new shape of flex compiles: flex is taken where memory
  asks for it, not before;
- on the CPU: chunked once the logits would exceed `CHUNK_BYTES` from `CPU_MIN_ROWS` query rows on, else
  the reference (scripts/bench/bench_attention_routes.py, docs/results/performance/attention_routes_cpu.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from relmt.errors import UserError
from relmt.model.chunked import chunked_attention
from relmt.model.flex import FlexCompileError, flex_attention
from relmt.model.positions import RelativePositions

log = logging.getLogger(__name__)

ROUTES = ("auto", "reference", "chunked", "flex")
ENV = "RELMT_ATTENTION"
# auto, where flex does not serve: chunked once the reference route's (B, H, n, m) logits would take more than
# CHUNK_BYTES, and on the CPU only from CPU_MIN_ROWS query rows on (docs/results/performance/attention_routes_cpu.md)
CHUNK_BYTES = 64 * 2**20
CPU_MIN_ROWS = 1024

_setting = os.environ.get(ENV, "auto").strip().lower() or "auto"
_ran: set[str] = set()  # the routes attend() has run (chunked, flex) since the last report(reset=True)
_flex_failure: str | None = None  # why flex stopped compiling in this process; auto then takes chunked


def setting() -> str:
    """The route asked for: RELMT_ATTENTION, or what `use_route` set."""
    if _setting not in ROUTES:
        raise UserError(f"{ENV}={_setting}: not an attention route; use one of {', '.join(ROUTES)}")
    return _setting


@contextmanager
def use_route(name: str) -> Iterator[None]:
    """Force a route (or auto) inside the block, as RELMT_ATTENTION does for a whole run."""
    global _setting
    old, _setting = _setting, name
    try:
        setting()
        yield
    finally:
        _setting = old


def _exporting() -> bool:
    return (torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
            or torch.jit.is_scripting())


def flex_serves(q: Tensor, p: float) -> bool:
    """auto takes flex for this call: a head size and a dtype its kernels take, and no attention dropout (the
    route's dropout, relmt/model/flex.py's `Dropped`, costs one more pass, and awaits a GPU measurement)."""
    d = q.shape[-1]
    return p == 0.0 and d >= 16 and d & (d - 1) == 0 and q.dtype in (torch.float32, torch.bfloat16, torch.float16)


def choose(q: Tensor, m: int, p: float) -> str:
    """The route for queries q (B, H, n, D) against m keys, attention dropout p (0 in eval mode)."""
    if _setting == "auto" and q.shape[2] == 1:  # a decoding step, every layer every step: the cheap test first
        return "reference"
    if _exporting():
        return "reference"
    forced = setting()
    if forced == "flex":
        if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
            raise UserError(f"{ENV}=flex: FlexAttention has no backward on the CPU (torch {torch.__version__}): "
                            f"train there with {ENV}=chunked or auto; flex serves CPU inference only")
        if q.device.type == "cpu" and torch.compiler.is_compiling():
            raise UserError(f"{ENV}=flex: compiled FlexAttention on the CPU returns no log-sum-exp, which the "
                            f"flex route needs: use {ENV}=chunked or auto with torch.compile there")
    if forced != "auto":
        return forced
    b, h, n, _ = q.shape
    if n == 1 or b * h * n * m * q.element_size() <= CHUNK_BYTES:
        return "reference"
    if q.device.type == "cuda":
        return "flex" if _flex_failure is None and flex_serves(q, p) else "chunked"
    if q.device.type == "cpu" and (torch.compiler.is_compiling() or n < CPU_MIN_ROWS):
        return "reference"
    return "chunked"


def attend(route: str, q: Tensor, k: Tensor, v: Tensor, rel: RelativePositions | None, bias: Tensor | None,
           mask: Tensor | None, causal: bool, q_offset: int, p: float) -> Tensor:
    """Attention by `route` ("chunked" or "flex"): q (B, H, n, D) scaled by 1/sqrt(d_z), k and v (B, H, m, D),
    Shaw's tables `rel`, the stack's bias (H, n, m), the keep-mask broadcastable to (B, 1, n, m).
    Returns (B, H, n, D)."""
    global _flex_failure
    if route == "flex":
        try:
            out = flex_attention(q, k, v, rel, bias, mask, causal, q_offset, p=p)
            _ran.add("flex")
            return out
        except FlexCompileError as e:
            if _setting == "flex":
                raise UserError(f"{ENV}=flex: {e}; use {ENV}=chunked or auto") from e
            if _flex_failure is None:
                log.warning("%s; attention takes the chunked route from here on (%s=auto)", e, ENV)
            _flex_failure = str(e)
    assert route in ("chunked", "flex"), route
    _ran.add("chunked")
    return chunked_attention(q, k, v, rel, bias, mask, causal, q_offset, p)


def report(reset: bool = False) -> dict:
    """The routes that ran besides the reference (chunked, flex) and why flex failed to compile (None if it did
    not), since the process began or the last reset."""
    out = {"setting": _setting, "ran": sorted(_ran), "flex_failed": _flex_failure}
    if reset:
        _ran.clear()
    return out
