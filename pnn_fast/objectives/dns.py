"""DNS: BPR against the hardest of M uniformly sampled unknown items."""
from __future__ import annotations

from ..losses import DNSLoss
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, module_defaults, register


@register("dns")
class DNSObjective(Objective):
    """BPR with the highest-scored of ``candidates`` uniform unknown items (the authors' M = 8),
    or with the hardest of the batch's positives when ``in_batch``."""

    DEFAULTS = {"candidates": 8, "in_batch": False, **module_defaults(DNSLoss)}
    SPARSE = True

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        if self.args["candidates"] < 1:
            raise ValueError(f"loss 'dns': candidates must be an int >= 1, got {self.args['candidates']!r}")
        self.loss_fn = DNSLoss(known, backend=self.args["backend"], validate=False, sparse=self.sparse)

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = None if self.args["in_batch"] else sample_unknown(self.known, users, int(self.args["candidates"]), generator)
        loss = self.loss_fn(self.user_rows(user_table, users), item_table, users, pos_items, neg,
                            candidates_unknown=neg is not None)  # drawn from the unknown items
        return BatchLoss(loss, users, pos_items)
