"""BPR: one uniformly sampled unknown item per pair."""
from __future__ import annotations

from ..losses import embedding_bpr
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, module_defaults, register


@register("bpr")
class BPRObjective(Objective):
    """BPR with one uniformly sampled unknown item per pair."""

    DEFAULTS = {"num_negatives": 1, **module_defaults(embedding_bpr)}
    SPARSE = True

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = sample_unknown(self.known, users, int(self.args["num_negatives"]), generator)
        # the L2 term rides along in the BPR op when the scored tables are the layer-0 ones it covers (MF)
        fused_l2 = user_table is model.user_embedding.weight and item_table is model.item_embedding.weight
        loss = embedding_bpr(user_table, item_table, users, pos_items, neg,
                             reg_weight=reg_weight if fused_l2 else 0.0, backend=self.args["backend"],
                             validate=False, sparse=self.sparse)
        return BatchLoss(loss, users, pos_items, neg, l2_included=fused_l2)
