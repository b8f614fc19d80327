"""Label-smoothed cross-entropy over the non-padding target tokens (Szegedy et al. 2016;
Vaswani §5.4, epsilon_ls = 0.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from relmt.data.tokenizer import PAD_ID


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed losses over the tokens where target != PAD.

    logits: (B, T, V), target: (B, T). The smoothed target puts 1 - epsilon on the gold token and
    epsilon spread evenly over the whole vocabulary (the same as
    `F.cross_entropy(label_smoothing=epsilon)`), so
        loss = (1 - epsilon) * (-log p_gold) + epsilon * mean_v(-log p_v).
    Returns (loss, nll): the smoothed loss to optimise and the plain NLL for perplexity, from one
    log-softmax.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    mask = target != PAD_ID
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum()
    smooth = -lprobs.mean(dim=-1)[mask].sum()
    return (1.0 - epsilon) * nll + epsilon * smooth, nll
