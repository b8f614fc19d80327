"""One update of training: forward and backward over its micro-batches, the gradients divided by
the update's target tokens, one Adam step, and the skipping of updates whose loss or gradient is
NaN/inf (as fairseq does). The precision a run trains in is relmt.runtime.autocast_dtype's."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from relmt.config import TrainConfig
from relmt.data.batching import Batch
from relmt.errors import UserError
from relmt.train import distributed
from relmt.train.loss import label_smoothed_nll, output_nll

log = logging.getLogger(__name__)

# fp16: below this loss scale, gradient overflows count as a diverged run (fairseq's min_loss_scale)
MIN_LOSS_SCALE = 1e-4


def compile_for_training(net: torch.nn.Module, backend: str | Callable = "inductor") -> torch.nn.Module:
    """train.compile: `net` (the model or its DDP wrapper) under torch.compile. Its forward is one
    graph, and AOTAutograd compiles the backward from it; the loss, the gradient scaling and Adam stay
    eager (Adam is a fused kernel per step on CUDA: relmt/train/optim.py).

    Sizes are symbolic (dynamic=True): token batches of sorted lengths make nearly every batch a new
    (B, S, T), and one compile per shape (tens of seconds for a base model) would never end. One graph
    serves them all; dynamo still specialises a size of 1 (a batch of one sentence) and a new attention
    route where the model picks one by length, so the number of graphs stays a small constant
    (tests/test_compiled_training.py counts them over many batch shapes, train.pad_to_multiple on and off).
    `backend` is torch.compile's (the tests count graphs with a counting one).
    """
    return torch.compile(net, dynamic=True, backend=backend)


def train_step(model: torch.nn.Module, net: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, batches: list[Batch], lr: float, label_smoothing: float,
               amp: torch.dtype | None, dist: distributed.Dist, ddp: DistributedDataParallel | None = None,
               clip_norm: float = 0.0, chunked_loss: bool = False) -> tuple[float, float, float, float, float]:
    """One update: forward and backward over `batches` (micro-batches on the device), then one
    optimizer step at learning rate `lr`, unless the summed loss or the gradient norm is NaN/inf
    (then no step).

    `net` is what runs the forward (model, its DDP wrapper, or a compiled one); `model` owns the
    parameters. Returns (smoothed loss, nll, target tokens, source tokens) summed over ranks, and
    the gradient norm before clipping (NaN when the loss was not finite, so it was not computed).
    `chunked_loss`: the output layer and the loss a few target tokens at a time (relmt/train/loss.py's
    output_nll), without the whole logits; else the model's logits and label_smoothed_nll.
    """
    for g in optimizer.param_groups:
        g["lr"] = lr
    # the host reads the device once an update (each read stalls a GPU): the losses summed on the device and the
    # gradient norm together at the end; the token counts were taken on the host (Batch.to)
    losses, n_tgt, n_src = [], 0, 0
    for j, batch in enumerate(batches):
        with ddp.no_sync() if ddp is not None and j < len(batches) - 1 else nullcontext():
            with torch.autocast(dist.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                out = net(batch.src, batch.tgt_in, project=not chunked_loss)  # states or logits
            if chunked_loss:
                loss, nll = output_nll(out, model.tgt_embed.weight, batch.tgt_out, label_smoothing, dtype=amp)
            else:
                loss, nll = label_smoothed_nll(out, batch.tgt_out, label_smoothing)
            scaler.scale(loss).backward()
        losses.append(torch.stack((loss.detach(), nll.detach())).float())
        n_tgt, n_src = n_tgt + batch.n_tgt_tokens, n_src + batch.n_src_tokens
    totals = torch.stack(losses).sum(0)  # (loss, nll) of this rank, on the device
    n_tgt, n_src = distributed.all_reduce_sum([n_tgt, n_src], dist)
    # DDP averaged the gradients over ranks; make them d(sum of losses) / (target tokens).
    params = [p for p in model.parameters() if p.grad is not None]
    scaler.unscale_(optimizer)
    torch._foreach_mul_([p.grad for p in params], dist.world_size / n_tgt)
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf)
    loss_sum, nll_sum, grad_norm = distributed.all_reduce_sum_tensor(totals, dist, norm)  # the update's one read
    if math.isfinite(loss_sum):
        # An inf/NaN gradient with a finite loss would make every weight NaN after one Adam step:
        # skip the step, as fairseq does. Every rank holds the same reduced gradients, so all skip.
        if math.isfinite(grad_norm):
            scaler.step(optimizer)
    else:
        grad_norm = math.nan  # not a gradient worth reporting
    scaler.update()  # with fp16, lowers the loss scale after the inf that unscale_ found
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, nll_sum, n_tgt, n_src, grad_norm


def count_skipped(loss: float, grad_norm: float, fp16_scale: float | None, bad_in_row: int, step: int,
                  lr: float, tcfg: TrainConfig, last: Path) -> tuple[int, bool]:
    """After update `step` (whose loss and gradient norm train_step returned): the count of bad
    updates in a row, and whether this one was skipped. A NaN/inf update was skipped; the
    train.max_bad_steps-th in a row raises. `fp16_scale` is GradScaler's scale after the update
    (None without fp16)."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return 0, False
    if fp16_scale is not None and math.isfinite(loss) and fp16_scale >= MIN_LOSS_SCALE:
        # fp16: an overflowing gradient is GradScaler's cue to halve the loss scale and go on;
        # only a collapsed scale means the run diverged (fairseq's min_loss_scale)
        log.info("step %d: fp16 gradient overflow; update skipped, loss scale now %g", step, fp16_scale)
        return bad_in_row, True
    bad_in_row += 1
    what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {grad_norm} (loss {loss:.4g})"
    log.warning("step %d: %s; update skipped (%d in a row)", step, what, bad_in_row)
    if bad_in_row >= tcfg.max_bad_steps:
        raise UserError(
            f"the loss or gradient was NaN/inf for {bad_in_row} updates in a row (step {step}, lr {lr:.3g}, "
            f"precision {tcfg.precision.value}): lower {tcfg.lr_key}, set train.clip_norm, or use "
            f"train.precision=fp32; the last checkpoint is {last}")
    return bad_in_row, True
