"""PNN, the paper's method, as a training objective (docs/semantics.md)."""
from __future__ import annotations

import torch

from ..losses import PNNLoss, loss_defaults
from .base import BatchLoss, Objective, register

PNN_LOSS_DEFAULTS = loss_defaults(PNNLoss)


@register("pnn")
class PNNObjective(Objective):
    """The paper's PNN loss (docs/semantics.md); in-batch candidates unless ``in_batch`` is False,
    then ``candidates`` sampled unknown items per row (the authors' code uses 8).

    ``hard_negative``: "candidates" (the paper: L_BPR's hard negative is the hardest of the class
    candidates) or "sampled" (DNS's: the hardest of ``hard_candidates`` fresh uniform samples, while
    the classes stay over the candidates). ``rank_weight``: L_rank's weight inside L_PNN.
    ``candidates_across_ranks``: under torchrun, in-batch candidates from every rank (PNNLoss's).
    ``lambda_range`` ([low, high], a bounded attention lambda), ``lambda_temperature`` (the
    attention sigmoid's temperature) and ``uniform_over`` ("items" or "users_and_items", DirectAU's
    uniformity): PNNLoss's variants beyond the paper.
    ``preset``: a name of :data:`pnn_fast.losses.PRESETS`, which then sets every other argument
    but ``backend``."""

    # the loss's own arguments keep PNNLoss's defaults; the rest say how the trainer feeds it
    DEFAULTS = {"in_batch": True, "candidates": 8, "hard_negative": "candidates", "hard_candidates": 8,
                **{name: PNN_LOSS_DEFAULTS[name] for name in (
                    "alpha", "beta", "neg_size", "history_len", "lambda_mode", "fixed_lambda", "use_rank",
                    "rank_weight", "noise_max", "uniform_t", "uniform_over", "lambda_range", "lambda_temperature",
                    "candidates_across_ranks", "backend")},
                "preset": None}
    SPARSE = True

    def __init__(self, known, model, *, sparse=False, **args):
        super().__init__(known, model, sparse=sparse, **args)
        a = self.args
        if a["preset"] is not None:
            others = sorted(set(args) - {"preset", "backend"})
            if others:
                raise ValueError(f"pnn: preset={a['preset']!r} sets every argument but backend; drop {others}")
            self.loss_fn = PNNLoss.from_preset(a["preset"], known, model.dim, backend=a["backend"], validate=False,
                                               sparse=self.sparse)
            return
        if a["hard_negative"] not in ("candidates", "sampled"):
            raise ValueError(f"pnn: hard_negative must be 'candidates' or 'sampled', got {a['hard_negative']!r}")
        if not isinstance(a["hard_candidates"], int) or isinstance(a["hard_candidates"], bool) or a["hard_candidates"] < 1:
            raise ValueError(f"pnn: hard_candidates must be an int >= 1, got {a['hard_candidates']!r}")
        self.loss_fn = PNNLoss(known, model.dim, alpha=a["alpha"], beta=a["beta"], neg_size=a["neg_size"],
                               history_len=a["history_len"], lambda_mode=a["lambda_mode"],
                               fixed_lambda=a["fixed_lambda"], lambda_range=a["lambda_range"],
                               lambda_temperature=a["lambda_temperature"], use_rank=a["use_rank"],
                               rank_weight=a["rank_weight"], uniform_over=a["uniform_over"],
                               num_candidates=None if a["in_batch"] else int(a["candidates"]),
                               num_hard_candidates=int(a["hard_candidates"]) if a["hard_negative"] == "sampled" else None,
                               noise_max=a["noise_max"], candidates_across_ranks=a["candidates_across_ranks"],
                               uniform_t=a["uniform_t"], backend=a["backend"], validate=False, sparse=self.sparse)

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        # the loss draws its sampled candidates (if any) from the trainer's stream
        loss = self.loss_fn(self.user_rows(user_table, users), item_table, users, pos_items, generator=generator)
        return BatchLoss(loss, users, pos_items)

    @torch.no_grad()
    def nonfinite_terms(self, model, users, pos_items, generator):
        user_table, item_table = model.embeddings()
        _, components = self.loss_fn(self.user_rows(user_table, users), item_table, users, pos_items,
                                     generator=generator, return_components=True)
        # a finite term times its weight may overflow (--beta 1e308): name the weighted term then
        weighted = {"alpha * constrain": self.loss_fn.alpha * components["constrain"],
                    "beta * uniform": self.loss_fn.beta * components["uniform"]}
        named = [name for name, value in {**components, **weighted}.items()
                 if torch.is_floating_point(value) and not torch.isfinite(value).all()]
        if not named:  # each weighted term finite, their sum is not
            named = ["the sum of the terms"]
        return named
