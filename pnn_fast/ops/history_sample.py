"""pnn_fast::history_sample: a uniform random subset of a user's known items (the attention's history)."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ..known import KnownPositives
from ._common import OPS


def history_sample(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A uniform random subset of min(N_u, L) known items of each ``users[b]``, by Floyd's algorithm
    on the draws ``uniform[b]`` (the same subsets as :func:`pnn_fast.backends.reference.history_sample`).

    Args:
        known: the users' known positives (same device); users: int [B];
        uniform: float32 [B, L] in ``[0, 1)`` (checked).
    Returns:
        int64 [B, L]: the subset's items, then -1.  O(L^2) per row, whatever N_u; not differentiable.
    """
    _extension.require_kernels(users.device)
    check_same("users", users, [("uniform", uniform), ("known", known.indptr)], dtype=False)
    return OPS.history_sample.default(known.indptr, known.indices, users.long(), uniform)


@torch.library.register_fake("pnn_fast::history_sample")
def _(known_indptr, known_indices, users, uniform):
    return uniform.new_empty(uniform.shape, dtype=torch.int64)
