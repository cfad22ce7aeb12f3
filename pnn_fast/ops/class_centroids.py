"""pnn_fast::class_centroids_fwd / _bwd: the mean embedding of each row's neutral and negative class,
differentiable w.r.t. the item table."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..known import KnownPositives
from ._common import OPS, opmath_dtype, row_args


class ClassCentroids(NamedTuple):
    """What :func:`class_centroids` returns (shapes and dtypes there)."""
    neutral: torch.Tensor
    negative: torch.Tensor
    num_neutral: torch.Tensor
    num_negative: torch.Tensor
    threshold: torch.Tensor
    cutoff: torch.Tensor
    hard: torch.Tensor


def class_centroids(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                    candidates: torch.Tensor, known: KnownPositives, k: torch.Tensor) -> ClassCentroids:
    """Mean item embedding of each row's neutral and negative class.

    The negative class is the ``k[b]`` lowest-scored members of ``U_b`` (ties: smallest ``j``;
    ``k`` clamped to ``[0, |U_b|]``), the neutral class the rest of ``U_b``; one scoring pass
    selects them.

    Args: as :func:`~pnn_fast.ops.hard_negative_argmax`, plus ``k``: int64 [B].
    Returns:
        :class:`ClassCentroids` ``(neutral, negative, num_neutral, num_negative, threshold, cutoff, hard)``: float [B, d]
        in user_emb's dtype (zero rows for empty classes); int64 [B] class sizes; the selection
        state, float [B] ``threshold`` (float64 for float64 inputs, float32 otherwise) and int64 [B]
        ``cutoff``: candidate ``j`` of ``U_b`` is negative iff ``(s_j, j) <= (threshold, cutoff)``
        lexicographically, in torch.sort's order of scores (NaN above +inf, -0.0 == 0.0), and
        ``cutoff`` is -1, ``threshold`` -inf when the class is empty; and, from the same scores,
        the hard negative of :func:`~pnn_fast.ops.hard_negative_argmax` (so that PNN scores each
        row once in its forward pass).
        Differentiable w.r.t. ``item_table``; class membership is piecewise constant, so there
        is no gradient w.r.t. ``user_emb``.  On the CPU with a shared list, the forward also keeps,
        for each row whose groups fit in :func:`saved_capacity` entries, the candidates its backward
        scatters to (int32, at most 32 MiB in all); the backward rescores the other rows from
        ``(threshold, cutoff)``.  No [B, C] mask is ever stored.
    """
    args = row_args(user_emb.detach(), item_table, users, pos_items, candidates, known)
    # the schema's last two outputs are the forward's saved scatter groups, for its backward only
    return ClassCentroids(*OPS.class_centroids_fwd.default(*args, k.long(), saved_capacity(user_emb, candidates))[:7])


#: int32 entries of saved scatter groups per call at most (32 MiB), whatever the batch size: enough for
#: every row but heavy users' at B = 8192 on an ML-1M-shaped batch (about 720 entries a row), where
#: the backward's per-thread slot gradients are about as large
SAVED_ENTRIES_BUDGET = 1 << 23


def saved_capacity(user_emb: torch.Tensor, candidates: torch.Tensor) -> int:
    """Entries per row of the forward's saved scatter groups: C / 8 within the budget for a shared
    list on the CPU (a row whose labeled candidates and smaller class exceed an eighth of the list,
    a heavy user's, is rescored instead), 0 otherwise (per-row lists and the CUDA kernels rescore)."""
    if candidates.dim() != 1 or user_emb.device.type != "cpu":
        return 0
    return min(candidates.shape[0] // 8, SAVED_ENTRIES_BUDGET // max(user_emb.shape[0], 1))


@torch.library.register_fake("pnn_fast::class_centroids_fwd")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices, k, capacity):
    rows = user_emb.shape[0]
    counts = [users.new_empty(rows, dtype=torch.int64) for _ in range(4)]
    threshold = user_emb.new_empty(rows, dtype=opmath_dtype(user_emb.dtype))
    return (torch.empty_like(user_emb), torch.empty_like(user_emb), counts[0], counts[1], threshold, counts[2],
            counts[3], users.new_empty((rows, capacity), dtype=torch.int32),
            users.new_empty((rows, 2), dtype=torch.int32))


@torch.library.register_fake("pnn_fast::class_centroids_bwd")
def _(grad_neutral, grad_negative, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices,
      threshold, cutoff, num_neutral, num_negative, saved_members, saved_ends):
    return item_table.new_empty(item_table.shape)


def _centroids_setup_context(ctx, inputs, output):
    _, _, num_neutral, num_negative, threshold, cutoff, _, saved_members, saved_ends = output
    ctx.mark_non_differentiable(threshold)
    ctx.save_for_backward(*inputs[:7], threshold, cutoff, num_neutral, num_negative, saved_members, saved_ends)


def _centroids_backward(ctx, grad_neutral, grad_negative, *_):
    grad_table = None
    if ctx.needs_input_grad[1]:
        grad_table = OPS.class_centroids_bwd.default(grad_neutral, grad_negative, *ctx.saved_tensors)
    return (None, grad_table) + (None,) * 7


torch.library.register_autograd("pnn_fast::class_centroids_fwd", _centroids_backward,
                                setup_context=_centroids_setup_context)
