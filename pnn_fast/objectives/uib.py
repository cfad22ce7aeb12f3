"""UIB (Zhuo et al., WWW'22): a learned per-user interest boundary b_u.

Each row (u, p) with K uniform unknown items n_1..n_K costs (official ``UmBPRModel.forward``)::

    (1 - alpha) * softplus(b_u - s_up) + alpha * mean_k softplus(s_un_k - b_u)

so positives are pushed above the user's boundary and negatives below it, each against the
boundary rather than against each other (the paper's hybrid of pointwise and pairwise loss).
``b_u`` is a free scalar per user (``boundary="embed"``, an ``nn.Embedding(U, 1)``) or a linear
function of the user embedding (``boundary="linear"``, ``w . e_u + c``). Dropout (the official
``model/drop``) acts on the gathered user / positive / negative rows in training. Details,
defaults and departures: docs/baselines/uib.md.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register
from .simplex import generator_dropout

BOUNDARIES = ("embed", "linear")


def uib_loss(pos_scores: torch.Tensor, neg_scores: torch.Tensor, boundary: torch.Tensor, alpha: float) -> torch.Tensor:
    """mean_b [(1 - alpha) softplus(b - s_p) + alpha mean_k softplus(s_n_k - b)].

    Args: pos_scores [B], neg_scores [B, K], boundary [B].
    """
    pos_term = F.softplus(boundary - pos_scores)
    neg_term = F.softplus(neg_scores - boundary[:, None]).mean(dim=1)
    return ((1.0 - alpha) * pos_term + alpha * neg_term).mean()


@register("uib")
class UIBObjective(Objective):
    """UIB on the model's embeddings with ``num_negatives`` uniform unknown items per row.

    Defaults are the authors' published UmBPR configuration
    (JianhuanZhuo/Code-for-UIB-WWW2022, ``configs/AIV/UmBPR.yaml``).
    """

    DEFAULTS: ClassVar[dict] = {
        "alpha": 0.5,          # model/alpha (configs/AIV/UmBPR.yaml; also the code's default)
        "boundary": "embed",   # model/mode: 'embed' = one learned scalar per user (UmBPR.yaml)
        "dropout": 0.2,        # model/drop on the u/p/n rows (UmBPR.yaml; UmLGN.yaml uses 0)
        "num_negatives": 1,    # dataset/negative_num = 0 -> one uniform unknown item per pair
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        if a["boundary"] not in BOUNDARIES:
            raise ValueError(f"uib: boundary must be one of {BOUNDARIES}, got {a['boundary']!r}")
        if not 0.0 <= float(a["alpha"]) <= 1.0:
            raise ValueError(f"uib: alpha must lie in [0, 1], got {a['alpha']!r}")
        if not 0.0 <= float(a["dropout"]) < 1.0:
            raise ValueError(f"uib: dropout must lie in [0, 1), got {a['dropout']!r}")
        if int(a["num_negatives"]) <= 0:
            raise ValueError("uib: num_negatives must be positive")
        # torch's default initialisations, as in the official code (no custom init there)
        if a["boundary"] == "embed":
            self.boundary = nn.Embedding(known.num_users, 1)
        else:
            self.boundary = nn.Linear(model.dim, 1)

    def user_boundary(self, users: torch.Tensor, user_rows: torch.Tensor) -> torch.Tensor:
        """b_u for each row: float [B] (``user_rows`` are the rows the scores use)."""
        if self.args["boundary"] == "embed":
            return self.boundary(users).squeeze(-1).to(user_rows.dtype)
        return self.boundary(user_rows).squeeze(-1)

    def batch_loss(self, user_table, item_table, users, pos_items, neg_items, generator=None) -> torch.Tensor:
        """The UIB loss of rows (users, pos_items) against ``neg_items [B, K]``."""
        u, p, n = user_table[users], item_table[pos_items], item_table[neg_items]
        if self.training:
            drop = float(self.args["dropout"])
            u, p, n = (generator_dropout(x, drop, generator) for x in (u, p, n))
        pos_scores = (u * p).sum(-1)
        neg_scores = torch.einsum("bd,bkd->bk", u, n)
        return uib_loss(pos_scores, neg_scores, self.user_boundary(users, u), float(self.args["alpha"]))

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = sample_unknown(self.known, users, int(self.args["num_negatives"]), generator)
        loss = self.batch_loss(user_table, item_table, users, pos_items, neg, generator)
        return BatchLoss(loss, users, pos_items, neg)
