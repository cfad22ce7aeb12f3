"""Per-row helpers that both backends share: the parts of the semantics that involve no
[B, C] scoring (docs/semantics.md), so that the reference and the fused backend cannot drift
apart on them. Pure PyTorch on [B] and [B, d] tensors.
"""
from __future__ import annotations

from typing import NamedTuple, Union

import torch

#: the size rule of a row's negative class: "proportional", "count" or a fixed int
NegSize = Union[str, int]

#: eps of the L2 normalisation in the clamp term and the uniformity term (as F.normalize)
NORM_EPS = 1e-12


class TopK(NamedTuple):
    """Each row's k best entries, best first (what the ranking ops of both backends return)."""
    values: torch.Tensor  #: float [B, k], -inf for excluded columns
    indices: torch.Tensor  #: int64 [B, k], the columns (items) of ``values``


class HardNegativeBPR(NamedTuple):
    """BPR against each row's hardest unlabeled candidate (what ``hard_negative_bpr`` of both backends returns)."""
    bpr: torch.Tensor  #: float [B], 0 where the row has no unlabeled candidate
    hard: torch.Tensor  #: int64 [B], the candidate's index in its row, -1 where there is none
    num_unlabeled: torch.Tensor  #: int64 [B], |U_b|


class ClassTerms(NamedTuple):
    """PNN's two per-row class terms (what ``class_terms`` of both backends returns)."""
    rank: torch.Tensor  #: float [B], L_rank
    constrain: torch.Tensor  #: float [B], L_constrain


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise inner product over the last dimension: [..., d] x [..., d] -> [...]."""
    return (a * b).sum(dim=-1)


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for any index shape, by index_select: its backward (index_add) adds repeated
    rows in a fixed order, whereas advanced indexing's (index_put with accumulate) may add them
    in any order on a multi-threaded CPU, which makes training runs irreproducible."""
    return table.index_select(0, index.reshape(-1)).reshape(*index.shape, *table.shape[1:])


def negative_class_size(num_unlabeled: torch.Tensor, num_known: torch.Tensor, num_items: int,
                        neg_size: NegSize) -> torch.Tensor:
    """k_b, the size of the negative class of each row (int64 [B]); shared by every backend.

    "proportional": round-half-up(|U_b| * N_u / (I - N_u)), at least 1 (the user's
    share of positives carried over to the batch's unlabeled items);
    "count": N_u (the paper's |Sigma_neg| = N_u); an int: that number.
    Always at most |U_b| - 1 so the neutral class keeps at least one item.
    """
    num_unlabeled = num_unlabeled.long()
    num_known = num_known.long()
    if neg_size == "proportional":
        rest = (num_items - num_known).clamp_min(1)  # I - N_u; rows where it is 0 have no unlabeled items
        k = torch.div(2 * num_unlabeled * num_known + rest, 2 * rest, rounding_mode="floor").clamp_min(1)
    elif neg_size == "count":
        k = num_known
    else:
        k = torch.full_like(num_unlabeled, int(neg_size))
    return torch.minimum(k, (num_unlabeled - 1).clamp_min(0))
