"""Per-user random split that reproduces RecBole's ``RS`` split grouped by user.

RecBole (``eval_args: {split: {RS: [0.8, 0.1, 0.1]}, order: RO, group_by: user}``,
the paper's protocol) shuffles all interactions, groups them by user keeping
the shuffled order, and cuts each user's list into consecutive parts whose
sizes come from ``Dataset._calcu_split_ids`` in
``recbole/data/dataset/dataset.py`` (RUCAIBox/RecBole; the rule is the same
from commit 58b9bd1c of November 2020 through the 1.1.x and 1.2.x releases).
For a user with ``n`` interactions and ratios ``r`` (normalised by their sum):

1. every part but the first gets ``int(r[j] * n)`` (rounded toward zero);
2. the first part gets the rest, ``n - sum(others)``;
3. then, visiting the parts from the last one backwards to the second, stop as
   soon as the first part has at most one interaction left; otherwise, if
   ``0 < r[j] * n < 1`` (the part was rounded down to zero but is not meant to
   be empty) move one interaction from the first part to part ``j``.

With ratios 8:1:1 this gives (train, valid, test):

====  =========    ====  =========    ====  =========
n     counts       n     counts       n     counts
====  =========    ====  =========    ====  =========
1     (1, 0, 0)    5     (3, 1, 1)    9     (7, 1, 1)
2     (1, 0, 1)    6     (4, 1, 1)    10    (8, 1, 1)
3     (1, 1, 1)    7     (5, 1, 1)    19    (17, 1, 1)
4     (2, 1, 1)    8     (6, 1, 1)    20    (16, 2, 2)
====  =========    ====  =========    ====  =========

So a user with two interactions gets one in train and one in test and none in
valid, and a user with a single interaction is train-only.

The shuffle cannot match RecBole's random stream, only its distribution: here
one ``torch.randperm`` from a generator seeded with ``seed`` orders the
interactions, a stable sort by user groups them, and an interaction's part
follows from its position within its user against the user's counts, so the
whole split is a handful of vectorised tensor operations.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def normalized_ratios(ratios: Sequence[float]) -> list[float]:
    """Validate ``ratios`` and divide them by their sum, exactly as RecBole does.

    The division uses Python floats so that the products ``r * n`` below round
    the way RecBole's do (float64 arithmetic is identical in torch).
    """
    ratios = [float(r) for r in ratios]
    if not ratios:
        raise ValueError("ratios must not be empty")
    if any(not math.isfinite(r) or r < 0 for r in ratios):
        raise ValueError(f"ratios must be finite and >= 0, got {ratios}")
    total = sum(ratios)
    if total <= 0:
        raise ValueError(f"ratios must have a positive sum, got {ratios}")
    return [r / total for r in ratios]


def split_counts(sizes: torch.Tensor, ratios: Sequence[float]) -> torch.Tensor:
    """How many of each group's interactions go to each part (RecBole's rounding).

    Args:
        sizes: int64 [g], interactions per group (user), ``>= 0``.
        ratios: one ratio per part, need not sum to one.

    Returns:
        int64 [g, len(ratios)]; row ``u`` sums to ``sizes[u]``.
    """
    ratios = normalized_ratios(ratios)
    n = sizes.to(torch.int64)
    n_float = n.to(torch.float64)
    scaled = [r * n_float for r in ratios]  # float64 [g] each, RecBole's ``ratios[i] * tot``
    counts = [s.to(torch.int64) for s in scaled]  # truncation toward zero, as Python's int()
    counts[0] = n - sum(counts[1:], torch.zeros_like(n))
    # RecBole's backward pass over the parts.  Its ``break`` once the first part
    # is down to one interaction equals a per-group mask, because the first
    # part only ever shrinks.
    for j in range(len(ratios) - 1, 0, -1):
        bump = (counts[0] > 1) & (scaled[j] > 0) & (scaled[j] < 1)
        counts[j] = counts[j] + bump.to(torch.int64)
        counts[0] = counts[0] - bump.to(torch.int64)
    return torch.stack(counts, dim=1)


def _random_ranks_by_user(users: torch.Tensor, num_users: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each interaction's 0-based rank within its user in a random order, and the users' sizes.

    One ``torch.randperm`` seeded with ``seed`` shuffles the interactions and a stable sort by user
    groups them: users int64 [n] -> (rank int64 [n], in the input's order; sizes int64 [num_users]).
    """
    users = users.to(torch.int64)
    n = users.numel()
    generator = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=generator)
    order = perm[torch.argsort(users[perm], stable=True)]
    sizes = torch.bincount(users, minlength=num_users)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty(n, dtype=torch.int64)
    rank[order] = torch.arange(n) - starts[users[order]]
    return rank, sizes


def random_split_by_user(users: torch.Tensor, num_users: int, ratios: Sequence[float], seed: int) -> torch.Tensor:
    """Assign every interaction to a part: a per-user random split with RecBole's counts.

    Args:
        users: int64 [n], user id of each interaction, ``0 <= id < num_users``.
        num_users: size of the user id space.
        ratios: one ratio per part (e.g. ``(0.8, 0.1, 0.1)`` for train/valid/test).
        seed: seeds the ``torch.Generator`` of the shuffle; the result depends only
            on ``users`` (in its given order), ``ratios`` and ``seed``.

    Returns:
        int64 [n], the part index ``0 <= p < len(ratios)`` of each interaction.
        User ``u`` has exactly ``split_counts(sizes, ratios)[u, p]`` interactions in part ``p``.
    """
    users = users.to(torch.int64)
    rank, sizes = _random_ranks_by_user(users, num_users, seed)
    ends = torch.cumsum(split_counts(sizes, ratios), dim=1)  # [num_users, parts], exclusive ends
    return (rank.unsqueeze(1) >= ends[users]).sum(dim=1)


def random_share_by_user(users: torch.Tensor, num_users: int, share: float, seed: int) -> torch.Tensor:
    """A random ``share`` of each user's interactions: ``floor(share * n_u)`` of the user's ``n_u``.

    Used to hide training interactions (simulated false negatives).  Rounding down keeps at least
    one interaction of every user for ``share < 1``, and hides none of a user with fewer than
    ``1 / share`` of them.

    Args:
        users: int64 [n], as :func:`random_split_by_user`; share: in [0, 1); seed: the shuffle's.
    Returns:
        bool [n], True for the chosen interactions.
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share must lie in [0, 1), got {share!r}")
    users = users.to(torch.int64)
    rank, sizes = _random_ranks_by_user(users, num_users, seed)
    chosen = torch.floor(share * sizes.to(torch.float64)).to(torch.int64)
    return rank < chosen[users]
