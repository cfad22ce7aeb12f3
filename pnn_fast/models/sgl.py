"""SGL as in RecBole v1.1.1 (``recbole/model/general_recommender/sgl.py``).

The backbone is LightGCN (mean of layers 0..n_layers over the normalised
training graph).  Each epoch two augmented views of the graph are drawn; the
auxiliary loss contrasts a node's representation in view 1 with its
representation in view 2 (InfoNCE, cosine similarity, temperature ``ssl_tau``),
negatives being every user (for the batch's users) or every item (for the
batch's positive items) in view 2:

    ssl = ssl_weight * sum_{b in batch} [ -log softmax_j(cos(z1_b, z2_j) / tau)_{j = b} ]   (users + items)

Summed over the batch rows, not averaged, as RecBole.

Augmentations (``type``), each view renormalised as D^-1/2 A D^-1/2 after dropping:

* ``"ED"`` edge dropout: keep ``int(m * (1 - drop_ratio))`` of the m distinct training pairs.
* ``"ND"`` node dropout: drop ``int(U * drop_ratio)`` users and ``int(I * drop_ratio)`` items
  with all their edges.
* ``"RW"`` random walk: an independent edge-dropout graph per layer.

Defaults from ``recbole/properties/model/SGL.yaml``: ``type ED``, ``n_layers 3``,
``ssl_tau 0.5``, ``reg_weight 1e-5``, ``ssl_weight 0.05``, ``drop_ratio 0.1``,
``embedding_size 64``; initialisation ``xavier_uniform_``.  RecBole redraws the
views in ``model.train()``, i.e. at the start of every training epoch; here
:meth:`on_epoch_start` does it (and the first :meth:`auxiliary_loss` does when
it was never called).  Edges are drawn from the distinct pairs, where RecBole
draws from the raw interaction list (the same when it has no repeats).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .graph import NormalizedAdjacency, unique_edges
from .lightgcn import LightGCN

AUGMENTATIONS = ("ED", "ND", "RW")


class SGL(LightGCN):
    """LightGCN plus a self-supervised contrastive loss between two resampled graph views."""

    DEFAULTS: ClassVar[dict] = {"n_layers": 3, "type": "ED", "drop_ratio": 0.1, "ssl_tau": 0.5, "ssl_weight": 0.05}
    has_auxiliary_loss: ClassVar[bool] = True

    def __init__(self, num_users: int, num_items: int, train_users: torch.Tensor, train_items: torch.Tensor,
                 dim: int = 64, n_layers: int = 3, type: str = "ED", drop_ratio: float = 0.1,
                 ssl_tau: float = 0.5, ssl_weight: float = 0.05):
        super().__init__(num_users, num_items, train_users, train_items, dim=dim, n_layers=n_layers)
        if type not in AUGMENTATIONS:
            raise ValueError(f"type must be one of {AUGMENTATIONS}, got {type!r}")
        if not 0.0 <= drop_ratio < 1.0:
            raise ValueError(f"drop_ratio must lie in [0, 1), got {drop_ratio!r}")
        if not ssl_tau > 0:
            raise ValueError(f"ssl_tau must be > 0, got {ssl_tau!r}")
        self.type = type
        self.drop_ratio = float(drop_ratio)
        self.ssl_tau = float(ssl_tau)
        self.ssl_weight = float(ssl_weight)
        users, items = unique_edges(train_users, train_items, num_users, num_items)
        self.register_buffer("edge_users", users, persistent=False)
        self.register_buffer("edge_items", items, persistent=False)
        # One graph per layer for "RW", a single shared graph otherwise; empty until first drawn.
        self.view1 = nn.ModuleList()
        self.view2 = nn.ModuleList()

    def _survivors(self, count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
        """bool [count] on the edges' device: all True but ``int(count * drop_ratio)`` random entries."""
        kept = torch.ones(count, dtype=torch.bool, device=device)
        kept[torch.randperm(count, generator=generator, device=device)[: int(count * self.drop_ratio)]] = False
        return kept.to(self.edge_users.device)

    def _draw_graph(self, generator: torch.Generator | None) -> NormalizedAdjacency:
        device = generator.device if generator is not None else torch.device("cpu")
        users, items = self.edge_users, self.edge_items
        if self.type == "ND":
            keep = self._survivors(self.num_users, generator, device)[users] & self._survivors(self.num_items, generator, device)[items]
        else:
            m = users.numel()
            keep = torch.randperm(m, generator=generator, device=device)[: int(m * (1 - self.drop_ratio))].to(users.device)
        return NormalizedAdjacency(users[keep], items[keep], self.num_users, self.num_items)

    def _draw_view(self, generator: torch.Generator | None) -> nn.ModuleList:
        count = self.n_layers if self.type == "RW" else 1
        # Match the tables' dtype, as .to(dtype) did for the training graph.
        return nn.ModuleList(self._draw_graph(generator) for _ in range(count)).to(self.user_embedding.weight.dtype)

    def on_epoch_start(self, generator: torch.Generator | None = None) -> None:
        """Redraw both augmented views (with ``generator``, or torch's global RNG when None).

        The random draws run on ``generator.device`` (CPU without a generator); the graphs live
        on the model's device.
        """
        self.view1 = self._draw_view(generator)
        self.view2 = self._draw_view(generator)

    def _view_embeddings(self, view: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        ego = self._ego()
        total, layer = ego, ego
        for depth in range(self.n_layers):
            layer = view[depth if len(view) > 1 else 0](layer)
            total = total + layer
        final = total / (self.n_layers + 1)
        return final[: self.num_users], final[self.num_users:]

    def _info_nce(self, view1: torch.Tensor, view2: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Summed InfoNCE of ``rows`` [B]: positive = the same row in view 2, candidates = all rows of view 2."""
        # 1/tau folded into the [B, d] anchors rather than the [B, N] similarity matrix.
        anchor = F.normalize(view1[rows], dim=1) / self.ssl_tau
        candidates = F.normalize(view2, dim=1)
        positive = (anchor * candidates[rows]).sum(dim=1)
        # logsumexp instead of RecBole's log(exp(.)/sum exp(.)): equal, without overflow.
        return (torch.logsumexp(anchor @ candidates.T, dim=1) - positive).sum()

    def auxiliary_loss(self, users: torch.Tensor, pos_items: torch.Tensor) -> torch.Tensor:
        """``ssl_weight`` * (user InfoNCE + item InfoNCE) of the batch; float32 scalar.

        users, pos_items: int64 [B].  Costs two extra propagations and a [B, U] and a [B, I] product.
        """
        if len(self.view1) == 0:
            self.on_epoch_start()
        user1, item1 = self._view_embeddings(self.view1)
        user2, item2 = self._view_embeddings(self.view2)
        loss = self._info_nce(user1, user2, users) + self._info_nce(item1, item2, pos_items)
        return self.ssl_weight * loss
