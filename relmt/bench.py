"""Helpers shared by the benchmark scripts in scripts/: hardware facts, timing, peak memory,
markdown tables and JSON output. Benchmarks are scripts that print and write; never timed tests."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from tabulate import tabulate
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from relmt.host import host


def hardware(device: torch.device | None = None) -> dict:
    """What a reported figure was measured on (relmt.host), with torch's threads and the GPU."""
    info = {**host(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def command_line() -> str:
    return " ".join(["python", *sys.argv])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, warmup: int = 2,
                     repeats: int = 5, min_seconds: float = 0.0) -> dict[str, float]:
    """Median wall time in seconds of each fn(), timed round-robin so that drift in the machine's
    speed (other load, frequency) falls on every variant alike. `min_seconds` per variant."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while (min(len(t) for t in times.values()) < repeats
           or time.perf_counter() - start < min_seconds * len(fns)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def best_per_call(fns: dict[str, Callable[[], object]], repeats: int, calls: int = 1, warmup: int = 1,
                  device: torch.device | None = None) -> dict[str, float]:
    """Seconds per call of each fn(): the best of `repeats` rounds of `calls` calls each, the fns interleaved round by
    round (as time_interleaved, for the fastest a fn can go rather than its median), after `warmup` calls each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            if device is not None:
                sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if device is not None:
                sync(device)
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


class PeakMemory(TorchDispatchMode):
    """Peak bytes of tensor storage alive at once while the mode is active, on any device.

    Every storage an op creates is counted when it appears and uncounted when it is freed (a
    weakref finalizer), so this is exact for tensors allocated inside the block; memory alive
    before the block is not counted. Used on CPU, where PyTorch keeps no allocator statistics.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._seen:
                    nbytes = storage.nbytes()
                    self._seen[key] = nbytes
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, nbytes)
        return out


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory allocated by one call of fn()."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with PeakMemory() as tracker:
        fn()
    return tracker.peak


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """rows of dicts -> a markdown table; columns are (key, header) pairs; floats get 3 digits."""
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)

    # numbers are formatted above; tabulate must not parse them again ("1,234" is text to it)
    return tabulate([[fmt(r.get(k)) for k, _ in columns] for r in rows], headers=[h for _, h in columns],
                    tablefmt="github", disable_numparse=True)


def provenance(hw: dict) -> str:
    """A results page's closing lines: the command that wrote it, the machine and the date (`hw`: hardware())."""
    return (f"- Command: `{command_line()}`\n"
            f"- Hardware: {hw.get('cpu')}, {hw.get('cpu_count')} cores; {hw.get('date')}\n")


def page_head(title: str, hw: dict, command: str | None = None) -> str:
    """A results page's title and its first lines: the command that wrote it, the machine and the date (`hw`:
    hardware())."""
    return (f"# {title}\n\n- command: `{command or command_line()}`\n- hardware: {hw.get('cpu')}, "
            f"{hw.get('cpu_count')} cores, torch {hw.get('torch')}, git {hw.get('git')}\n- date: {hw.get('date')}\n")


def write_json(path: str | Path, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def flop_counter() -> torch.utils.flop_counter.FlopCounterMode:
    """torch's FlopCounterMode, able to count `bmm(..., out_dtype=float32)` (relmt/model/labels.py's float32 sums of
    half-precision rows on CUDA): torch's formula for bmm takes the overload's dtype for a shape and raises."""
    from torch.utils.flop_counter import FlopCounterMode, bmm_flop

    def bmm(a_shape, b_shape, *dtype, out_shape=None, **kwargs) -> int:
        return bmm_flop(a_shape, b_shape)

    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.bmm: bmm})
