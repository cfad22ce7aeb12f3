"""BSL, the bilateral softmax loss (Wu et al., ICDE 2024, arXiv 2312.12882), as a training objective:
the trainer's wrapper of :class:`pnn_fast.softmax_losses.BilateralSoftmaxLoss` (same arguments and
defaults). Sources, defaults and departures: docs/baselines/bsl.md.
"""
from __future__ import annotations

from typing import ClassVar

from ..softmax_losses import BilateralSoftmaxLoss
from .base import module_defaults, register
from .sl import SampledCosineObjective


@register("bsl")
class BSLObjective(SampledCosineObjective):
    """Bilateral softmax over cosine scores with ``num_negatives`` uniform unknown items per row."""

    LOSS = BilateralSoftmaxLoss
    DEFAULTS: ClassVar[dict] = module_defaults(BilateralSoftmaxLoss)
