"""pnn_fast::hard_negative_argmax: each row's hardest unlabeled candidate (not differentiable)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..known import KnownPositives
from ._common import OPS, row_args


class HardNegatives(NamedTuple):
    """What :func:`hard_negative_argmax` returns."""
    hard: torch.Tensor
    num_unlabeled: torch.Tensor


def hard_negative_argmax(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                         pos_items: torch.Tensor, candidates: torch.Tensor,
                         known: KnownPositives) -> HardNegatives:
    """The hardest unlabeled candidate of each row: ``argmax_{j in U_b} s_j``.

    Args:
        user_emb: float [B, d]; item_table: float [I, d], same dtype; users, pos_items: int [B];
        candidates: int [C] or [B, C]; known: the users' known positives (same device).
    Returns:
        :class:`HardNegatives` ``(hard, num_unlabeled)``, both int64 [B]: the candidate index (smallest on ties, -1
        when ``U_b`` is empty) and ``|U_b|``.  Not differentiable.
    """
    args = row_args(user_emb.detach(), item_table.detach(), users, pos_items, candidates, known)
    return HardNegatives(*OPS.hard_negative_argmax.default(*args))


@torch.library.register_fake("pnn_fast::hard_negative_argmax")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices):
    rows = user_emb.shape[0]
    return users.new_empty(rows, dtype=torch.int64), users.new_empty(rows, dtype=torch.int64)
