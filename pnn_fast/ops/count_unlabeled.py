"""pnn_fast::count_unlabeled: each row's number of unlabeled candidates |U_b|, without scoring."""
from __future__ import annotations

import torch

from ..known import KnownPositives
from ._common import OPS, row_args


def count_unlabeled(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                    candidates: torch.Tensor, known: KnownPositives) -> torch.Tensor:
    """``|U_b|`` of each row, without scoring (much cheaper than :func:`hard_negative_argmax`).

    Args: as :func:`hard_negative_argmax` (the embeddings only fix the device and the checks).
    Returns: int64 [B].
    """
    args = row_args(user_emb.detach(), item_table.detach(), users, pos_items, candidates, known)
    return OPS.count_unlabeled.default(*args)


@torch.library.register_fake("pnn_fast::count_unlabeled")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices):
    return users.new_empty(user_emb.shape[0], dtype=torch.int64)
