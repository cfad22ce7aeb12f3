"""pnn_fast::lowest_k_mask: each row's k lowest scores, as a mask (SL's split of its sampled
negatives into PNN's negative and neutral classes, objectives/sl.py)."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ._common import OPS


def lowest_k_mask(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Whether ``scores[b, j]`` is among the ``k[b]`` lowest scores of row ``b``.

    The order is torch.sort's (-0.0 equals +0.0, NaN above +inf) with equal scores by ascending
    column, so the mask is ``rank < k[b]`` for the ranks of a stable ascending argsort; a selection
    per row (a quickselect on the CPU, a block's radix select on CUDA) finds it in O(K) instead of a
    sort's O(K log K).

    Args:
        scores: float16, bfloat16, float32 or float64 [B, K], K < 2^31.
        k: int [B], each in ``[0, K]``.
    Returns:
        bool [B, K] with ``k[b]`` True entries in row ``b``; not differentiable.
    """
    _extension.require_kernels(scores.device)
    check_same("k", k, [("scores", scores)], dtype=False)
    return OPS.lowest_k_mask.default(scores, k.long())


@torch.library.register_fake("pnn_fast::lowest_k_mask")
def _(scores, k):
    return scores.new_empty(scores.shape, dtype=torch.bool)
