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
from .losses import DNSLoss, PNNLoss, embedding_bpr, resolve_backend
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
    """An objective's output: the loss and the rows its L2 term covers.

    The trainer's L2 term (RecBole's EmbLoss, :func:`embedding_l2`) covers the layer-0 rows of
    ``users``, ``pos_items`` and ``neg_items`` (int [B] or [B, K]; None when the term covers the
    users and positives only). ``l2_included``: the objective has already added that term to
    ``loss`` (fused into its own op), so the trainer must not add it again.
    """

    loss: torch.Tensor
    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: torch.Tensor | None = None
    l2_included: bool = False


def embedding_l2(model: Recommender, users: torch.Tensor, pos_items: torch.Tensor,
                 neg_items: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """RecBole's EmbLoss (``require_pow=False``) of a BPR-style batch: the sum of the Frobenius
    norms of the gathered layer-0 matrices ``U[users]``, ``I[pos_items]`` and ``I[neg_items]``
    (each matrix its own norm, as RecBole's ``reg_loss(u, pos, neg)``), divided by B = ``users.numel()``."""
    impl = resolve_backend(backend, model.user_embedding.weight.device)
    user_table, item_table = model.user_embedding.weight, model.item_embedding.weight
    total = impl.gathered_norm(user_table, users) + impl.gathered_norm(item_table, pos_items)
    if neg_items is not None:
        total = total + impl.gathered_norm(item_table, neg_items.reshape(-1))
    return total / users.numel()


class Objective(nn.Module):
    """Base class. Subclasses set ``DEFAULTS`` (hyper-parameters with the authors' values)
    and implement :meth:`forward`; their ``nn.Parameter``s are trained with the model's.

    Args:
        known: the training interactions (never sampled as negatives).
        model: the recommender being trained (read for its sizes and layers).
        reg_weight: the trainer's L2 weight, for objectives that fuse the L2 term into their own
            op (then their BatchLoss says ``l2_included``); the others leave it to the trainer.
        args: overrides of ``DEFAULTS`` by name; an unknown name is a ValueError.
    """

    name = "objective"
    DEFAULTS: dict[str, Any] = {}

    def __init__(self, known: KnownPositives, model: Recommender, reg_weight: float = 0.0, **args):
        super().__init__()
        unknown = sorted(set(args) - set(self.DEFAULTS))
        if unknown:
            raise ValueError(f"loss {self.name!r} has no argument(s) {unknown}; valid: {sorted(self.DEFAULTS)}")
        self.known = known
        self.reg_weight = float(reg_weight)
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
        # the L2 term rides along in the BPR op when the scored tables are the layer-0 ones it covers (MF)
        fused_l2 = user_table is model.user_embedding.weight and item_table is model.item_embedding.weight
        loss = embedding_bpr(user_table, item_table, users, pos_items, neg,
                             reg_weight=self.reg_weight if fused_l2 else 0.0, backend=self.args["backend"],
                             validate=False)
        return BatchLoss(loss, users, pos_items, neg, l2_included=fused_l2)


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


def build_objective(name: str, known: KnownPositives, model: Recommender, reg_weight: float = 0.0,
                    **args) -> Objective:
    """The registered objective ``name`` with ``args`` overriding its defaults (``reg_weight``: see
    :class:`Objective`)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](known, model, reg_weight=reg_weight, **args)


# registers the paper's competing methods; last, because they subclass Objective
from . import baselines  # noqa: E402,F401
