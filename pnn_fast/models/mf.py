"""Matrix factorisation: RecBole v1.1.1's ``BPR`` model (the paper's MF).

A user and an item embedding table and nothing else; the tables are the
final representations.  Initialisation as RecBole: ``xavier_normal_`` on both
tables (``recbole/model/init.py``).  RecBole's BPR has no L2 term, hence
``reg_weight = 0``.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .base import Recommender


class MF(Recommender):
    """Plain embedding tables [num_users | num_items, dim]."""

    DEFAULTS: ClassVar[dict] = {}

    def __init__(self, num_users: int, num_items: int, dim: int = 64):
        super().__init__(num_users, num_items, dim)
        nn.init.xavier_normal_(self.user_embedding.weight)
        nn.init.xavier_normal_(self.item_embedding.weight)

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw weights (user [U, dim], item [I, dim]), float32."""
        return self.user_embedding.weight, self.item_embedding.weight
