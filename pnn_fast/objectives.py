"""Training objectives: what the trainer computes for one batch of (user, positive item) pairs.

An objective owns its negative sampling and any state of its own (a learned boundary, a
negative memory), so the trainer stays the same for every method. Objectives register by
name; ``pnn-fast train --loss NAME`` picks one, ``--loss-arg KEY=VALUE`` overrides its
``DEFAULTS``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from .known import KnownPositives
from .losses import DNSLoss, PNNLoss, embedding_bpr
from .models import Recommender

OBJECTIVES: dict[str, type[Objective]] = {}


def register(name: str):
    """Class decorator adding an Objective to :data:`OBJECTIVES` under ``name``."""
    def wrap(cls):
        cls.name = name
        OBJECTIVES[name] = cls
        return cls
    return wrap


class BatchLoss(NamedTuple):
    """An objective's output: the loss and the (user, item) pairs its L2 term covers.

    The L2 term covers each user with its positive and with each of its ``neg_items`` (int [B] or
    [B, K]; None when the term covers the positives only). The flat rows are built only on demand
    (:attr:`reg_users`, :attr:`reg_items`), so a run without L2 never copies them.
    """

    loss: torch.Tensor
    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: torch.Tensor | None = None

    @property
    def reg_users(self) -> torch.Tensor:
        """int [B (1 + K)]: ``users`` once for the positives, then once per negative column."""
        k = 0 if self.neg_items is None else self.neg_items.reshape(self.users.numel(), -1).shape[1]
        return self.users.repeat(k + 1)

    @property
    def reg_items(self) -> torch.Tensor:
        """int [B (1 + K)]: the positives, then the negatives column by column (aligned with :attr:`reg_users`)."""
        if self.neg_items is None:
            return self.pos_items
        return torch.cat([self.pos_items, self.neg_items.reshape(self.users.numel(), -1).T.reshape(-1)])


class Objective(nn.Module):
    """Base class. Subclasses set ``DEFAULTS`` (hyper-parameters with the authors' values)
    and implement :meth:`forward`; their ``nn.Parameter``s are trained with the model's.

    Args:
        known: the training interactions (never sampled as negatives).
        model: the recommender being trained (read for its sizes and layers).
        args: overrides of ``DEFAULTS`` by name; an unknown name is a ValueError.
    """

    name = "objective"
    DEFAULTS: dict[str, Any] = {}

    def __init__(self, known: KnownPositives, model: Recommender, **args):
        super().__init__()
        unknown = sorted(set(args) - set(self.DEFAULTS))
        if unknown:
            raise ValueError(f"loss {self.name!r} has no argument(s) {unknown}; valid: {sorted(self.DEFAULTS)}")
        self.known = known
        self.args = {**self.DEFAULTS, **args}

    def forward(self, model: Recommender, users: torch.Tensor, pos_items: torch.Tensor,
                generator: torch.Generator) -> BatchLoss:
        raise NotImplementedError

    def on_epoch_start(self, model: Recommender, generator: torch.Generator) -> None:
        """Per-epoch work before the first batch (e.g. refreshing a negative memory)."""


@register("bpr")
class BPRObjective(Objective):
    """BPR with one uniformly sampled unknown item per pair."""

    DEFAULTS = {"num_negatives": 1, "backend": "auto"}

    def forward(self, model, users, pos_items, generator):
        user_table, item_table = model.embeddings()
        neg = self.known.sample_unknown(users, int(self.args["num_negatives"]), generator)
        loss = embedding_bpr(user_table, item_table, users, pos_items, neg, backend=self.args["backend"], validate=False)
        return BatchLoss(loss, users, pos_items, neg)


@register("dns")
class DNSObjective(Objective):
    """BPR with the highest-scored of ``candidates`` uniform unknown items (the authors' M = 8),
    or with the hardest of the batch's positives when ``in_batch``."""

    DEFAULTS = {"candidates": 8, "in_batch": False, "backend": "auto"}

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        self.loss_fn = DNSLoss(known, backend=self.args["backend"], validate=False)

    def forward(self, model, users, pos_items, generator):
        user_table, item_table = model.embeddings()
        neg = None if self.args["in_batch"] else self.known.sample_unknown(users, int(self.args["candidates"]), generator)
        loss = self.loss_fn(user_table[users], item_table, users, pos_items, neg)
        return BatchLoss(loss, users, pos_items)


@register("pnn")
class PNNObjective(Objective):
    """The paper's PNN loss (docs/semantics.md); in-batch candidates unless ``in_batch`` is False,
    then ``candidates`` sampled unknown items per row (the authors' code uses 8)."""

    DEFAULTS = {"in_batch": True, "candidates": 8, "alpha": 0.8, "beta": 0.6, "neg_size": "proportional",
                "history_len": 50, "lambda_mode": "attention", "fixed_lambda": 0.5, "use_rank": True,
                "noise_max": 0.1, "uniform_t": 2.0, "backend": "auto"}

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        self.loss_fn = PNNLoss(known, model.dim, alpha=a["alpha"], beta=a["beta"], neg_size=a["neg_size"],
                               history_len=a["history_len"], lambda_mode=a["lambda_mode"],
                               fixed_lambda=a["fixed_lambda"], use_rank=a["use_rank"], noise_max=a["noise_max"],
                               uniform_t=a["uniform_t"], backend=a["backend"], validate=False)

    def forward(self, model, users, pos_items, generator):
        user_table, item_table = model.embeddings()
        neg = None if self.args["in_batch"] else self.known.sample_unknown(users, int(self.args["candidates"]), generator)
        loss = self.loss_fn(user_table[users], item_table, users, pos_items, neg)
        return BatchLoss(loss, users, pos_items)


def build_objective(name: str, known: KnownPositives, model: Recommender, **args) -> Objective:
    """The registered objective ``name`` with ``args`` overriding its defaults."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](known, model, **args)


# registers the paper's competing methods; last, because they subclass Objective
from . import baselines  # noqa: E402,F401
