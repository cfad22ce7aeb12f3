"""PNN, the paper's method, as a training objective (docs/semantics.md)."""
from __future__ import annotations

from ..backends.rows import gather_rows
from ..losses import PNNLoss
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register


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

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = None if self.args["in_batch"] else sample_unknown(self.known, users, int(self.args["candidates"]), generator)
        loss = self.loss_fn(gather_rows(user_table, users), item_table, users, pos_items, neg)
        return BatchLoss(loss, users, pos_items)
