"""NGCF as in RecBole v1.1.1 (``recbole/model/general_recommender/ngcf.py``, ``BiGNNLayer`` in
``recbole/model/layers.py``).

Each layer ``l`` maps ``E`` [N, d_in] to [N, d_out]:

    X = A_hat @ E
    E' = normalize_rows(dropout(leaky_relu(W1 (E + X) + b1 + W2 (X * E) + b2, 0.2), message_dropout))

(``E + X`` is RecBole's ``(L + I) E``).  The final tables concatenate all
layers, ``[E_0 | E_1 | ... | E_L]``, so ``dim = embedding_size + sum(hidden_size_list)``
(256 with the defaults).  Defaults from ``recbole/properties/model/NGCF.yaml``:
``embedding_size 64``, ``hidden_size_list [64, 64, 64]``, ``node_dropout 0.0``,
``message_dropout 0.1``, ``reg_weight 1e-5``; initialisation ``xavier_normal_``
on the tables and the linear weights, zero biases.

Two deliberate differences from RecBole: dropout acts only in training mode
(RecBole builds a fresh ``nn.Dropout`` inside ``forward``, which is always in
training mode, so its message dropout also perturbs evaluation), and RecBole
regularises the propagated rows whereas :meth:`ego_embeddings` returns layer-0
rows, the common interface's choice.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .base import Recommender
from .graph import NormalizedAdjacency, sparse_matmul


class BiInteractionLayer(nn.Module):
    """One NGCF propagation layer before activation: ``W1 (E + A E) + W2 ((A E) * E)`` (with biases)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.interaction = nn.Linear(in_dim, out_dim)

    def forward(self, propagated: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """propagated = A_hat @ features, both [N, in_dim] -> [N, out_dim]."""
        return self.linear(features + propagated) + self.interaction(propagated * features)


class NGCF(Recommender):
    """Bi-interaction graph convolutions with concatenated layer outputs."""

    DEFAULTS: ClassVar[dict] = {"hidden_size_list": (64, 64, 64), "node_dropout": 0.0, "message_dropout": 0.1}

    def __init__(self, num_users: int, num_items: int, train_users: torch.Tensor, train_items: torch.Tensor,
                 dim: int = 64, hidden_size_list: Sequence[int] = (64, 64, 64), node_dropout: float = 0.0,
                 message_dropout: float = 0.1):
        super().__init__(num_users, num_items, dim)
        sizes = list(hidden_size_list)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"hidden_size_list must be positive ints, got {hidden_size_list!r}")
        for name, rate in (("node_dropout", node_dropout), ("message_dropout", message_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {rate!r}")
        self.hidden_size_list = sizes
        self.node_dropout = float(node_dropout)
        self.message_dropout = float(message_dropout)
        self.dim = dim + sum(sizes)
        self.adjacency = NormalizedAdjacency(train_users, train_items, num_users, num_items)
        widths = [dim] + sizes
        self.layers = nn.ModuleList(BiInteractionLayer(a, b) for a, b in pairwise(widths))
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Embedding, nn.Linear)):
                nn.init.xavier_normal_(module.weight)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(user [U, dim], item [I, dim]) float32, ``dim = embedding_size + sum(hidden_size_list)``."""
        if self.training and self.node_dropout > 0:
            adj, adj_t = self.adjacency.dropout_entries(self.node_dropout)

            def propagate(x: torch.Tensor) -> torch.Tensor:
                return sparse_matmul(adj, x, adj_t)
        else:
            propagate = self.adjacency
        layer = torch.cat([self.user_embedding.weight, self.item_embedding.weight])
        outputs = [layer]
        for gnn in self.layers:
            layer = F.leaky_relu(gnn(propagate(layer), layer), negative_slope=0.2)
            layer = F.dropout(layer, self.message_dropout, training=self.training)
            layer = F.normalize(layer, p=2, dim=1)
            outputs.append(layer)
        final = torch.cat(outputs, dim=1)
        return final[: self.num_users], final[self.num_users:]
