"""SL's published successors as drop-in modules: BSL, PSL and SL@K.

Each is :class:`~pnn_fast.losses.SampledSoftmaxLoss`'s machinery (the same checks, draws, shared
pool, sparse gather and cosines, :class:`~pnn_fast.losses.SampledCosineLoss`) with its own row
loss. With s the cosine of the user with an item, p the row's positive and j its negatives:

- BSL (Wu et al., ICDE 2024): ``-log mean_{the user's rows} exp(s_p / tau) + w log mean_j exp(s_j / tau)``;
- PSL (Yang et al., NeurIPS 2024): ``log sum_j exp( sigma((s_j - s_p) / tau) / tau_star )``, with
  sigma a surrogate of the step function (``log(1 + tanh x)`` by default);
- SL@K (Yang et al., KDD 2025): ``sigmoid((s_p - beta_u) / tau_w)`` times SL's row term, with
  beta_u an estimate of the user's top-k score, refreshed every few epochs.

Sources, defaults and departures: docs/baselines/bsl.md, psl.md and slatk.md.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np
import torch

from . import backends
from ._checks import (check_bool, check_embedding, check_id_tensor, check_int, check_real, check_same, check_values,
                      ids_in_range, require_tensor)
from .compact import sorted_runs
from .distributed import gather_values
from .known import KnownPositives
from .losses import CosineScores, SampledCosineLoss, softmax_row_losses


def _where_has_negative(scores: CosineScores, row: torch.Tensor) -> torch.Tensor:
    """``row`` where the row has a negative left; 0 for a row whose pool draws are all its known items
    (nothing to rank the positive against)."""
    if scores.excluded is None:
        return row
    return torch.where(scores.excluded.all(dim=1), torch.zeros_like(row), row)


def _user_groups(users: torch.Tensor) -> torch.Tensor:
    """int64 [B]: for each row, a group number shared by exactly the rows of the same user (numbers in
    [0, B), without reading anything back: a sort and its runs)."""
    runs = sorted_runs(users)
    group = torch.empty_like(runs.order)
    group[runs.order] = torch.cumsum(runs.first.to(torch.int64), 0) - 1
    return group


def _grouped_log_mean_exp(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """float [B]: for each row, log mean exp(values) over the rows of its group (``_user_groups``)."""
    size = values.shape[0]
    top = torch.full((size,), float("-inf"), dtype=values.dtype, device=values.device)
    top = top.scatter_reduce(0, group, values.detach(), reduce="amax", include_self=True)
    shifted = torch.exp(values - top.index_select(0, group))
    total = torch.zeros_like(top).index_add(0, group, shifted)
    count = torch.zeros_like(top).index_add(0, group, torch.ones_like(values))
    return (torch.log(total / count) + top).index_select(0, group)


class BilateralSoftmaxLoss(SampledCosineLoss):
    """BSL, bilateral softmax (Wu et al., "BSL: Understanding and Improving Softmax Loss for
    Recommendation", ICDE 2024): SL's log-expectation-exp over the negatives applied to the positives
    too, so that noisy positives weigh less, as the authors' code computes it (junkangwu/BSL,
    ``utils/losses.py``, mode ``multi``, that of its MF runs). A row b of user u has the loss::

        -log mean_{rows b' of u in the batch} exp(s_b'p / tau) + w * log mean_j exp(s_bj / tau)

    over cosines s: the positive side pools the batch's positives of the row's user (a user with one
    row: its own positive), w weighs the negative side. docs/baselines/bsl.md.

    Args:
        known: each user's training items (:class:`KnownPositives`); the draws come from the others.
        num_negatives: draws per row (the BSL repository's MF runs: 800).
        temperature: tau > 0, on both sides (the authors' MF runs: 0.08 to 0.17).
        negative_weight: w > 0, the negative side's exponent (the authors' ``temperature2``; their MF
            runs: 1.06 to 1.22). With w = 1 and one row a user, BSL is SL without the positive in
            its denominator (less log K).
        shared_negatives, in_batch_negatives, logq, backend, validate, sparse: as
            :class:`~pnn_fast.SampledSoftmaxLoss`.

    forward: as :class:`~pnn_fast.SampledSoftmaxLoss` (the mean of the rows' losses).
    """

    OWN_ARGUMENTS = ("temperature", "negative_weight")

    def __init__(self, known: KnownPositives, *, num_negatives: int = 800, temperature: float = 0.1,
                 negative_weight: float = 1.1, shared_negatives: bool = False, in_batch_negatives: bool = False,
                 logq: bool = False, backend: str = "auto",
                 validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__(known, num_negatives, shared_negatives, in_batch_negatives, logq, backend, validate, sparse)
        self.temperature = check_real("temperature", temperature, low_open=True)
        self.negative_weight = check_real("negative_weight", negative_weight, low_open=True)


    def row_losses(self, users: torch.Tensor, scores: CosineScores) -> torch.Tensor:
        tau = self.temperature
        positive = _grouped_log_mean_exp(scores.positive / tau, _user_groups(users))
        # a mean over the row's negatives: its log-sum-exp less the log of how many it has
        if scores.excluded is None:
            negatives = torch.full_like(scores.positive, float(scores.negative.shape[1]))
        else:
            negatives = (~scores.excluded).sum(dim=1).to(scores.positive.dtype).clamp_min(1)
        negative = scores.logsumexp_over_negatives(scores.negative, 1 / tau) - torch.log(negatives)
        return _where_has_negative(scores, self.negative_weight * negative - positive)


#: PSL's surrogates sigma of the step function (the authors' names)
PSL_ACTIVATIONS = ("tanh", "atan", "relu")


class PairwiseSoftmaxLoss(SampledCosineLoss):
    """PSL, pairwise softmax (Yang et al., "PSL: Rethinking and Improving Softmax Loss from Pairwise
    Perspective for Recommendation", NeurIPS 2024): SL's exponential of each score gap replaced by a
    surrogate activation. A row's loss is ``log sum_j exp( sigma(d_j) / tau_star )`` with
    ``d_j = (s_j - s_p) / tau`` over cosines s (the softmax-like form, the authors' ``method 1``).
    docs/baselines/psl.md.

    Args:
        known, num_negatives (Tiny-Snow/IR-Benchmark's 1000), shared_negatives, in_batch_negatives, logq,
            backend, validate, sparse: as :class:`~pnn_fast.SampledSoftmaxLoss`.
        temperature: tau, which scales the scores: the surrogates hold for gaps in [-1, 1], so the
            authors take tau >= 2 (their default 2); "atan" and "relu" need it.
        robust_temperature: tau_star > 0; near a gap of 0 every surrogate has slope 1, so PSL there
            acts as SL at temperature ``tau * tau_star`` (0.05 with tau = 2: SL's 0.1).
        activation: sigma: "tanh" (the authors' default, ``log(1 + tanh x)``), "atan"
            (``log(1 + arctan x)``) or "relu" (``log(relu(x + 1))``).
    """

    OWN_ARGUMENTS = ("temperature", "robust_temperature", "activation")

    def __init__(self, known: KnownPositives, *, num_negatives: int = 1000, temperature: float = 2.0,
                 robust_temperature: float = 0.05, activation: str = "tanh", shared_negatives: bool = False,
                 in_batch_negatives: bool = False, logq: bool = False, backend: str = "auto",
                 validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__(known, num_negatives, shared_negatives, in_batch_negatives, logq, backend, validate, sparse)
        self.temperature = check_real("temperature", temperature, low_open=True)
        self.robust_temperature = check_real("robust_temperature", robust_temperature, low_open=True)
        if activation not in PSL_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(PSL_ACTIVATIONS)}, got {activation!r}")
        if activation != "tanh" and self.temperature < 2:
            # below 2 a gap can fall under -1, where log(1 + arctan x) and log(relu(x + 1)) are undefined
            raise ValueError(f"activation={activation!r} needs temperature >= 2 (gaps of cosines within [-1, 1]), "
                             f"got {temperature!r}")
        self.activation = activation


    def row_losses(self, users: torch.Tensor, scores: CosineScores) -> torch.Tensor:
        tau, tau_star = self.temperature, self.robust_temperature
        lead = scores.positive[:, None] - scores.negative  # s_p - s_j = -tau * d_uj, [B, K]
        if self.activation == "tanh":
            # log(1 + tanh d) = log 2 - softplus(-2d), and softplus(-2d) = (2 / tau) * softplus_beta(lead) with
            # beta = 2 / tau: one fused pass over [B, K], finite everywhere, and the constant log 2 / tau_star
            # taken out of the log-sum-exp
            logits = torch.nn.functional.softplus(lead, beta=2.0 / tau) * (-2.0 / (tau * tau_star))
            row = scores.logsumexp_over_negatives(logits) + math.log(2.0) / tau_star
        else:
            gaps = lead / -tau  # within [-1, 1] for tau >= 2, where both logarithms are defined
            surrogate = torch.log1p(torch.atan(gaps)) if self.activation == "atan" else torch.log(torch.relu(gaps + 1.0))
            row = scores.logsumexp_over_negatives(surrogate / tau_star)
        return _where_has_negative(scores, row)


class SoftmaxLossAtK(SampledCosineLoss):
    """SL@K (Yang et al., "Breaking the Top-K Barrier: Advancing Top-K Ranking Metrics Optimization in
    Recommender Systems", KDD 2025): SL's row term weighted by how far the positive sits above the
    user's top-k score. A row's loss is ``sigmoid((s_p - beta_u) / tau_w) * SL(u, p)`` over cosines
    s, with SL's term at ``temperature`` (:func:`pnn_fast.losses.softmax_row_losses`) and the gradient
    flowing through the weight too, as in the authors' code (Tiny-Snow/IR-Benchmark-SLatK).

    beta_u, the buffer ``quantile`` [num_users] (0 at first, as the authors'), is set by
    :meth:`refresh_quantile`: the k-th highest cosine of the user among its first
    ``positive_cap`` known items and a call's draws. The authors refresh it after every step of
    every ``quantile_every``-th epoch; :class:`pnn_fast.objectives.slatk.SLatKObjective` does that
    in the trainer, with the optional SL warm-up. ``weighted`` False makes the loss plain SL (the
    warm-up). docs/baselines/slatk.md.

    Args:
        known, num_negatives (the authors' 1000), shared_negatives, in_batch_negatives, logq, backend,
            validate, sparse: as :class:`~pnn_fast.SampledSoftmaxLoss`.
        k: the K of NDCG@K the loss aims at (the authors' 20); at most ``num_negatives``.
        temperature: SL's tau (the authors take SL's best: 0.1 here, as SL's default).
        weight_temperature: tau_w > 0 of the weight's sigmoid (the authors' default 1; they search 0.5 to 3).
        weight_gradient: True (the authors' code) lets the gradient flow through the weight as well;
            False holds the weight constant in it (detached), so a row's gradient is its weight times
            SL's and no step lowers a positive's score to shrink its own weight.
    """

    OWN_ARGUMENTS = ("k", "temperature", "weight_temperature", "weight_gradient", "positive_cap", "weighted")

    def __init__(self, known: KnownPositives, *, k: int = 20, num_negatives: int = 1000, temperature: float = 0.1,
                 weight_temperature: float = 1.0, weight_gradient: bool = True, shared_negatives: bool = False,
                 in_batch_negatives: bool = False, logq: bool = False, backend: str = "auto",
                 validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__(known, num_negatives, shared_negatives, in_batch_negatives, logq, backend, validate, sparse)
        self.k = check_int("k", k, 1)
        if self.k > self.num_negatives:
            raise ValueError(f"k must be at most num_negatives={self.num_negatives} (the quantile's draws), got {k!r}")
        self.temperature = check_real("temperature", temperature, low_open=True)
        self.weight_temperature = check_real("weight_temperature", weight_temperature, low_open=True)
        self.weight_gradient = check_bool("weight_gradient", weight_gradient)
        self.weighted = True
        counts = (known.indptr[1:] - known.indptr[:-1]).cpu().numpy()
        # the authors score each user's first known items up to the 90th percentile of the counts (numpy's,
        # as theirs: torch.quantile refuses more than 2^24 users)
        self.positive_cap = int(np.percentile(counts, 90)) if counts.size else 0
        self.register_buffer("quantile", torch.zeros(known.num_users))


    def row_losses(self, users: torch.Tensor, scores: CosineScores) -> torch.Tensor:
        softmax = softmax_row_losses(scores, self.temperature)
        if not self.weighted:
            return softmax
        beta = self.quantile.to(scores.positive.dtype).index_select(0, users)
        weight = torch.sigmoid((scores.positive - beta) / self.weight_temperature)
        return (weight if self.weight_gradient else weight.detach()) * softmax

    @torch.no_grad()
    def refresh_quantile(self, user_rows: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                         neg_items: torch.Tensor) -> None:
        """Set ``quantile[u]`` of the rows' users to the k-th highest cosine of the user among its first
        ``positive_cap`` known items (by id) and the row's draws (the authors' estimate by sorting).

        Args:
            user_rows: float [B, d]; item_table: float [I, d] (neither normalised); users: int [B];
            neg_items: int [B, K] or a pool int [M] (its known items left out per row), the draws of
                the step just taken. A user on several rows keeps the highest of their estimates.
            Under torchrun every rank applies every rank's estimates, so the replicas stay equal.
        """
        users, neg_items = self._check_refresh(user_rows, item_table, users, neg_items)
        impl = backends.select(self.backend, user_rows.device)
        known = self.known.to(user_rows.device)
        user_unit, item_unit = impl.unit_rows(user_rows), impl.unit_rows(item_table)
        if neg_items.dim() == 1:
            drawn = user_unit @ item_unit.index_select(0, neg_items).T
            drawn = drawn.masked_fill(impl.rows_contain(known, users, neg_items.expand(users.numel(), -1)),
                                      float("-inf"))
        else:
            drawn = impl.gathered_dots(user_unit, item_unit, neg_items)
        parts = [drawn]
        if self.positive_cap and known.indices.numel():
            offsets = torch.arange(self.positive_cap, device=users.device)
            starts = known.indptr.index_select(0, users)
            position = (starts[:, None] + offsets).clamp_max(known.indices.numel() - 1)
            own = impl.gathered_dots(user_unit, item_unit, known.indices[position])
            parts.insert(0, own.masked_fill(offsets >= known.count(users)[:, None], float("-inf")))
        kth = torch.cat(parts, dim=1).topk(self.k, dim=1).values[:, -1]
        users, kth = gather_values(users), gather_values(kth.to(self.quantile.dtype))
        self.quantile.scatter_reduce_(0, users, kth, reduce="amax", include_self=False)

    def _check_refresh(self, user_rows, item_table, users, neg_items) -> tuple:
        """:meth:`refresh_quantile`'s inputs checked as a call's (by ``validate``); (users, neg_items)."""
        require_tensor("user_rows", user_rows)
        check_embedding("user_rows", user_rows, rows=None, dim=user_rows.shape[-1] if user_rows.dim() == 2 else -1)
        check_embedding("item_table", item_table, rows=None, dim=user_rows.shape[1])
        check_same("user_rows", user_rows, [("item_table", item_table)], dtype=True)
        check_id_tensor("users", users, (user_rows.shape[0],))
        check_id_tensor("neg_items", neg_items, None)
        if neg_items.dim() not in (1, 2) or (neg_items.dim() == 2 and neg_items.shape[0] != users.numel()):
            raise ValueError(f"neg_items must have shape [B={users.numel()}, K] or [M] (a shared pool), "
                             f"got {list(neg_items.shape)}")
        if neg_items.shape[-1] < self.k:
            raise ValueError(f"the quantile is the k-th highest of the draws and known items: k={self.k} needs at "
                             f"least k draws, got {neg_items.shape[-1]}")
        check_same("user_rows", user_rows, [("users", users), ("neg_items", neg_items)], dtype=False)
        ids = [("users", users, self.known.num_users), ("neg_items", neg_items, item_table.shape[0])]
        if self.validate == "eager":
            check_values(ids, [])
        elif self.validate == "deferred":
            return tuple(ids_in_range(x, size, "SoftmaxLossAtK.refresh_quantile", name) for name, x, size in ids)
        return users, neg_items
