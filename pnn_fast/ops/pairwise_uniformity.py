"""pnn_fast::pairwise_uniformity_fwd / _bwd: L_uniform, the log mean Gaussian potential over
pairs of rows, without an [n, n] buffer unless it is small."""
from __future__ import annotations

from typing import Optional

import torch

from .. import _extension
from ._common import OPS, opmath_dtype

#: exponentials the CPU forward keeps for the backward at most (32 MiB in float32): all pairs of up
#: to 4,096 rows, about the distinct items of an in-batch PNN step at B = 8192
SAVED_PAIRS_BUDGET = 1 << 23


def pairwise_uniformity(x: torch.Tensor, t: float, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``log( mean_{i != j} exp(-t ||x_i - x_j||^2) )`` over ordered pairs of rows; 0 when n < 2.

    Args:
        x: float [n, d]; t: the temperature.
        keep: bool [n] or None: the same over the kept rows only (``x[keep]``), in fixed shapes, so
            that a step's distinct items need no count read on the host; the other rows get no gradient.
    Returns:
        0-dim tensor of x's dtype, differentiable w.r.t. ``x``.  A log-sum-exp, so any scale of
        ``x`` is safe.  The forward uses O(n d) memory; on the CPU, when x requires grad and its
        n (n - 1) / 2 pairs fit in :data:`SAVED_PAIRS_BUDGET`, it keeps their exponentials for the
        backward, which otherwise computes them again (the same bits either way).
    """
    _extension.require_kernels(x.device)
    return OPS.pairwise_uniformity_fwd.default(x, float(t), saves_pairs(x), keep)[0]


def saves_pairs(x: torch.Tensor) -> bool:
    """Whether the forward keeps the pairs' exponentials: on the CPU, for a backward, within the budget."""
    n = x.shape[0]
    return (x.device.type == "cpu" and x.requires_grad and torch.is_grad_enabled()
            and n * (n - 1) // 2 <= SAVED_PAIRS_BUDGET)


# The forward also returns the float64 log-sum-exp over all ordered pairs, ``total``, which the
# backward needs unrounded (the loss itself is rounded to x's dtype), and the saved exponentials.
@torch.library.register_fake("pnn_fast::pairwise_uniformity_fwd")
def _(x, t, save, keep=None):
    n = x.shape[0]
    acc = opmath_dtype(x.dtype)
    return (x.new_empty(()), x.new_empty((), dtype=torch.float64), x.new_empty(n if save else 0, dtype=acc),
            x.new_empty(n * (n - 1) // 2 if save else 0, dtype=acc))


@torch.library.register_fake("pnn_fast::pairwise_uniformity_bwd")
def _(grad, x, t, total, saved_row_max, saved_exps, keep=None):
    return x.new_empty(x.shape)


def _uniformity_setup_context(ctx, inputs, output):
    ctx.t = inputs[1]
    _, total, saved_row_max, saved_exps = output
    ctx.mark_non_differentiable(total, saved_row_max, saved_exps)
    # otherwise autograd hands the backward a zero tensor for each of those outputs: a fill of the
    # whole saved triangle (4.9 MB at ML-1M's in-batch step) on every step
    ctx.set_materialize_grads(False)
    keep = inputs[3] if len(inputs) > 3 else None
    ctx.save_for_backward(inputs[0], total, saved_row_max, saved_exps, *([] if keep is None else [keep]))


def _uniformity_backward(ctx, grad, *_):
    if grad is None:  # only the non-differentiable outputs were used
        return None, None, None, None
    x, total, saved_row_max, saved_exps, *keep = ctx.saved_tensors
    return (OPS.pairwise_uniformity_bwd.default(grad, x, ctx.t, total, saved_row_max, saved_exps, *keep),
            None, None, None)


torch.library.register_autograd("pnn_fast::pairwise_uniformity_fwd", _uniformity_backward,
                                setup_context=_uniformity_setup_context)
