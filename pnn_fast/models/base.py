"""The interface every recommender offers to the trainer and the losses."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


class Recommender(nn.Module):
    """A user/item embedding model scored by dot products ``user_table[u] @ item_table.T``.

    Attributes:
        num_users, num_items: id-space sizes.
        dim: width of the tables :meth:`embeddings` returns (NGCF concatenates its layers,
            so there it exceeds the layer-0 ``embedding_size``).
        embedding_size: width of the layer-0 tables ``user_embedding`` / ``item_embedding``.
        user_embedding, item_embedding: ``nn.Embedding`` [num_users | num_items, embedding_size].
    """

    #: RecBole yaml defaults a subclass accepts as ``build_model`` overrides.
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    #: whether :meth:`auxiliary_loss` adds anything (the trainer skips the call otherwise)
    has_auxiliary_loss: ClassVar[bool] = False

    def __init__(self, num_users: int, num_items: int, embedding_size: int):
        super().__init__()
        for name, value in (("num_users", num_users), ("num_items", num_items), ("dim", embedding_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_users = num_users
        self.num_items = num_items
        self.embedding_size = embedding_size
        self.dim = embedding_size
        self.user_embedding = nn.Embedding(num_users, embedding_size)
        self.item_embedding = nn.Embedding(num_items, embedding_size)

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(user_table [U, dim], item_table [I, dim]) float32 after propagation; differentiable."""
        raise NotImplementedError

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embeddings()

    def ego_embeddings(self, users: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-0 rows for RecBole's EmbLoss: (user rows [*users.shape, embedding_size],
        item rows [*items.shape, embedding_size])."""
        return self.user_embedding(users), self.item_embedding(items)

    def auxiliary_loss(self, users: torch.Tensor, pos_items: torch.Tensor) -> torch.Tensor:
        """Model-specific extra loss of a batch (already weighted); a float32 scalar, 0 here."""
        return self.user_embedding.weight.new_zeros(())

    def on_epoch_start(self, generator: torch.Generator | None = None) -> None:
        """Hook run by the trainer before each training epoch; nothing to do here."""

    def extra_repr(self) -> str:
        return f"num_users={self.num_users}, num_items={self.num_items}, dim={self.dim}"
