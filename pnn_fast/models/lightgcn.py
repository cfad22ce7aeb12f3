"""LightGCN as in RecBole v1.1.1 (``recbole/model/general_recommender/lightgcn.py``).

Layer 0 is the concatenated table ``E0 = [user_embedding; item_embedding]``
[U+I, d]; layer ``l`` is ``E_l = A_hat @ E_{l-1}`` with the normalised
adjacency of :mod:`.graph`; the final tables are the mean of ``E_0 .. E_L``
split back into users and items.  No weights besides the two tables, no
non-linearity.  Defaults from ``recbole/properties/model/LightGCN.yaml``:
``embedding_size 64``, ``n_layers 2``, ``reg_weight 1e-5``; initialisation
``xavier_uniform_`` on both tables.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .base import Recommender
from .graph import NormalizedAdjacency, layer_mean


class LightGCN(Recommender):
    """Linear propagation over the training graph; output width ``dim`` = embedding size."""

    DEFAULTS: ClassVar[dict] = {"n_layers": 2}

    def __init__(self, num_users: int, num_items: int, train_users: torch.Tensor, train_items: torch.Tensor,
                 dim: int = 64, n_layers: int = 2):
        super().__init__(num_users, num_items, dim)
        if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 0:
            raise ValueError(f"n_layers must be a non-negative int, got {n_layers!r}")
        self.n_layers = n_layers
        self.adjacency = NormalizedAdjacency(train_users, train_items, num_users, num_items)
        nn.init.xavier_uniform_(self.user_embedding.weight)
        nn.init.xavier_uniform_(self.item_embedding.weight)

    def _ego(self) -> torch.Tensor:
        return torch.cat([self.user_embedding.weight, self.item_embedding.weight])

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(user [U, dim], item [I, dim]) float32: mean over layers 0..n_layers."""
        final = layer_mean(self.adjacency.csr(), self._ego(), self.n_layers)
        return final[: self.num_users], final[self.num_users:]

    def layer_embeddings(self) -> list[torch.Tensor]:
        """``[E_0, E_1, ..., E_L]``, each [U+I, dim] float32 (users first), differentiable.

        The layers :meth:`embeddings` averages (summed in this order, then divided by
        ``n_layers + 1``); for objectives that work per layer, such as MixGCF's hop mixing.
        Always over the training graph (SGL's augmented views are not used here either).
        """
        layers = [self._ego()]
        for _ in range(self.n_layers):
            layers.append(self.adjacency(layers[-1]))
        return layers
