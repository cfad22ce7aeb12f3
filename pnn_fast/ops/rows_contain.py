"""pnn_fast::rows_contain: whether each of a row's columns is in that row of a CSR (the evaluator's
relevance of the ranked items, one binary search in the row per column)."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ..csr import CSR
from ._common import OPS


def rows_contain(csr: CSR, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``columns[b, k] in csr's row rows[b]``, for every ``b`` and ``k``.

    Args:
        csr: a :class:`~pnn_fast.csr.CSR` whose rows are sorted ascending (as CSR keeps them).
        rows: int [B], each in ``[0, csr.num_rows)``.
        columns: int [B, K]; any values (a column outside ``[0, csr.num_cols)`` is in no row).
    Returns:
        bool [B, K]; not differentiable.
    """
    _extension.require_kernels(columns.device)
    check_same("columns", columns, [("rows", rows), ("csr", csr.indptr)], dtype=False)
    return OPS.rows_contain.default(csr.indptr, csr.indices, rows.long(), columns.long())


@torch.library.register_fake("pnn_fast::rows_contain")
def _(indptr, indices, rows, columns):
    return columns.new_empty(columns.shape, dtype=torch.bool)
