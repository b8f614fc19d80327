"""The CPU dropout: rate per lane, exact expectation, gradient = mask x scale, reproducible masks."""

from __future__ import annotations

import pytest
import torch

from relmt.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_every_lane_drops_at_rate_p(p):
    torch.manual_seed(0)
    n = 400_000
    keep, p_used = keep_mask(torch.Size([n]), p)
    assert abs(p_used - p) <= 2 ** -17
    # elements 0, 1, 2, 3 (mod 4) come from different 16-bit lanes of the 64-bit draws, the most
    # significant lane included: each must drop at rate p on its own (4 sigma bounds)
    sigma = (p * (1 - p) / (n / 4)) ** 0.5
    for lane in range(4):
        assert abs(1 - keep[lane::4].float().mean().item() - p) < 4 * sigma
    # and neighbouring decisions are independent: P(both dropped) = p^2
    both = (~keep[0::2] & ~keep[1::2]).float().mean().item()
    assert abs(both - p * p) < 4 * (p * p * (1 - p * p) / (n / 2)) ** 0.5


def test_kept_elements_are_scaled_so_the_expectation_is_exact():
    torch.manual_seed(1)
    x = torch.ones(1000, 1000)
    y = dropout(x, 0.25)
    kept = y != 0
    _, p_used = keep_mask(torch.Size([1]), 0.25)
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p_used)))
    assert abs(y.mean().item() - 1.0) < 4 * (0.25 / 0.75 / x.numel()) ** 0.5


def test_gradient_is_the_same_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(7, 33, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.4)
    g = torch.randn_like(y)
    (grad,) = torch.autograd.grad(y, x, g)
    kept = y != 0
    scale = (y[kept] / x[kept]).detach()
    torch.testing.assert_close(scale, torch.full_like(scale, scale[0].item()))
    torch.testing.assert_close(grad, torch.where(kept, g * scale[0], 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_output_and_gradient_equal_the_masked_product_bit_for_bit(dtype):
    """The float mask gives exactly where(keep, x * scale, 0), with x * scale rounded once as a
    multiplication by the scale rounds it, and the same for the gradient; the output keeps x's dtype."""
    x = torch.randn(64, 129, dtype=dtype, requires_grad=True)
    g = torch.randn(64, 129, dtype=dtype)
    torch.manual_seed(4)
    keep, p_used = keep_mask(x.shape, 0.3)
    torch.manual_seed(4)
    y = dropout(x, 0.3)
    (grad,) = torch.autograd.grad(y, x, g)
    assert y.dtype == grad.dtype == dtype
    scale = 1 / (1 - p_used)
    assert torch.equal(y, torch.where(keep, x.detach() * scale, 0.0))
    assert torch.equal(grad, torch.where(keep, g * scale, 0.0))


def test_same_seed_same_masks_and_eval_is_identity():
    x = torch.randn(5, 11)
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    torch.manual_seed(3)
    b = dropout(x, 0.5)
    assert torch.equal(a, b)
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
