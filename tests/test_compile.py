"""One graph: the step of every loss on the fused kernels compiles with ``torch.compile(fullgraph=True)``
(no graph break, no data-dependent output shapes or host scalars captured), forward and backward,
and gives eager's loss and gradients (issue 65, item 4). The reference backend, written for
clarity, sorts with ``torch.unique`` (an output shape that depends on the data) and is not held to
it. The CUDA-graph side is tests/test_losses.py's reduce-overhead case, on a GPU."""
from __future__ import annotations

import pytest
import torch

from pnn_fast import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss

from batches import requires_kernels
from test_sparse import DIM, _problem

LOSSES = {
    "bpr": (lambda known, backend: BPRLoss(validate=False, backend=backend), "bpr"),
    "dns": (lambda known, backend: DNSLoss(known, validate=False, backend=backend), "sampled"),
    "sl": (lambda known, backend: SampledSoftmaxLoss(known, num_negatives=9, validate=False, backend=backend), "sampled"),
    "pnn": (lambda known, backend: PNNLoss(known, DIM, validate=False, backend=backend), "in-batch"),
    "preset": (lambda known, backend: PNNLoss.from_preset("dns-anchored", known, DIM, validate=False,
                                                         backend=backend), "draws"),
}


@pytest.fixture
def no_host_scalars():
    """Dynamo refuses, rather than captures, a host scalar or an output whose shape depends on data."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        yield
    torch._dynamo.reset()


@requires_kernels
@pytest.mark.usefixtures("no_host_scalars")
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_step_is_one_graph_with_eagers_result(name):
    backend = "cpu"
    known, users, pos, neg, user_table, item_table, noise = _problem(5)
    user_table, item_table = user_table.float(), item_table.float()
    noise = tuple(n.float() for n in noise)
    make, kind = LOSSES[name]
    torch.manual_seed(0)
    loss_fn = make(known, backend)

    def step(user_rows, table):
        if kind == "bpr":
            return loss_fn(user_rows, table, pos, neg)
        if kind == "sampled":
            return loss_fn(user_rows, table, users, pos, neg)
        if kind == "in-batch":
            return loss_fn(user_rows, table, users, pos, noise=noise)
        return loss_fn(user_rows, table, users, pos, noise=noise)  # the draws: the global stream

    results = []
    for compiled in (False, True):
        rows = user_table[users].clone().requires_grad_(True)
        table = item_table.clone().requires_grad_(True)
        fn = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
        torch.manual_seed(1)  # the attention's history draws and the preset's candidates
        loss = fn(rows, table)
        loss.backward()
        results.append((loss.detach(), rows.grad, table.grad))
    (eager, *eager_grads), (got, *grads) = results
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
