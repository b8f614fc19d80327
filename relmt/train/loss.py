"""Label-smoothed cross-entropy over the non-padding target tokens (Szegedy et al. 2016;
Vaswani §5.4, epsilon_ls = 0.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from relmt.data.tokenizer import PAD_ID


class _LabelSmoothedNLL(torch.autograd.Function):
    """Both sums from one log-softmax, with the gradient written out.

    Autograd through log_softmax, gather and mean would fill a zero (N, V) tensor for the gather,
    broadcast the mean's gradient and run log_softmax's backward: more passes over the
    (tokens x vocabulary) logits than this closed form (docs/results/performance/perf_log.md). For one row with
    p = softmax(x) and gold token t:
        d loss / dx = p - (1 - epsilon) onehot(t) - epsilon / V,    d nll / dx = p - onehot(t).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        x = logits if logits.dtype == torch.float64 else logits.float()
        lprobs = torch.log_softmax(x, dim=-1)  # (N, V)
        keep = (target != PAD_ID).to(x.dtype)  # (N,)
        nll = -(lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * keep).sum()
        smooth = -(lprobs.mean(dim=-1) * keep).sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.in_dtype = epsilon, logits.dtype
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.shape[-1]
        grad = lprobs.exp()  # p
        grad.mul_(((grad_loss + grad_nll) * keep).unsqueeze(-1))
        grad.sub_((eps / vocab * grad_loss * keep).unsqueeze(-1))
        gold = -((1.0 - eps) * grad_loss + grad_nll) * keep
        grad.scatter_add_(-1, target.unsqueeze(-1), gold.unsqueeze(-1))
        return grad.to(ctx.in_dtype), None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed losses over the tokens where target != PAD.

    logits: (..., V), target: (...). The smoothed target puts 1 - epsilon on the gold token and
    epsilon spread evenly over the whole vocabulary (the same as
    `F.cross_entropy(label_smoothing=epsilon)`), so
        loss = (1 - epsilon) * (-log p_gold) + epsilon * mean_v(-log p_v).
    Returns (loss, nll): the smoothed loss to optimise and the plain NLL for perplexity, computed in
    float32 at least.
    """
    vocab = logits.shape[-1]
    return _LabelSmoothedNLL.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon)
