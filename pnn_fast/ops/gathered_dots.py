"""pnn_fast::gathered_dots_fwd / _bwd: inner products of rows with gathered table rows, or with the
gathered rows scaled to unit length, without the [B, K, d] gather."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ._common import OPS, opmath_dtype


def gathered_dots(rows: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, unit_table: bool = False) -> torch.Tensor:
    """``out[b, k] = <rows[b], table[ids[b, k]]>`` without a [B, K, d] copy of the gathered rows.

    With ``unit_table`` each gathered row is first scaled to unit length, ``F.normalize(v, dim=-1)``
    (eps 1e-12), inside the product: with unit ``rows`` these are cosines, and the table is never
    normalised as a whole (a table-sized pass forward and another backward).

    Args: rows: float [B, d]; table: float [n, d], same dtype; ids: int [B, K].
    Returns: [B, K] in rows' dtype, differentiable w.r.t. ``rows`` and ``table`` (dense [n, d] gradient).
    """
    _extension.require_kernels(rows.device)
    check_same("rows", rows, [("table", table)], dtype=True)
    check_same("rows", rows, [("ids", ids)], dtype=False)
    return OPS.gathered_dots_fwd.default(rows, table, ids.long(), bool(unit_table))[0]


@torch.library.register_fake("pnn_fast::gathered_dots_fwd")
def _(rows, table, ids, unit_table):
    norms = (rows.shape[0], ids.shape[1]) if unit_table else (0,)
    return rows.new_empty(rows.shape[0], ids.shape[1]), rows.new_empty(norms, dtype=opmath_dtype(rows.dtype))


@torch.library.register_fake("pnn_fast::gathered_dots_bwd")
def _(grad, rows, table, ids, output, squared_norms, unit_table):
    return rows.new_empty(rows.shape), table.new_empty(table.shape)


def _dots_setup_context(ctx, inputs, output):
    # the backward of the unit rows reads the forward's output and each row's squared norm
    ctx.save_for_backward(*inputs[:3], *output)
    ctx.mark_non_differentiable(output[1])
    ctx.unit_table = inputs[3]


def _dots_backward(ctx, grad, _grad_squared_norms):
    grad_rows, grad_table = OPS.gathered_dots_bwd.default(grad, *ctx.saved_tensors, ctx.unit_table)
    return (grad_rows if ctx.needs_input_grad[0] else None, grad_table if ctx.needs_input_grad[1] else None, None, None)


torch.library.register_autograd("pnn_fast::gathered_dots_fwd", _dots_backward, setup_context=_dots_setup_context)
