"""Data-parallel plumbing for torchrun: DDP on nccl (GPU) or gloo (CPU). A single process is
world_size 1 and every helper here is then a no-op."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from relmt.runtime import resolve_device


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str, timeout_minutes: float = 60.0) -> Dist:
    """Join the process group that torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK.

    Rank 0 alone builds a missing data cache, validates and decodes the test sets while the other
    ranks wait in a collective; `timeout_minutes` (train.dist_timeout_minutes) bounds that wait.
    NCCL's own default, 10 minutes, is shorter than a WMT cache build or a long validation."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = resolve_device(device, int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_minutes))
    return Dist(rank, world, dev)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    """Sum a few numbers over ranks (float64, so token counts stay exact)."""
    if d.world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum_tensor(sums: torch.Tensor, d: Dist, same: torch.Tensor) -> list[float]:
    """A rank's sums (a device tensor) summed over ranks, then a value every rank holds alike (`same`, 0-d) after
    them, as floats: one read of the device (and one all_reduce with several ranks)."""
    if d.world_size > 1:
        sums = sums.double()
        dist.all_reduce(sums)
    return torch.cat((sums.double(), same.detach().double().reshape(1))).tolist()


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank if it is True on any (so that all ranks stop at the same step)."""
    if d.world_size == 1:
        return flag
    t = torch.tensor([float(flag)], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(obj: object, d: Dist) -> list[object]:
    """Every rank's `obj`, on every rank."""
    if d.world_size == 1:
        return [obj]
    out: list[object] = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out
