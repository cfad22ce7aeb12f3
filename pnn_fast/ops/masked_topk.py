"""pnn_fast::masked_topk: each score row's k best columns, some columns excluded per user (the
evaluator's full ranking, without a sort of the row or a masked copy of it)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _extension
from .._checks import check_same
from ..backends.rows import TopK
from ..csr import CSR
from ._common import OPS


def masked_topk(scores: torch.Tensor, users: torch.Tensor, exclude: Sequence[CSR], k: int) -> TopK:
    """The ``k`` best columns of each row of ``scores``, best first.

    Equal scores are ordered by ascending column, and a column in any of the ``exclude`` rows of
    the row's user counts as ``-inf`` (ranked after every other column, so it is listed only when
    fewer than ``k`` columns are left).

    Args:
        scores: float [B, I].
        users: int [B], the user of each row: its row in every ``exclude`` set.
        exclude: up to 8 :class:`~pnn_fast.csr.CSR` over users (rows sorted, as CSR keeps them).
        k: 1 <= k <= I.
    Returns:
        :class:`~pnn_fast.backends.rows.TopK` ``(values, indices)``: values [B, k] of scores' dtype,
        ``-inf`` for excluded columns; indices int64 [B, k], the columns.
    Raises:
        ValueError: a NaN score at a column that is not excluded, or k out of range.
    """
    _extension.require_kernels(scores.device)
    check_same("scores", scores, [("users", users)] + [(f"exclude[{n}]", e.indptr) for n, e in enumerate(exclude)],
               dtype=False)
    return TopK(*OPS.masked_topk.default(scores, users.long(), [e.indptr for e in exclude],
                                         [e.indices for e in exclude], k))


@torch.library.register_fake("pnn_fast::masked_topk")
def _(scores, rows, exclude_indptr, exclude_indices, k):
    return scores.new_empty(scores.shape[0], k), rows.new_empty(scores.shape[0], k, dtype=torch.int64)
