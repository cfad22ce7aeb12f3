"""pnn_fast::unknown_items: uniform draws mapped to items a user has not interacted with (the sampler)."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ..known import KnownPositives
from ._common import OPS


def unknown_items(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Uniform draws mapped to unknown items: the ``floor(u * (I - N_u))``-th (0-based) item that is
    not a known positive of ``users[b]``, for each ``u = uniform[b, k]``.

    Args:
        known: the users' known positives (same device); users: int [B];
        uniform: float32 [B, K] in ``[0, 1)`` (checked; each user needs an unknown item).
    Returns:
        int64 [B, K].  One binary search in the user's CSR row per entry; not differentiable.
    """
    _extension.require_kernels(users.device)
    check_same("users", users, [("uniform", uniform), ("known", known.indptr)], dtype=False)
    return OPS.unknown_items.default(known.indptr, known.indices, users.long(), uniform, known.num_items)


@torch.library.register_fake("pnn_fast::unknown_items")
def _(known_indptr, known_indices, users, uniform, num_items):
    return uniform.new_empty(uniform.shape, dtype=torch.int64)
