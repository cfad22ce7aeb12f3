"""pnn_fast::dot_topk: each user row's k best items by dot product with the item table, some items
excluded per user, without building the [T, I] scores (the evaluator's full ranking on the CPU)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _extension
from .._checks import check_same
from ..backends.rows import TopK
from ..csr import CSR
from ._common import OPS


def dot_topk(user_rows: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, exclude: Sequence[CSR], k: int,
             block_items: int = 0) -> TopK:
    """:func:`~pnn_fast.ops.masked_topk` of ``user_rows @ item_table.T``, computed ``block_items``
    items at a time into one buffer, each row's top k kept from block to block.

    Memory is the buffer (T x block_items scores) and each row's few candidates, at any catalog
    size. The scores are those of the block's product, so they may differ from one
    ``user_rows @ item_table.T`` by rounding (as between chunks of any width).

    Args:
        user_rows: float [T, d]; item_table: float [I, d] of the same dtype.
        users: int [T], the user of each row: its row in every ``exclude`` set.
        exclude: up to 8 :class:`~pnn_fast.csr.CSR` over users (rows sorted, as CSR keeps them).
        k: 1 <= k <= I.
        block_items: items scored at a time; 0 lets the op size the block to stay in cache.
    Returns:
        :class:`~pnn_fast.backends.rows.TopK` ``(values, indices)``: values [T, k] of user_rows'
        dtype, best first, equal scores by ascending item, ``-inf`` for excluded items; indices
        int64 [T, k], the items.
    Raises:
        ValueError: a NaN score at an item that is not excluded, or k out of range.
    """
    _extension.require_kernels(user_rows.device)
    check_same("user_rows", user_rows, [("item_table", item_table), ("users", users)]
               + [(f"exclude[{n}]", e.indptr) for n, e in enumerate(exclude)], dtype=False)
    return TopK(*OPS.dot_topk.default(user_rows, item_table, users.long(), [e.indptr for e in exclude],
                                      [e.indices for e in exclude], k, block_items))


@torch.library.register_fake("pnn_fast::dot_topk")
def _(user_rows, item_table, rows, exclude_indptr, exclude_indices, k, block_items):
    return user_rows.new_empty(user_rows.shape[0], k), rows.new_empty(user_rows.shape[0], k, dtype=torch.int64)
