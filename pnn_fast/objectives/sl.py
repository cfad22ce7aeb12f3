"""SL, the sampled softmax loss (Wu et al., "On the Effectiveness of Sampled Softmax Loss for Item
Recommendation", ACM TOIS 2024, arXiv 2201.02327), as a training objective: the trainer's wrapper
of :class:`pnn_fast.SampledSoftmaxLoss` (the drop-in module, same arguments).

For a training pair (user ``u``, positive ``p``) and ``K`` items ``n_1..n_K`` drawn uniformly, with
replacement, from the user's unknown items (:func:`pnn_fast.sampling.sample_unknown`, the sampler of
``bpr`` and ``dns``)::

    s(u, i) = cos(e_u, e_i) / tau
    loss(u, p) = -log( exp s(u, p) / (exp s(u, p) + sum_{j=1..K} exp s(u, n_j)) )
               = logaddexp( s(u, p), logsumexp_j s(u, n_j) ) - s(u, p)

averaged over the batch's rows. The positive sits in the denominator, as in the authors'
TensorFlow code (``wujcan/SSM-TensorFlow``, ``_create_SSM_loss_V2``/``_V3``).

Defaults: ``temperature = 0.1`` (``temp`` in that repository's ``conf/SSM.properties``; its README
tunes 0.1 to 0.22 per dataset) and ``num_negatives = 800`` (the SL baseline runs of the BSL paper's
code, ``junkangwu/BSL`` README: MF on Yelp2018, Gowalla and MovieLens-1M). Sources, per-dataset
values and departures: docs/baselines/sl.md.

Scoring: SL ranks items by cosine, so :meth:`SLObjective.scoring_tables` returns the L2-normalised
tables; a trainer that lets the objective score ranks with them.

Cost (:func:`pnn_fast.losses.sampled_softmax_loss`): scores come from the unit item table and
:func:`gathered_dots` of the chosen backend, so nothing of size [B, K, d] is built (B = 2048, K = 800,
d = 64 would be 420 MB in float32) with the compiled kernels; the reference backend gathers the rows
and is meant for tests.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from ..losses import SampledSoftmaxLoss
from .base import BatchLoss, Objective, module_defaults, register


class SampledCosineObjective(Objective):
    """The trainer's wrapper of a :class:`~pnn_fast.losses.SampledCosineLoss` (SL and its successors):
    its arguments are the module's own, ``DEFAULTS`` read from the module's signature (``LOSS``), so
    each default is written once. Scores and ranks with cosines, as these losses train."""

    LOSS: ClassVar[type]
    SPARSE = True

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        with self.naming_the_loss():
            self.loss_fn = self.LOSS(known, **self.loss_args(args), validate=False, sparse=self.sparse)

    def loss_args(self, given: dict) -> dict:
        """The module's keyword arguments, from ``self.args`` (``given``: the ones set explicitly)."""
        return dict(self.args)

    def sample_negatives(self, users: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """int64 [B, num_negatives] (or one pool [num_negatives] with shared_negatives): the module's draws."""
        return self.loss_fn.sample_negatives(users, generator)

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        loss = self.loss_fn(self.user_rows(user_table, users), item_table, users, pos_items, None, generator)
        # L2 over the batch's users and positives only: the official regularisers' share of the K
        # negatives would touch B x K rows per batch (see docs/baselines/sl.md)
        return BatchLoss(loss, users, pos_items)

    @torch.no_grad()
    def scoring_tables(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit user rows [U, d], unit item rows [I, d]): their inner products are the cosines these
        losses train on (the BSL code's ``generate_mode cosine`` with ``u_norm``/``i_norm``)."""
        user_table, item_table = model.embeddings()
        return F.normalize(user_table, dim=-1), F.normalize(item_table, dim=-1)


@register("sl")
class SLObjective(SampledCosineObjective):
    """Sampled softmax over cosine scores with ``num_negatives`` uniform unknown items per row.

    Defaults (:class:`~pnn_fast.SampledSoftmaxLoss`'s): see the module docstring and docs/baselines/sl.md.
    """

    LOSS = SampledSoftmaxLoss
    DEFAULTS: ClassVar[dict] = {**module_defaults(SampledSoftmaxLoss), "neg_size": "proportional"}

    def loss_args(self, given):
        # neg_size only when given: the module refuses it where PNN's classes are off
        return {k: v for k, v in self.args.items() if k != "neg_size" or "neg_size" in given}

    def negative_class_sizes(self, users: torch.Tensor) -> torch.Tensor:
        """int64 [B]: k_b, each row's count of lowest-scored draws that keep weight 1 under PNN's rule."""
        return self.loss_fn.negative_class_sizes(users)
