"""Fused backend: drop-in replacements of the functions of :mod:`pnn_fast.backends.reference`.

Same signatures, same outputs (to rounding), on the C++/CUDA kernels of :mod:`pnn_fast.ops`.
The [B, C] score and mask matrices of the reference are never built: the kernels recompute
scores row by row, and only gathers of O(B d) (the positive and hard-negative scores)
are left to autograd here.  The class size rule is shared with the reference through
:mod:`pnn_fast.backends.rows`; the terms from the centroids are the ``class_terms`` op, the same
math as the reference's function of that name (the parity tests hold them together).

One function has no counterpart in the reference: ``dot_topk``, the CPU evaluator's ranking of
dot products block by block (:func:`pnn_fast.eval.ranked_items`), the reference's being its
``masked_topk`` over chunks of the products.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from ..known import KnownPositives, RowLookup
from ..ops import (dot_topk, embedding_bpr, gathered_dots, gathered_norm, history_sample, lowest_k_mask,
                  masked_logsumexp, masked_topk, pairwise_uniformity, rows_contain, unit_rows, unknown_items)
from .rows import HardNegativeBPR, NegSize, dot, gather_rows, negative_class_size

__all__ = ["csr_spmm", "dot_topk", "embedding_bpr", "gathered_dots", "gathered_norm", "hard_negative_bpr", "history_sample",
           "lowest_k_mask", "masked_logsumexp", "masked_topk", "pairwise_uniformity", "pnn_row_terms", "rows_contain", "unit_rows", "unknown_items"]


def _bpr(user_emb, item_table, pos_items, candidates, hard):
    """(bpr, pos_emb) given the hard negatives, as the reference computes them."""
    index = hard.clamp_min(0)
    hard_items = candidates[index] if candidates.dim() == 1 else candidates.gather(1, index[:, None]).squeeze(1)
    # one gather for both: one dense [I, d] gradient to allocate and fill, not two and their sum
    pos_emb, hard_emb = gather_rows(item_table, torch.stack([pos_items.long(), hard_items]))
    pos_score = dot(user_emb, pos_emb)
    hard_score = dot(user_emb, hard_emb)
    bpr = torch.where(hard >= 0, F.softplus(hard_score - pos_score), torch.zeros_like(pos_score))
    return bpr, pos_emb


def csr_spmm(adj: torch.Tensor, x: torch.Tensor, addend: torch.Tensor | None = None, divisor: float = 1.0) -> torch.Tensor:
    """``(addend + adj @ x) / divisor`` in one pass (the ``csr_spmm`` op); see
    :func:`pnn_fast.backends.reference.csr_spmm` (same arguments)."""
    return ops.csr_spmm(adj.crow_indices(), adj.col_indices(), adj.values(), x, addend, divisor)


def hard_negative_bpr(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                      candidates: torch.Tensor, known: KnownPositives, lookup: RowLookup | None = None) -> HardNegativeBPR:
    """BPR against the in-row hardest unlabeled candidate; see :func:`pnn_fast.backends.reference.hard_negative_bpr`.

    Args:
        user_emb: float [B, d]; item_table: float [I, d]; users, pos_items: int [B];
        candidates: int [C] shared or [B, C] per row; lookup: as the reference's.
    Returns:
        :class:`~pnn_fast.backends.rows.HardNegativeBPR` ``(bpr [B], hard int64 [B], num_unlabeled int64 [B])``.
    """
    lookup = RowLookup(known, users) if lookup is None else lookup
    found = ops.hard_negative_argmax(user_emb, item_table, lookup.rows, pos_items, candidates, lookup.known)
    bpr, _ = _bpr(user_emb, item_table, pos_items, candidates, found.hard)
    return HardNegativeBPR(bpr, found.hard, found.num_unlabeled)


def pnn_row_terms(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                  candidates: torch.Tensor, known: KnownPositives, neg_size: NegSize, noise_pos: torch.Tensor,
                  noise_neg: torch.Tensor, hard_candidates: torch.Tensor | None = None,
                  candidates_unknown: bool = False, lookup: RowLookup | None = None) -> dict:
    """Per-row PNN terms; see :func:`pnn_fast.backends.reference.pnn_row_terms` (same arguments and outputs).

    Returns:
        dict of [B] tensors: ``bpr``, ``rank``, ``constrain`` (float), ``hard_negative``,
        ``num_negative``, ``num_neutral`` (int64), ``valid`` (bool).
    """
    rows, lookup = (users, known) if lookup is None else (lookup.rows, lookup.known)
    # drawn from the unknown items, every candidate is in U_b unless it is the positive: no lookups
    lookup = lookup.without_items if candidates_unknown else lookup
    # |U_b| first (no scoring), so that one scoring pass gives the classes and the hard negative
    num_unlabeled = ops.count_unlabeled(user_emb, item_table, rows, pos_items, candidates, lookup)
    valid = num_unlabeled > 0
    k = negative_class_size(num_unlabeled, known.count(users), known.num_items, neg_size)
    classes = ops.class_centroids(user_emb, item_table, rows, pos_items, candidates, lookup, k)
    hard = classes.hard
    if hard_candidates is None:
        bpr, pos_emb = _bpr(user_emb, item_table, pos_items, candidates, hard)
    else:
        hard = ops.hard_negative_argmax(user_emb, item_table, rows, pos_items, hard_candidates, lookup).hard
        bpr, pos_emb = _bpr(user_emb, item_table, pos_items, hard_candidates, hard)
    # L_rank and L_constrain in one op each way, in place of some 60 ATen ops through autograd
    terms = ops.class_terms(user_emb, pos_emb, classes.neutral, classes.negative, noise_pos, noise_neg, valid,
                            classes.num_negative)
    return {"bpr": bpr, "rank": terms.rank, "constrain": terms.constrain, "hard_negative": hard,
            "num_negative": classes.num_negative, "num_neutral": classes.num_neutral, "valid": valid}
