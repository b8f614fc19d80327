"""Process-wide CPU settings that make training and decoding faster (docs/results/perf_log.md).

- glibc's malloc serves every allocation above 32 MiB (and, by default, above a threshold that
  starts at 128 KiB) with a fresh mmap, and hands it back with munmap on free. Every new logits
  or FFN tensor then page-faults its memory in again, which costs more than a simple elementwise
  pass over it. With mmap off and trimming off, freed blocks stay in the heap and are reused, as
  PyTorch's CUDA caching allocator does on the GPU. The process keeps its peak heap (RSS does not
  shrink after a peak).
- Denormal floats are flushed to zero (`torch.set_flush_denormal`), which keeps arithmetic on
  tiny values (late-training Adam moments, rare-word gradients) at full speed.

Both are idempotent and change no result beyond values below 1e-38.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import torch

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h>
_applied: dict[str, bool] = {}


def tune_cpu() -> dict[str, bool]:
    """Apply the settings above (where the platform has them); returns what was applied."""
    if _applied:
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
