"""The Objective interface and its registry: what the trainer computes for one batch of
(user, positive item) pairs.

An objective owns its negative sampling and any state of its own (a learned boundary, a
negative memory), so the trainer stays the same for every method. Objectives register by
name with :func:`register`; ``pnn-fast train --loss NAME`` picks one, ``--loss-arg KEY=VALUE``
overrides its ``DEFAULTS``.
"""
from __future__ import annotations

import contextlib
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import backends
from ..backends.rows import gather_rows
from ..compact import compact_items
from ..known import KnownPositives
from ..losses import loss_defaults
from ..models import Recommender

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
    users and positives only). ``l2_included``: the objective has already added that term, with
    the weight the trainer passed, to ``loss`` (fused into its own op), so the trainer must not
    add it again.
    """

    loss: torch.Tensor
    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: torch.Tensor | None = None
    l2_included: bool = False


def embedding_l2(model: Recommender, users: torch.Tensor, pos_items: torch.Tensor,
                 neg_items: torch.Tensor | None = None, backend: str = "auto", sparse: bool = False) -> torch.Tensor:
    """RecBole's EmbLoss (``require_pow=False``) of a BPR-style batch: the sum of the Frobenius
    norms of the gathered layer-0 matrices ``U[users]``, ``I[pos_items]`` and ``I[neg_items]``
    (each matrix its own norm, as RecBole's ``reg_loss(u, pos, neg)``), divided by B = ``users.numel()``.
    ``sparse``: the tables' gradients are sparse COO tensors of the rows named (:mod:`pnn_fast.compact`)."""
    impl = backends.select(backend, model.user_embedding.weight.device)
    user_table, item_table = model.user_embedding.weight, model.item_embedding.weight
    if sparse:
        user_table, _, (users,), _ = compact_items(user_table, [users], sparse=True)
        ids = [pos_items] + ([] if neg_items is None else [neg_items])
        item_table, _, renamed, _ = compact_items(item_table, ids, sparse=True)
        pos_items, neg_items = renamed[0], None if neg_items is None else renamed[1]
    total = impl.gathered_norm(user_table, users) + impl.gathered_norm(item_table, pos_items)
    if neg_items is not None:
        total = total + impl.gathered_norm(item_table, neg_items.reshape(-1))
    return total / users.numel()


def module_defaults(loss) -> dict:
    """A loss module's (or function's) defaults as an objective's ``DEFAULTS``: all but the trainer's
    own (``validate``, ``sparse``, ``reg_weight``), so that each default is written once."""
    return {k: v for k, v in loss_defaults(loss).items() if k not in ("validate", "sparse", "reg_weight")}


def _declared_kind(default, value) -> str | None:
    """What ``value`` must be to stand for an argument whose default is ``default``, when it is not
    that (None: it is, or the default declares no kind: a bool, an int or a float does). A bool default takes only True or False: a
    word such as "no" from ``--loss-arg in_batch=no`` would otherwise count as true."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "an int"
    if isinstance(default, float):
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    return None  # a word (a choice, or a word or a number, as neg_size) or None: the loss checks it


class Objective(nn.Module):
    """Base class. Subclasses set ``DEFAULTS`` (hyper-parameters with the authors' values)
    and implement :meth:`forward`; their ``nn.Parameter``s are trained with the model's.

    Args:
        known: the training interactions (never sampled as negatives).
        model: the recommender being trained (read for its sizes and layers).
        sparse: the step's table gradients are sparse COO tensors of the rows it read (the
            losses' ``sparse=True``), for a row-sparse optimiser; only objectives that set
            ``SPARSE`` have that path, and only a model whose tables are leaves (MF).
        args: overrides of ``DEFAULTS`` by name; an unknown name is a ValueError.

    The L2 term belongs to the trainer, which passes its weight to :meth:`forward` as
    ``reg_weight``: an objective that can fuse the term into its own op adds it and says so
    (``BatchLoss.l2_included``); the others ignore the argument and the trainer adds the term.
    """

    name = "objective"
    DEFAULTS: dict[str, Any] = {}
    #: whether the objective has a ``sparse=True`` path
    SPARSE: ClassVar[bool] = False

    def __init__(self, known: KnownPositives, model: Recommender, *, sparse: bool = False, **args):
        super().__init__()
        unknown = sorted(set(args) - set(self.DEFAULTS))
        if unknown:
            raise ValueError(f"loss {self.name!r} has no argument(s) {unknown}; valid: {sorted(self.DEFAULTS)}")
        for key, value in args.items():
            expected = _declared_kind(self.DEFAULTS[key], value)
            if expected:
                raise ValueError(f"loss {self.name!r}: {key} must be {expected}, got {value!r}")
        if sparse and not self.SPARSE:
            have = sorted(name for name, cls in OBJECTIVES.items() if cls.SPARSE)
            raise ValueError(f"--sparse: loss {self.name!r} has no sparse path; these do: {', '.join(have)}")
        self.known = known
        self.sparse = bool(sparse)
        self.args = {**self.DEFAULTS, **args}

    @contextlib.contextmanager
    def naming_the_loss(self):
        """A bad argument's one-line error, prefixed with the loss it was given to (as ``--loss-arg``)."""
        try:
            yield
        except (TypeError, ValueError) as err:
            raise type(err)(f"loss {self.name!r}: {err}") from None

    def user_rows(self, user_table: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
        """user_table[users] [B, d]; its gradient is sparse with ``sparse``, else ``gather_rows``'."""
        if self.sparse:
            return F.embedding(users, user_table, sparse=True)
        return gather_rows(user_table, users)

    def forward(self, model: Recommender, users: torch.Tensor, pos_items: torch.Tensor,
                generator: torch.Generator, reg_weight: float = 0.0) -> BatchLoss:
        """The loss of a batch: ``users``, ``pos_items`` int [B]; ``generator`` the trainer's random
        stream; ``reg_weight`` the trainer's L2 weight, which the objective may fuse (see above)."""
        raise NotImplementedError

    def nonfinite_terms(self, model: Recommender, users: torch.Tensor, pos_items: torch.Tensor,
                        generator: torch.Generator) -> list:
        """The names of the loss's terms that are not finite on this batch, for the trainer's
        divergence report; objectives whose loss is one term return []."""
        return []

    def on_epoch_start(self, model: Recommender, generator: torch.Generator, epoch: int) -> None:
        """Per-epoch work before the first batch of epoch ``epoch`` (0-based; e.g. refreshing a
        negative memory, or a schedule's switch)."""

    def learning_rate_factor(self, epoch: int) -> float:
        """The run's learning rate is multiplied by this in epoch ``epoch`` (0-based); where it differs
        from the previous epoch's, the trainer restarts Adam's moments, as a new optimizer would.
        A function of the epoch alone, so that a resumed run follows the same schedule."""
        return 1.0

    def after_step(self, model: Recommender) -> None:
        """Work after each optimiser step, with the updated model (e.g. SL@K's quantile refresh)."""
