"""The user-aware attention: the paper's per-user weight lambda between the BPR warm-up and PNN."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import backends
from ._checks import check_int, check_real
from .backends.rows import gather_rows
from .compact import compact_items, sorted_runs
from .known import KnownPositives
from .sampling import sample_history


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


def user_runs(users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One slot per distinct user of a batch, in fixed shapes (``torch.unique``'s size would be read
    on the host): the rows sorted by user, each row pointing at the first position of its user's run.

    Args:
        users: int [B].
    Returns:
        ``(sorted_users int [B], row_of int64 [B])``: ``sorted_users[row_of[b]] == users[b]``, and
        rows of one user share one ``row_of``. A per-user draw made for every position of
        ``sorted_users`` and read through ``row_of`` is one draw per distinct user.
    """
    sorted_users, order, run_starts = sorted_runs(users)
    positions = torch.arange(users.numel(), device=users.device)
    run_start = torch.cummax(torch.where(run_starts, positions, 0), dim=0).values
    return sorted_users, torch.empty_like(order).scatter_(0, order, run_start)


class UserAwareAttention(nn.Module):
    """lambda_u = sigmoid(w1 . sum_h a_h e_h / T), a = softmax_h(e_u . tanh(W2 e_h + b)).

    The paper's adaptive weight between the BPR warm-up and the PNN loss. ``w1`` and ``W2`` are
    constrained non-negative (the paper's R_+) through a softplus re-parametrisation, which
    keeps every entry positive and trainable (a clamp would freeze entries that cross zero).
    The history is up to ``history_len`` of the user's known items, a uniform random subset
    (without replacement) when the user has more. ``temperature`` T is the paper's 1; a larger
    one divides the logit, so lambda moves away from 1/2 more slowly as the logit grows.
    """

    def __init__(self, dim: int, history_len: int = 50, temperature: float = 1.0):
        super().__init__()
        self.dim = check_int("dim", dim, 1)
        self.history_len = check_int("history_len", history_len, 1)
        self.temperature = check_real("temperature", temperature, low_open=True)
        scale = math.sqrt(2.0 / (dim + dim))  # xavier-normal std of a d x d matrix
        self.raw_w1 = nn.Parameter(_inverse_softplus(torch.randn(dim).abs() * scale + 1e-3))
        self.raw_w2 = nn.Parameter(_inverse_softplus(torch.randn(dim, dim).abs() * scale + 1e-3))
        self.bias = nn.Parameter(torch.zeros(dim))

    @property
    def w1(self) -> torch.Tensor:
        return F.softplus(self.raw_w1)

    @property
    def w2(self) -> torch.Tensor:
        return F.softplus(self.raw_w2)

    def sample(self, known: KnownPositives, users: torch.Tensor, backend: str = "auto") -> "AttentionHistory":
        """The histories of one step: one sample per distinct user of ``users`` (int [B]), shared by
        that user's rows, drawn by ``backend`` (as :func:`pnn_fast.backends.select`) from the global
        random stream."""
        # drawn at every position of the sorted users, each row reading its user's first (the draws
        # past a run's first go unused)
        sorted_users, row_of = user_runs(users)
        items, mask = sample_history(known, sorted_users, self.history_len, backend)
        return AttentionHistory(items, mask, row_of)

    def weights(self, user_emb: torch.Tensor, table: torch.Tensor, history: "AttentionHistory",
                backend: str = "auto") -> torch.Tensor:
        """lambda per row, float [B] in (0, 1), from ``history`` (:meth:`sample`) whose ``items`` are rows
        of ``table`` float [n, d]: the item table, or a compact table of the step's rows that holds
        them (:mod:`pnn_fast.compact`). Every row of ``table`` gets a key, so a caller gathers first
        when the catalog outweighs the history (as :meth:`forward` does)."""
        impl = backends.select(backend, user_emb.device)
        # the key and <e_h, w1> depend on the item only: evaluate them once per row of the table
        keys = torch.tanh(table @ self.w2.T.to(table.dtype) + self.bias.to(table.dtype))
        slots = history.items[history.row_of]  # [B, L]: each row's history as rows of the table
        logits = impl.gathered_dots(user_emb, keys, slots).masked_fill(~history.mask[history.row_of], float("-inf"))
        weights = torch.softmax(logits, dim=1).nan_to_num(0.0)  # a user with no history gets weight 0
        # w1 . sum_l a_l e_l = sum_l a_l (e_l . w1): a weighted sum of scalars, not of [d] rows
        along_w1 = gather_rows(table @ self.w1.to(table.dtype), slots)  # [B, L]
        return torch.sigmoid((weights * along_w1).sum(dim=1) / self.temperature)

    def forward(self, user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                known: KnownPositives, backend: str = "auto", sparse: bool = False) -> torch.Tensor:
        """lambda per row: float [B] in (0, 1); e_u is each row's own user embedding.

        ``user_emb`` float [B, d]; ``item_table`` float [I, d]; ``users`` int [B]. One history
        sample per distinct user of the batch, shared by that user's rows; ``backend`` (as
        :func:`pnn_fast.backends.select`) samples it and computes the logits; ``sparse`` as
        :class:`pnn_fast.PNNLoss`'s (no [I]-sized tensor, a sparse gradient of ``item_table``).
        :class:`pnn_fast.PNNLoss` calls :meth:`sample` and :meth:`weights` itself, to gather the
        history with its other rows into one table (one gradient).
        """
        history = self.sample(known, users, backend)
        table = item_table
        if sparse or item_table.shape[0] > history.items.numel():
            # a catalog larger than the history's slots: the history's rows, gathered by a sort (the
            # empty slots hold item 0 and are masked); sized by the slots, so no host read, except
            # with ``sparse``, whose gradient must name each row once
            table, _, (items,), _ = compact_items(item_table, [history.items], sparse=sparse,
                                                  size=None if sparse else history.items.numel())
            history = history._replace(items=items)
        return self.weights(user_emb, table, history, backend)


class AttentionHistory(NamedTuple):
    """One step's histories (:meth:`UserAwareAttention.sample`).

    Attributes: items: int64 [n, L], up to L known items of each of the n positions of the sorted
    users, as rows of a table (item ids, or rows of a compact table once renamed); mask: bool [n, L],
    the filled slots (empty ones hold 0); row_of: int64 [B], each batch row's position in items.
    """
    items: torch.Tensor
    mask: torch.Tensor
    row_of: torch.Tensor
