"""SL, the sampled softmax loss (Wu et al., "On the Effectiveness of Sampled Softmax Loss for Item
Recommendation", ACM TOIS 2024, arXiv 2201.02327), as a training objective.

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

Cost: scores come from the unit item table and :func:`gathered_dots` of the chosen backend, so
nothing of size [B, K, d] is built (B = 2048, K = 800, d = 64 would be 420 MB in float32) with the
compiled kernels; the reference backend gathers the rows and is meant for tests.
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F

from .. import backends
from ..backends.rows import negative_class_size
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register


def sampled_softmax_loss(user_rows: torch.Tensor, item_table: torch.Tensor, pos_items: torch.Tensor,
                         neg_items: torch.Tensor, temperature: float, backend: str = "auto",
                         neutral_weight: float = 1.0, num_negative=None, neutral_top: int = 0) -> torch.Tensor:
    """The mean SL of the rows against their negatives, from cosine scores.

    With ``neutral_weight`` below 1, PNN's classes inside the softmax: each row's ``num_negative``
    lowest-scored negatives (the reliable negatives) keep weight 1 in the denominator, the others
    (the neutral class) weigh ``neutral_weight``: ``sum_j w_j exp s(u, n_j)``.  With ``neutral_top``
    above 0 the neutral class is instead each row's ``neutral_top`` highest-scored negatives, where
    the false negatives are (docs/why-pnn.md), and every other negative keeps weight 1.

    Args:
        user_rows: float [B, d], the batch's user embeddings (not normalised).
        item_table: float [I, d], same dtype and device, the model's item embeddings (not normalised).
        pos_items: int [B], each row's positive.
        neg_items: int [B, K], each row's sampled negatives.
        temperature: tau > 0, divides every cosine.
        backend: "auto", "reference", "cpu" or "cuda": whose ``gathered_dots`` scores the negatives.
        neutral_weight: in (0, 1]; num_negative: int64 [B], the negative class sizes (needed when
            neutral_weight < 1 and neutral_top is 0); neutral_top: in [0, K), 0 for PNN's classes.
    Returns:
        0-dim tensor of ``user_rows``' dtype, differentiable w.r.t. both embeddings.
    """
    user_unit = F.normalize(user_rows, dim=-1)
    # normalising the whole [I, d] table once costs far less than normalising B x K gathered rows
    item_unit = F.normalize(item_table, dim=-1)
    impl = backends.select(backend, user_rows.device)
    pos_logit = (user_unit * item_unit.index_select(0, pos_items)).sum(dim=-1) / temperature  # [B]
    neg_logits = impl.gathered_dots(user_unit, item_unit, neg_items) / temperature  # [B, K]
    if neutral_weight != 1.0:
        if neutral_top:  # the neutral_top highest of a row (equal scores: the first by position)
            sizes = torch.full((neg_logits.shape[0],), neutral_top, dtype=torch.int64, device=neg_logits.device)
            neutral = impl.lowest_k_mask(-neg_logits.detach(), sizes)
        else:  # the num_negative lowest of a row (equal scores: the first by position) are the negative class
            neutral = ~impl.lowest_k_mask(neg_logits.detach(), num_negative)
        neg_logits = neg_logits + neutral.to(neg_logits.dtype) * math.log(neutral_weight)
    # log of the denominator without forming [B, K + 1]: the positive joins the negatives' logsumexp
    log_denominator = torch.logaddexp(pos_logit, torch.logsumexp(neg_logits, dim=1))
    return (log_denominator - pos_logit).mean()


@register("sl")
class SLObjective(Objective):
    """Sampled softmax over cosine scores with ``num_negatives`` uniform unknown items per row.

    Defaults: see the module docstring and docs/baselines/sl.md.
    """

    DEFAULTS: ClassVar[dict] = {
        "num_negatives": 800,  # SL baseline runs, junkangwu/BSL README (MF: Yelp2018, Gowalla, ML-1M)
        "temperature": 0.1,    # temp, wujcan/SSM-TensorFlow conf/SSM.properties
        "neutral_weight": 1.0,  # 1: plain SL; below 1: PNN's neutral class down-weighted (ours, not published)
        "neg_size": "proportional",  # PNN's negative class size rule, when neutral_weight < 1
        "neutral_top": 0,  # above 0: the neutral class is each row's neutral_top highest draws (ours)
        "backend": "auto",
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        negatives = a["num_negatives"]
        if not isinstance(negatives, int) or isinstance(negatives, bool) or negatives < 1:
            raise ValueError(f"sl: num_negatives must be an int >= 1, got {negatives!r}")
        temperature = a["temperature"]
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 < temperature < math.inf:
            raise ValueError(f"sl: temperature must be a finite number > 0, got {temperature!r}")
        if a["backend"] not in backends.NAMES:
            raise ValueError(f"sl: backend must be one of {backends.NAMES}, got {a['backend']!r}")
        weight = a["neutral_weight"]
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 < weight <= 1:
            raise ValueError(f"sl: neutral_weight must lie in (0, 1], got {weight!r}")
        # the K sampled items are every row's unlabeled ones and k_b <= K - 1 (the neutral class keeps
        # one): a larger fixed size would silently be cut to K - 1
        neg_size = a["neg_size"]
        if neg_size not in ("proportional", "count") and not (
                isinstance(neg_size, int) and not isinstance(neg_size, bool) and 0 <= neg_size < negatives):
            raise ValueError(f"sl: neg_size must be 'proportional', 'count' or an int in [0, num_negatives) = "
                             f"[0, {negatives}), got {neg_size!r}")
        # at least one draw of a row stays outside the neutral class, at full weight
        top = a["neutral_top"]
        if not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top < negatives):
            raise ValueError(f"sl: neutral_top must be an int in [0, num_negatives) = [0, {negatives}), got {top!r}")
        if top and weight == 1:  # a neutral class of weight 1 is no class: the setting would do nothing
            raise ValueError(f"sl: neutral_top={top} needs a neutral_weight below 1, got {weight!r}")
        # PNN's size rule places the classes only when they are PNN's: given otherwise it would do nothing
        if "neg_size" in args and (weight == 1 or top):
            raise ValueError(f"sl: neg_size={neg_size!r} sizes PNN's negative class, which needs a neutral_weight "
                             f"below 1 and neutral_top 0; got neutral_weight={weight!r}, neutral_top={top!r}")

    def sample_negatives(self, users: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """int64 [B, num_negatives]: uniform draws, with replacement, from each user's unknown items."""
        return sample_unknown(self.known, users, self.args["num_negatives"], generator, backend=self.args["backend"])

    def negative_class_sizes(self, users: torch.Tensor) -> torch.Tensor:
        """int64 [B]: k_b, each row's count of lowest-scored draws that keep weight 1 under PNN's rule
        (``neg_size``); every one of the ``num_negatives`` draws is unlabeled."""
        unlabeled = torch.full_like(users, self.args["num_negatives"], dtype=torch.int64)
        return negative_class_size(unlabeled, self.known.count(users), self.known.num_items, self.args["neg_size"])

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg_items = self.sample_negatives(users, generator)
        num_negative = None
        if self.args["neutral_weight"] != 1 and not self.args["neutral_top"]:
            num_negative = self.negative_class_sizes(users)
        # index_select, not indexing: its backward adds repeated rows in a fixed order (reproducible runs)
        loss = sampled_softmax_loss(user_table.index_select(0, users), item_table, pos_items, neg_items,
                                    float(self.args["temperature"]), self.args["backend"],
                                    float(self.args["neutral_weight"]), num_negative, self.args["neutral_top"])
        # L2 over the batch's users and positives only: the official regularisers' share of the K
        # negatives would touch B x K rows per batch (see docs/baselines/sl.md)
        return BatchLoss(loss, users, pos_items)

    @torch.no_grad()
    def scoring_tables(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit user rows [U, d], unit item rows [I, d]): their inner products are the cosines SL
        was trained on (the BSL code's ``generate_mode cosine`` with ``u_norm``/``i_norm``)."""
        user_table, item_table = model.embeddings()
        return F.normalize(user_table, dim=-1), F.normalize(item_table, dim=-1)
