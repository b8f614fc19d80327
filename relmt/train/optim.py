"""Adam and the learning-rate schedules, each a pure function of the step (Vaswani §5.3)."""

from __future__ import annotations

import fnmatch
import logging

import torch
from torch import nn

from relmt.config import LrSchedule, TrainConfig
from relmt.errors import UserError

log = logging.getLogger(__name__)


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani §5.3: lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for `warmup` steps, then decays with the inverse square root of the step.
    Steps count from 1; tensor2tensor's `learning_rate_constant` is `scale`.
    """
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """fairseq's inverse_sqrt: linear warm-up to `peak` at `warmup`, then peak * sqrt(warmup / step)."""
    step = max(step, 1)
    return peak * min(step / warmup, (warmup / step) ** 0.5)


def learning_rate(cfg: TrainConfig, d_model: int, step: int) -> float:
    """The learning rate for update number `step` (1-based). Each schedule reads only its own
    field: noam `cfg.noam_scale`, inverse_sqrt `cfg.peak_lr`."""
    if cfg.lr_schedule == LrSchedule.noam:
        return noam_lr(step, d_model, cfg.warmup_steps, cfg.noam_scale)
    return inverse_sqrt_lr(step, cfg.peak_lr, cfg.warmup_steps)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Adam:
    """Adam(0.9, 0.98, 1e-9) as in Vaswani §5.3 and Shaw §4.1; its lr is set every step. Parameters
    matching `cfg.freeze` get no gradient and stay at their initial values.

    On CUDA it is torch's fused Adam: one kernel per step over every parameter, instead of torch's
    default there (several multi-tensor kernels). On the CPU it stays torch's default, the form
    scripts/peers/bench_peers.sh's training rows were measured with. The state and the update are Adam's
    either way, so a checkpoint resumes on either device."""
    params = trainable(model, cfg.freeze)
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.Adam(params, lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay, fused=fused or None)


def trainable(model: nn.Module, freeze: list[str]) -> list[nn.Parameter]:
    """The parameters not matched by any fnmatch pattern of `freeze`; the matched ones stop needing
    gradients. A pattern that matches nothing is an error naming it (a typo would freeze nothing)."""
    names = [n for n, _ in model.named_parameters()]
    for pattern in freeze:
        if not fnmatch.filter(names, pattern):
            raise UserError(f"train.freeze: '{pattern}' matches no parameter (names look like {names[-1]})")
    kept = []
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in freeze):
            param.requires_grad_(False)
            log.info("frozen at its initial value (train.init_from's, if set): %s %s", name, tuple(param.shape))
        else:
            kept.append(param)
    return kept
