"""SL@K (Yang et al., KDD 2025, arXiv 2508.05673) as a training objective, with the authors'
schedule: :class:`pnn_fast.softmax_losses.SoftmaxLossAtK` plus the trainer's hooks it needs.

- Epochs before ``warmup_epochs`` train plain SL. From the first SL@K epoch on, the learning rate
  is ``switch_lr_factor`` times the run's, and Adam starts afresh there, as the authors' code builds
  a new optimizer at the switch (Tiny-Snow/IR-Benchmark, ``slatk_start_epoch``). The KDD release
  has no warm-up: the default ``warmup_epochs = 0`` is that, and the factor applies only after a
  warm-up.
- In every epoch e (0-based) with ``(e + 1) % quantile_every == 0`` (and e past the warm-up), after
  each optimiser step, the top-k quantile of the step's users is re-estimated from the step's own
  draws with the updated model (:meth:`~pnn_fast.softmax_losses.SoftmaxLossAtK.refresh_quantile`),
  as the authors' ``step``. The refresh is a forward pass without a gradient, so it costs about a
  step's forward in one epoch of ``quantile_every``.

Sources, defaults and departures: docs/baselines/slatk.md.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from .._checks import check_int, check_real
from ..softmax_losses import SoftmaxLossAtK
from .base import BatchLoss, module_defaults, register
from .sl import SampledCosineObjective

SCHEDULE_DEFAULTS = {
    "quantile_every": 20,     # epoch_quantile, IR-Benchmark-SLatK args (searched over 5 and 20)
    "warmup_epochs": 0,       # the KDD release trains SL@K from the first epoch
    "switch_lr_factor": 0.1,  # lr * 0.1 at the switch after a warm-up, IR-Benchmark optim_SLatK.py
}


@register("slatk")
class SLatKObjective(SampledCosineObjective):
    """SL@K over cosine scores with ``num_negatives`` uniform unknown items per row, on the authors'
    schedule (module docstring)."""

    LOSS = SoftmaxLossAtK
    DEFAULTS: ClassVar[dict] = {**module_defaults(SoftmaxLossAtK), **SCHEDULE_DEFAULTS}

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        with self.naming_the_loss():
            self.quantile_every = check_int("quantile_every", self.args["quantile_every"], 1)
            self.warmup_epochs = check_int("warmup_epochs", self.args["warmup_epochs"], 0)
            self.switch_lr_factor = check_real("switch_lr_factor", self.args["switch_lr_factor"], low_open=True)
        self.refreshing = False
        self._step_draws = None

    def loss_args(self, given):
        return {k: v for k, v in self.args.items() if k not in SCHEDULE_DEFAULTS}

    def learning_rate_factor(self, epoch: int) -> float:
        return self.switch_lr_factor if self.warmup_epochs and epoch >= self.warmup_epochs else 1.0

    def on_epoch_start(self, model, generator, epoch):
        self.loss_fn.weighted = epoch >= self.warmup_epochs
        self.refreshing = epoch >= self.warmup_epochs and (epoch + 1) % self.quantile_every == 0

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        draws = self.loss_fn.sample_negatives(users, generator)
        user_table, item_table = model.embeddings()
        loss = self.loss_fn(self.user_rows(user_table, users), item_table, users, pos_items, draws)
        if self.refreshing and self.training:  # kept for after_step's refresh, with the updated model
            self._step_draws = (users, draws)
        return BatchLoss(loss, users, pos_items)

    @torch.no_grad()
    def after_step(self, model) -> None:
        if self._step_draws is None:
            return
        users, draws = self._step_draws
        self._step_draws = None
        user_table, item_table = model.embeddings()
        self.loss_fn.refresh_quantile(user_table.index_select(0, users), item_table, users, draws)
