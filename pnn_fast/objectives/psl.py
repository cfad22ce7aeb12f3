"""PSL, the pairwise softmax loss (Yang et al., NeurIPS 2024), as a training
objective: the trainer's wrapper of :class:`pnn_fast.softmax_losses.PairwiseSoftmaxLoss` (same
arguments and defaults). Sources, defaults and departures: docs/baselines/psl.md.
"""
from __future__ import annotations

from typing import ClassVar

from ..softmax_losses import PairwiseSoftmaxLoss
from .base import module_defaults, register
from .sl import SampledCosineObjective


@register("psl")
class PSLObjective(SampledCosineObjective):
    """Pairwise softmax over cosine scores with ``num_negatives`` uniform unknown items per row."""

    LOSS = PairwiseSoftmaxLoss
    DEFAULTS: ClassVar[dict] = module_defaults(PairwiseSoftmaxLoss)
