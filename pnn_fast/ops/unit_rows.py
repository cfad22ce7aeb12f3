"""pnn_fast::unit_rows_fwd / _bwd: every row of a table scaled to unit length, F.normalize(x, dim=-1)
in one pass forward and one backward (the user rows of the cosine losses; SimpleX's item table)."""
from __future__ import annotations

import torch

from .. import _extension
from ._common import OPS


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """``x / max(||x||, 1e-12)`` row by row: ``F.normalize(x, dim=-1)`` to rounding.

    Args: x: float [n, d].
    Returns: [n, d] in x's dtype, differentiable w.r.t. ``x`` (F.normalize's gradient, also below eps).
    """
    _extension.require_kernels(x.device)
    return OPS.unit_rows_fwd.default(x)


@torch.library.register_fake("pnn_fast::unit_rows_fwd")
def _(x):
    return x.new_empty(x.shape)


@torch.library.register_fake("pnn_fast::unit_rows_bwd")
def _(grad, x):
    return x.new_empty(x.shape)


def _unit_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _unit_backward(ctx, grad):
    return OPS.unit_rows_bwd.default(grad, *ctx.saved_tensors)


torch.library.register_autograd("pnn_fast::unit_rows_fwd", _unit_backward, setup_context=_unit_setup_context)
