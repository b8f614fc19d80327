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


# Rows of logits held at once by the chunked output layer: a chunk of n target tokens holds n x V float32
# logits (and their gradient, in place), 2^23 elements = 32 MiB, whatever the batch. At a 32k vocabulary and 25k
# target tokens the whole logits are 3.2 GB in float32 (1.6 GB in bf16) and their gradient as much again.
CHUNK_ELEMENTS = 2 ** 23


def chunk_rows(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Target tokens per chunk for a vocabulary of `vocab`: `elements` logits, at least one row."""
    return max(1, elements // vocab)


class _ChunkedOutputNLL(torch.autograd.Function):
    """The tied output layer (Vaswani §3.4) and the label-smoothed NLL, `rows` target tokens at a time.

    Forward computes each chunk's logits h_c W^T, its share of both sums and, when gradients are wanted, its
    gradient d loss / d logits (the closed form of _LabelSmoothedNLL), which it turns at once into the chunk's
    rows of d loss / d h = g W and adds into d loss / d W += g^T h_c; then the chunk's logits are freed. So no
    (tokens x vocabulary) tensor outlives a chunk, forward or backward. Backward scales the two stored gradients
    by d(output) / d loss. The NLL is for perplexity only and has no gradient.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, rows: int,
                dtype: torch.dtype | None, grads: bool) -> tuple[Tensor, Tensor]:
        from relmt.model.linear import input_grad, product, weight_grad

        vocab, acc = weight.shape[0], torch.float64 if hidden.dtype == torch.float64 else torch.float32
        w = weight.to(dtype or weight.dtype)  # the product's operands in the autocast dtype (bf16 on a GPU)
        keep_all = target != PAD_ID
        nll, smooth = hidden.new_zeros((), dtype=acc), hidden.new_zeros((), dtype=acc)
        grad_h = torch.empty_like(hidden) if grads else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if grads else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], rows):
                h = hidden[start:start + rows].to(w.dtype)  # (n, d)
                t, keep = target[start:start + rows], keep_all[start:start + rows].to(acc)  # (n,)
                lprobs = torch.log_softmax(product(h, w).to(acc), dim=-1)  # (n, V)
                nll -= (lprobs.gather(-1, t[:, None])[:, 0] * keep).sum()
                smooth -= (lprobs.mean(dim=-1) * keep).sum()
                if grads:  # d loss / d logits = p - (1 - epsilon) onehot(t) - epsilon / V, on kept rows
                    g = lprobs.exp_().mul_(keep[:, None]).sub_((epsilon / vocab * keep)[:, None])
                    g.scatter_add_(-1, t[:, None], (-(1.0 - epsilon) * keep)[:, None])
                    g = g.to(w.dtype)
                    grad_h[start:start + rows] = input_grad(g, w)
                    grad_w += weight_grad(h, g)
                del lprobs
        loss = (1.0 - epsilon) * nll + epsilon * smooth
        if grads:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None, None, None


def output_nll(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, rows: int = 0,
               dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """label_smoothed_nll(hidden W^T, target, epsilon) without the whole logits: the output layer and the loss
    `rows` target tokens at a time (0: chunk_rows(V)), gradients included (_ChunkedOutputNLL).

    hidden: (..., d_model), the decoder's normalised states; weight: (V, d_model), the tied embedding; target:
    (...). `dtype`: the products' dtype under mixed precision (the autocast dtype; None: the operands' own); the
    sums are float32 at least, as label_smoothed_nll's. Returns (loss, nll), the nll without a gradient.
    """
    d = hidden.shape[-1]
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ChunkedOutputNLL.apply(hidden.reshape(-1, d), weight, target.reshape(-1), epsilon,
                                   rows or chunk_rows(weight.shape[0]), dtype, grads)
