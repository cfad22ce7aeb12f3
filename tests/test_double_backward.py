"""Second derivatives through the fused kernels: not supported, and said so (issue 67, item 3).

The backward ops had no Autograd kernel, so a backward with create_graph=True (a gradient penalty)
recorded no history through them and the second derivative came out silently zero on the cpu
backend (0 against 8.2e-4 on the reference for SL). Now a first backward with create_graph=True
still works, and differentiating its result raises, naming the backward op; the reference backend,
plain PyTorch, gives second derivatives.
"""
from __future__ import annotations

import pytest
import torch

from pnn_fast import BPRLoss, BilateralSoftmaxLoss, PairwiseSoftmaxLoss, PNNLoss, SampledSoftmaxLoss, SoftmaxLossAtK
from pnn_fast.objectives import embedding_l2

from batches import requires_kernels
from test_sparse import DIM, _problem

LOSSES = {
    "sl": (lambda known, backend: SampledSoftmaxLoss(known, num_negatives=9, backend=backend), "gathered_dots_bwd"),
    "pnn": (lambda known, backend: PNNLoss(known, DIM, backend=backend, lambda_mode="fixed"), "_bwd"),
    "bpr": (lambda known, backend: BPRLoss(backend=backend), "embedding_bpr_bwd"),
    "bsl": (lambda known, backend: BilateralSoftmaxLoss(known, num_negatives=9, backend=backend), "gathered_dots_bwd"),
    "psl": (lambda known, backend: PairwiseSoftmaxLoss(known, num_negatives=9, backend=backend), "gathered_dots_bwd"),
    "slatk": (lambda known, backend: SoftmaxLossAtK(known, k=3, num_negatives=9, backend=backend), "gathered_dots_bwd"),
}


def _penalty(name, backend):
    """The gradient of the squared norm of the loss's gradient w.r.t. the item table (a gradient penalty)."""
    known, users, pos, neg, user_table, item_table, noise = _problem(6)
    item_table.requires_grad_(True)
    loss_fn = LOSSES[name][0](known, backend).double()
    user_emb = user_table[users]
    if name == "bpr":
        loss = loss_fn(user_emb, item_table, pos, neg)
    elif name == "pnn":
        loss = loss_fn(user_emb, item_table, users, pos, neg, noise=noise)
    else:
        loss = loss_fn(user_emb, item_table, users, pos, neg)
    (grad,) = torch.autograd.grad(loss, item_table, create_graph=True)  # a first backward works
    (second,) = torch.autograd.grad(grad.pow(2).sum(), item_table)
    return second


@pytest.mark.parametrize("name", list(LOSSES))
def test_the_reference_gives_second_derivatives(name):
    assert _penalty(name, "reference").abs().sum() > 0


@requires_kernels
@pytest.mark.parametrize("name", list(LOSSES))
def test_fused_second_derivatives_raise_naming_the_op(name):
    with pytest.raises(RuntimeError, match=r"derivative for pnn_fast::\w*" + LOSSES[name][1]) as err:
        _penalty(name, "cpu")
    assert "\n" not in str(err.value).strip()  # one line


@requires_kernels
def test_gradgradcheck_is_refused_rather_than_wrong():
    known, users, pos, neg, user_table, item_table, _ = _problem(7)
    loss_fn = SampledSoftmaxLoss(known, num_negatives=9, backend="cpu")
    user_emb = user_table[users].clone().requires_grad_(True)
    table = item_table.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="derivative for pnn_fast::"):
        torch.autograd.gradgradcheck(lambda u, t: loss_fn(u, t, users, pos, neg), (user_emb, table))
