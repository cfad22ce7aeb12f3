"""pnn_fast::gathered_norm_fwd / _bwd: the Frobenius norm of gathered table rows (RecBole's EmbLoss term).

Its autograd is in C++ (csrc/autograd.cpp), as for embedding_bpr."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ._common import OPS


def gathered_norm(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``||table[ids]||_F``: the Frobenius norm of the gathered rows (RecBole's EmbLoss term).

    Args: table: float [n, d]; ids: int [m].
    Returns: 0-dim tensor of table's dtype, differentiable w.r.t. ``table`` (gradient 0 at the origin).
    """
    _extension.require_kernels(table.device)
    check_same("table", table, [("ids", ids)], dtype=False)
    return OPS.gathered_norm_fwd.default(table, ids.long().reshape(-1))


@torch.library.register_fake("pnn_fast::gathered_norm_fwd")
def _(table, ids):
    return table.new_empty(())


@torch.library.register_fake("pnn_fast::gathered_norm_bwd")
def _(grad, table, ids, output):
    return table.new_empty(table.shape)
