"""Training objectives, one per file, registered by name: the classic losses (bpr, dns), the
paper's pnn and the authors' code's pnn-authors, the sampled softmax sl and its successors (bsl, psl,
slatk), and the paper's competing methods (ans, mixgcf, simplex, srns, uib).

Importing this package imports every objective module, and each registers itself in
:data:`OBJECTIVES` with :func:`~pnn_fast.objectives.base.register`, so a new method is one new
file plus one line below.
"""
from __future__ import annotations

from ..known import KnownPositives
from ..models import Recommender
from . import ans, bpr, bsl, dns, mixgcf, pnn, pnn_authors, psl, simplex, sl, slatk, srns, uib  # noqa: F401  (each registers itself)
from .base import OBJECTIVES, BatchLoss, Objective, embedding_l2, register


def build_objective(name: str, known: KnownPositives, model: Recommender, **args) -> Objective:
    """The registered objective ``name`` with ``args`` overriding its defaults."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](known, model, **args)


__all__ = ["OBJECTIVES", "BatchLoss", "Objective", "build_objective", "embedding_l2", "register"]
