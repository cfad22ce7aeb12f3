"""A generated dataset with planted preferences, so the library runs with no data on disk."""
from __future__ import annotations

import math

import torch

from .dataset import Dataset
from .split import random_split_by_user

# How strongly the planted user-item affinity drives a user's choices, against
# the item popularity term (both have unit variance before scaling).  At 2 the
# taste term dominates, so a model that learns the factors beats a popularity
# ranking clearly, while popularity is still far better than random.
_TASTE_SCALE = 2.0
# Users per block when sampling: bounds the [block, num_items] score matrix.
_BLOCK = 4096


def synthetic_dataset(
    num_users: int = 1000,
    num_items: int = 500,
    interactions_per_user: int = 30,
    dim: int = 8,
    seed: int = 0,
) -> Dataset:
    """Interactions drawn from latent factors, split 8:1:1 per user like the paper.

    Users and items get standard normal factors ``p_u, q_i`` of size ``dim`` and
    items a standard normal popularity ``b_i``.  Each user picks
    ``interactions_per_user`` distinct items, one after another without
    replacement, with probability ``softmax(2 * <p_u, q_i> / sqrt(dim) + b_i)``
    (the Gumbel top-k trick draws them all at once).  The interactions are then
    split with :func:`~pnn_fast.data.split.random_split_by_user` and ratios
    (0.8, 0.1, 0.1), seeded by ``seed``.

    Returns:
        A :class:`Dataset` named ``"synthetic"`` with ``num_users * interactions_per_user``
        interactions; item ids span ``range(num_items)`` even if an item was never
        picked; ``user_ids`` and ``item_ids`` are ``None``.
    """
    for name, value in (("num_users", num_users), ("num_items", num_items),
                        ("interactions_per_user", interactions_per_user), ("dim", dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if interactions_per_user > num_items:
        raise ValueError(f"interactions_per_user ({interactions_per_user}) cannot exceed num_items ({num_items})")

    generator = torch.Generator().manual_seed(int(seed))
    user_factors = torch.randn(num_users, dim, generator=generator, dtype=torch.float64)
    item_factors = torch.randn(num_items, dim, generator=generator, dtype=torch.float64)
    popularity = torch.randn(num_items, generator=generator, dtype=torch.float64)

    picked = []
    for start in range(0, num_users, _BLOCK):
        logits = _TASTE_SCALE / math.sqrt(dim) * user_factors[start:start + _BLOCK] @ item_factors.T + popularity
        # Adding Gumbel noise (-log of an Exp(1) draw) and keeping the top k is
        # k successive draws without replacement from softmax(logits).
        noise = torch.empty_like(logits).exponential_(generator=generator).log_().neg_()
        picked.append((logits + noise).topk(interactions_per_user, dim=1).indices.sort(dim=1).values)

    items = torch.cat(picked).reshape(-1)
    users = torch.arange(num_users).repeat_interleave(interactions_per_user)
    part = random_split_by_user(users, num_users, (0.8, 0.1, 0.1), seed)
    train, valid, test = ((users[part == p], items[part == p]) for p in range(3))
    return Dataset("synthetic", num_users, num_items, train, valid, test, user_ids=None, item_ids=None)
