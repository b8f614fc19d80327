"""The device to run on, and process-wide CPU settings that make training and decoding faster.

`resolve_device` turns the device setting into a torch.device for training and translation alike.
The CPU settings (docs/results/performance/perf_log.md):

- glibc's malloc serves every allocation above 32 MiB (and, by default, above a threshold that
  starts at 128 KiB) with a fresh mmap, and hands it back with munmap on free. Every new logits
  or FFN tensor then page-faults its memory in again, which costs more than a simple elementwise
  pass over it. With mmap off and trimming off, freed blocks stay in the heap and are reused, as
  PyTorch's CUDA caching allocator does on the GPU. The process keeps its peak heap (RSS does not
  shrink after a peak).
- Denormal floats are flushed to zero (`torch.set_flush_denormal`), which keeps arithmetic on
  tiny values (late-training Adam moments, rare-word gradients) at full speed.

Both are idempotent and change no result beyond values below 1e-38. The denormal flush holds in the thread
that set it and in the threads it creates afterwards (`tune_cpu` sets it in every thread that calls it).
They are the process owner's choice: relmt-translate and the training loop call `tune_cpu`; the
Translator API does not, so a program that embeds it opts in by calling `tune_cpu()` itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

import torch

from relmt.config import Precision
from relmt.errors import UserError

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h>
_applied: dict[str, bool] = {}


def tune_cpu() -> dict[str, bool]:
    """Apply the settings above (where the platform has them); returns what was applied. The denormal flush is a
    setting of the calling thread (its floating-point control register, which a new thread copies from its
    creator), so every call makes it in the thread that calls: a thread that existed before the first call
    calls tune_cpu itself."""
    if _applied:
        _applied["flush_denormal"] = torch.set_flush_denormal(True)
        return _applied
    heap = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            heap = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
        except (OSError, AttributeError):  # not glibc
            heap = False
    _applied.update(malloc_keeps_freed_memory=heap, flush_denormal=torch.set_flush_denormal(True))
    log.debug("CPU runtime settings: %s", _applied)
    return _applied


def warn_if_busy(device: torch.device, load: float | None = None) -> bool:
    """Warn when other processes already hold the cores that CPU training's threads would use: libgomp's
    threads spin while they wait for each other (unless OMP_WAIT_POLICY=PASSIVE), and against another job's
    threads a step ran 1.9-3.4x slower than with one thread (docs/results/performance/busy_cpu.md). `load`: the
    one-minute load average (default: the system's), read before this process starts working. Returns
    whether it warned."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads < 2 or os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive":
        return False
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # not on this platform
            return False
    cores = os.cpu_count() or threads
    if load + threads <= cores + 0.5:
        return False
    log.warning("the machine is busy (load average %.1f on %d cores) and training uses %d threads, which spin "
                "against the other processes: a step can take several times longer. With others on the machine, "
                "train.num_threads=1 (or OMP_WAIT_POLICY=PASSIVE in the environment) trains faster "
                "(docs/getting-started.md, A shared or busy machine)", load, cores, threads)
    return True


def autocast_dtype(precision: Precision, device: torch.device, setting: str = "precision") -> torch.dtype | None:
    """The autocast dtype at `precision` on `device`, for training and decoding alike; None means
    fp32. auto is bf16 on CUDA and fp32 elsewhere; bf16 is bf16 anywhere; fp16 needs CUDA and is
    refused elsewhere, naming `setting` (CPU autocast to fp16 is emulated: about 5x slower than fp32,
    for nothing gained)."""
    if precision == Precision.auto:
        return torch.bfloat16 if device.type == "cuda" else None
    if precision == Precision.fp16 and device.type != "cuda":
        raise UserError(f"{setting}=fp16 needs a CUDA device (the device is {device.type}): use fp32 or bf16")
    return {Precision.fp32: None, Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}[precision]


def resolve_device(name: str, local_rank: int = 0, key: str = "device") -> torch.device:
    """auto | cpu | cuda | cuda:N as a torch.device; `key` names the setting in errors. A CUDA device
    that is not there fails here, before any data is prepared, rather than deep inside `.to()`."""
    given = name
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None:  # checked outside the except block, so torch's long list is not appended
        raise UserError(f"{key}={given}: not a device; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        _check_cuda(device, f"{key}={given}")
    return device


def _check_cuda(device: torch.device, setting: str) -> None:
    if not torch.cuda.is_available():
        why = "this PyTorch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise UserError(f"{setting}: {why} (torch {torch.__version__}); use cpu or auto")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(f"{setting}: {device} is not there; this machine has {count} CUDA device(s), "
                        "numbered from 0")
