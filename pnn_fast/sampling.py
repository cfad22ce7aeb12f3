"""Sampling from the items a user has not interacted with, on the selected backend.

Exact and loop-free: one uniform draw per entry is mapped to the ``r``-th unknown item of the
user (``unknown_items`` of :mod:`pnn_fast.backends`), so there are no rejection rounds and no
host synchronisation. Every objective that needs uniform negatives draws them here, so that
BPR, DNS, PNN and the baselines share one sampler.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import backends
from ._checks import check_int
from .known import KnownPositives


def unknown_from_uniform(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor,
                         backend: str = "auto") -> torch.Tensor:
    """The ``floor(u * (I - N_u))``-th (0-based) unknown item of ``users[b]`` for each
    ``u = uniform[b, k]`` (float32 arithmetic).

    Args:
        known: each user's known items; users: int [B]; uniform: float32 [B, K] in ``[0, 1)``.
        backend: "reference" (one global searchsorted over all users' keys), "auto" (the compiled
            kernel where built: one binary search within the user's own row, which stays in
            cache) or "cpu"/"cuda" (the kernel, required). All give the same items.
    Returns:
        int64 [B, K].
    """
    return backends.select(backend, users.device).unknown_items(known, users, uniform)


def sample_unknown(known: KnownPositives, users: torch.Tensor, num: int,
                   generator: Optional[torch.Generator] = None, backend: str = "auto") -> torch.Tensor:
    """``num`` items per row drawn uniformly (with replacement) from ``users[b]``'s unknown items.

    Args:
        users: int [B]; every user must have at least one unknown item.
        num: candidates per row; generator: the random stream (the global one when None).
        backend: as :func:`unknown_from_uniform`.
    Returns:
        int64 [B, num].
    """
    uniform = torch.rand(users.numel(), check_int("num", num, 0), generator=generator, device=users.device,
                         dtype=torch.float32)
    return unknown_from_uniform(known, users, uniform, backend)


def sample_history(known: KnownPositives, users: torch.Tensor, length: int,
                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``length`` of each user's known items, a uniform random subset (without replacement)
    when the user has more, by Floyd's algorithm: O(length^2) per user whatever its number of items.

    Draws from the global random stream. Returns ``(items int64 [n, L], mask bool [n, L])`` for the
    ``n`` given users, ``L = min(length, num_items)``; padded slots hold item 0 and mask False.
    """
    # no user knows more than the catalog, so slots past it could only ever be padding (and a
    # length such as 10**12 would otherwise be allocated)
    uniform = torch.rand(users.numel(), min(length, known.num_items), device=users.device)
    items = backends.select(backend, users.device).history_sample(known, users, uniform)
    return items.clamp_min(0), items >= 0


__all__ = ["sample_history", "sample_unknown", "unknown_from_uniform"]
