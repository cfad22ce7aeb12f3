"""Recommenders of the PNN paper's experiments (RecBole v1.1.1 MF/BPR, LightGCN, NGCF, SGL).

All four share :class:`Recommender`: ``embeddings()`` gives the user and item
tables, scores are their dot products.  Graph models propagate over the
sparse normalised adjacency of :mod:`.graph` only.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import Recommender
from .graph import NormalizedAdjacency, sparse_matmul, unique_edges
from .lightgcn import LightGCN
from .mf import MF
from .ngcf import NGCF
from .sgl import SGL

MODELS: dict[str, type[Recommender]] = {"mf": MF, "lightgcn": LightGCN, "ngcf": NGCF, "sgl": SGL}


def build_model(name: str, num_users: int, num_items: int, train_users: torch.Tensor, train_items: torch.Tensor,
                *, dim: int = 64, **overrides: Any) -> Recommender:
    """A freshly initialised recommender with RecBole's default hyper-parameters.

    Args:
        name: one of ``"mf"``, ``"lightgcn"``, ``"ngcf"``, ``"sgl"`` (case-insensitive).
        num_users, num_items: id-space sizes.
        train_users, train_items: int tensors [n], the training pairs that form the graph
            (ignored by MF); the graph is built on their device.
        dim: layer-0 embedding size (RecBole's ``embedding_size``).
        overrides: hyper-parameters by RecBole's yaml name, see ``MODELS[name].DEFAULTS``
            (``n_layers``, ``hidden_size_list``, ``node_dropout``, ``message_dropout``, ``type``,
            ``drop_ratio``, ``ssl_tau``, ``ssl_weight``). The L2 weight is the trainer's
            (``TrainConfig.reg_weight``, ``--reg-weight``), not a model's.
    Raises:
        ValueError: unknown ``name`` (message lists the choices), an override the model does
            not have (message names it), or a bad value.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    cls = MODELS[key]
    unknown = sorted(set(overrides) - set(cls.DEFAULTS))
    if unknown:
        hint = "; the L2 weight is the trainer's --reg-weight" if "reg_weight" in unknown else ""
        raise ValueError(f"model {key!r} has no hyper-parameter(s) {unknown}; valid: {sorted(cls.DEFAULTS)}{hint}")
    params = {**cls.DEFAULTS, **overrides}
    if cls is MF:
        return MF(num_users, num_items, dim=dim, **params)
    return cls(num_users, num_items, train_users, train_items, dim=dim, **params)


__all__ = ["MF", "MODELS", "NGCF", "SGL", "LightGCN", "NormalizedAdjacency", "Recommender", "build_model",
           "sparse_matmul", "unique_edges"]
