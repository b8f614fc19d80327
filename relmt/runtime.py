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
import time
from pathlib import Path

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


def busy_cores(window: float = 0.25) -> float | None:
    """How many cores other processes keep busy now: the machine's busy time over `window` seconds (from
    /proc/stat, while this process sleeps), in cores; None where /proc/stat is not there."""
    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]  # all but guest time; idle + iowait

    try:
        total0, idle0 = read()
        time.sleep(window)
        total1, idle1 = read()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def choose_threads(threads: int, device: torch.device, what: str = "training") -> int:
    """Set torch's intra-op threads for a command (issue 74 §2: relmt-train's, relmt-translate's and relmt-serve's
    `threads`) and return them. threads > 0 is taken as given; 0 (the default) takes the cores that other
    processes leave free at start (`busy_cores`), at most torch's default (the physical cores) and at least one:
    with the threads of another job on the cores, libgomp's spinning threads ran a step 1.5-5x slower than one
    thread did (docs/results/performance/busy_cpu.md, threads_busy.md). OMP_NUM_THREADS in the environment is
    the user's choice and is kept. On a GPU the CPU threads are torch's default. Then warns as `warn_if_busy`."""
    if threads > 0:
        torch.set_num_threads(threads)
    elif device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        default = torch.get_num_threads()
        busy = busy_cores()
        if busy is not None:
            free = (os.cpu_count() or default) - int(busy + 0.5)
            torch.set_num_threads(max(1, min(default, free)))
            log.info("threads=0: %.1f of %d cores busy at start: %s with %d threads", busy, os.cpu_count() or 0,
                     what, torch.get_num_threads())
    warn_if_busy(device, what=what)
    return torch.get_num_threads()


def warn_if_busy(device: torch.device, load: float | None = None, what: str = "training") -> bool:
    """Warn when other processes already hold the cores that CPU training's or decoding's threads would use:
    libgomp's threads spin while they wait for each other (unless OMP_WAIT_POLICY=PASSIVE), and against another
    job's threads a step ran 1.9-3.4x slower than with one thread (docs/results/performance/busy_cpu.md). `load`:
    the one-minute load average (default: the system's), read before this process starts working. Returns
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
    log.warning("the machine is busy (load average %.1f on %d cores) and %s uses %d threads, which spin "
                "against the other processes: a step can take several times longer. With others on the machine, "
                "threads=1, or threads=0 (the cores free at start), or OMP_WAIT_POLICY=PASSIVE in the environment "
                "runs faster (docs/getting-started.md, A shared or busy machine)", load, cores, what, threads)
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
