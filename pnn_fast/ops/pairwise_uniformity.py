"""pnn_fast::pairwise_uniformity_fwd / _bwd: L_uniform, the log mean Gaussian potential over
pairs of rows, in O(n d) memory."""
from __future__ import annotations

import torch

from .. import _extension
from ._common import OPS


def pairwise_uniformity(x: torch.Tensor, t: float) -> torch.Tensor:
    """``log( mean_{i != j} exp(-t ||x_i - x_j||^2) )`` over ordered pairs of rows; 0 when n < 2.

    Args:
        x: float [n, d]; t: the temperature.
    Returns:
        0-dim tensor of x's dtype, differentiable w.r.t. ``x``.  Forward and backward use O(n d)
        memory and a log-sum-exp, so any scale of ``x`` is safe.
    """
    _extension.require_kernels(x.device)
    value, _ = OPS.pairwise_uniformity_fwd.default(x, float(t))
    return value


# The forward also returns the float64 log-sum-exp over all ordered pairs, ``total``, which the
# backward needs unrounded (the loss itself is rounded to x's dtype).
@torch.library.register_fake("pnn_fast::pairwise_uniformity_fwd")
def _(x, t):
    return x.new_empty(()), x.new_empty((), dtype=torch.float64)


@torch.library.register_fake("pnn_fast::pairwise_uniformity_bwd")
def _(grad, x, t, total):
    return x.new_empty(x.shape)


def _uniformity_setup_context(ctx, inputs, output):
    ctx.t = inputs[1]
    _, total = output
    ctx.mark_non_differentiable(total)
    ctx.save_for_backward(inputs[0], total)


def _uniformity_backward(ctx, grad, _grad_total):
    x, total = ctx.saved_tensors
    return OPS.pairwise_uniformity_bwd.default(grad, x, ctx.t, total), None


torch.library.register_autograd("pnn_fast::pairwise_uniformity_fwd", _uniformity_backward,
                                setup_context=_uniformity_setup_context)
