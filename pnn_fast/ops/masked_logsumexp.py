"""pnn_fast::masked_logsumexp_fwd / _bwd: each row's log-sum-exp of ``scale * x - shift`` over the
entries it does not exclude, in one pass forward and one backward (the denominators of the sampled
softmax losses: each row's own negatives, or one pool shared by the batch with each row's known
items excluded, with or without the logQ correction)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import _extension
from ._common import OPS


def masked_logsumexp(x: torch.Tensor, scale: float = 1.0, shift: Optional[torch.Tensor] = None,
                     excluded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``log sum_j exp(scale * x[b, j] - shift[j])`` over the j where ``excluded[b, j]`` is False.

    Args:
        x: float [B, M]; scale: a finite float (a softmax's 1 / temperature);
        shift: [M] of x's dtype, or None (0): a constant per column, such as the log of each draw's
            expected count (logQ); it gets no gradient, so one that requires grad is refused;
        excluded: bool [B, M], or None (nothing excluded).
    Returns:
        [B] in x's dtype, differentiable w.r.t. ``x``: -inf for a row with nothing left (whose
        gradient is 0), NaN for a row whose entries hold a NaN.
    """
    _extension.require_kernels(x.device)
    if shift is not None and shift.requires_grad:
        raise ValueError("masked_logsumexp: shift gets no gradient; pass shift.detach() (a constant such as logQ)")
    # the op's [B] is in the accumulation dtype (float32 for half and bfloat16), which its backward reads
    return OPS.masked_logsumexp_fwd.default(x, float(scale), shift, excluded).to(x.dtype)


@torch.library.register_fake("pnn_fast::masked_logsumexp_fwd")
def _(x, scale, shift=None, excluded=None):
    return x.new_empty(x.shape[:1], dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)


@torch.library.register_fake("pnn_fast::masked_logsumexp_bwd")
def _(grad, x, scale, shift, excluded, lse):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, scale, shift, excluded = inputs
    ctx.scale = scale
    ctx.save_for_backward(x, shift, excluded, output)


def _backward(ctx, grad):
    x, shift, excluded, lse = ctx.saved_tensors
    return OPS.masked_logsumexp_bwd.default(grad, x, ctx.scale, shift, excluded, lse), None, None, None


torch.library.register_autograd("pnn_fast::masked_logsumexp_fwd", _backward, setup_context=_setup_context)
