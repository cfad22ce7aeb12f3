"""pnn_fast::gathered_dots_fwd / _bwd, inner products of rows with gathered table rows (the
attention's logits) or, with unit_table, with the gathered rows scaled to unit length (sampled
softmax's cosines): value and gradients against a loop and the reference, gradcheck, CPU gradients
independent of the thread count, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, requires_kernels, under_thread_counts, value_and_grads
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


@pytest.mark.parametrize("unit_table", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots_matches_the_definition_and_gradcheck(device, unit_table):
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(40, 7, dtype=torch.float64, generator=gen).to(device)
    table = torch.randn(9, 7, dtype=torch.float64, generator=gen).to(device)
    table[3] *= 1e-14  # a row below F.normalize's eps: divided by the eps, and its own gradient branch
    ids = torch.randint(0, 9, (40, 6), generator=gen).to(device)  # many repeats per table row
    assert (ids == 3).any()

    def by_loops(r, t, i):
        def scaled(v):
            return v / torch.clamp(torch.sqrt((v * v).sum()), min=1e-12) if unit_table else v
        return torch.stack([torch.stack([r[b] @ scaled(t[j]) for j in i[b].tolist()]) for b in range(r.shape[0])])

    expected = value_and_grads(lambda r, t, i: (by_loops(r, t, i) ** 2).sum(), rows, table, ids)
    for fn in (ops.gathered_dots, reference.gathered_dots):
        got = value_and_grads(lambda r, t, i: (fn(r, t, i, unit_table=unit_table) ** 2).sum(), rows, table, ids)
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    normal = ids[:8].clamp(max=2)  # gradcheck's finite differences would cross the tiny row's eps
    inputs = (rows[:8].clone().requires_grad_(), table.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda r, t: ops.gathered_dots(r, t, normal, unit_table=unit_table), inputs)
    with pytest.raises(TypeError, match="table has dtype"):
        ops.gathered_dots(rows, table.float(), ids, unit_table=unit_table)


@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots_under_a_hinge_matches_the_reference(device):
    """Behind relu(dot - margin) most entries' gradients are exactly zero, which the CPU kernel skips:
    the gradients must still be the reference's, rows with and without a nonzero entry alike."""
    gen = torch.Generator().manual_seed(9)
    rows = torch.randn(300, 64, generator=gen).to(device)
    table = torch.randn(500, 64, generator=gen).to(device)
    ids = torch.randint(0, 500, (300, 200), generator=gen).to(device)
    margin = 20.0  # 2.5 sd of these dots (variance 64): 0.7% lie above it, and 118 of the 300 rows have none

    def hinge(fn):
        return lambda r, t, i: torch.relu(fn(r, t, i) - margin).sum()

    active = reference.gathered_dots(rows, table, ids) > margin
    assert 0 < int(active.sum()) < active.numel() // 100
    assert 0 < int(active.any(dim=1).sum()) < rows.shape[0]
    got = value_and_grads(hinge(ops.gathered_dots), rows, table, ids)
    expected = value_and_grads(hinge(reference.gathered_dots), rows, table, ids)
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert not got[1][~active.any(dim=1)].any()  # rows with no entry above the margin get no gradient


@pytest.mark.parametrize("unit_table", [False, True])
def test_gathered_dots_gradients_do_not_depend_on_the_thread_count(unit_table):
    gen = torch.Generator().manual_seed(6)
    rows, table = torch.randn(3000, 64, generator=gen), torch.randn(50, 64, generator=gen)
    ids = torch.randint(0, 50, (3000, 20), generator=gen)
    weights = torch.randn(3000, 20, generator=gen)
    results = under_thread_counts((1, 3), lambda: (ops.gathered_dots(rows, table, ids, unit_table=unit_table),
                                                   *value_and_grads(lambda r, t, i: (ops.gathered_dots(
                                                       r, t, i, unit_table=unit_table) * weights).sum(),
                                                       rows, table, ids)[1:]))
    # the op's output and both gradients (the weighted sum itself is torch's reduction, whose order may vary)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without inputs requiring grad."""
    gen = torch.Generator().manual_seed(8)
    rows = torch.randn(4, 3, dtype=torch.float64, generator=gen).to(device)
    table = torch.randn(20, 3, dtype=torch.float64, generator=gen).to(device)
    ids = torch.randint(20, (4, 2), generator=gen).to(device)
    grad = torch.randn(4, 2, dtype=torch.float64, generator=gen).to(device)
    forward = torch.ops.pnn_fast.gathered_dots_fwd.default
    return [case for unit_table in (False, True) for case in [
        (forward, [rows, table, ids, unit_table]),
        (forward, [rows.clone().requires_grad_(), table.clone().requires_grad_(), ids, unit_table]),
        (torch.ops.pnn_fast.gathered_dots_bwd.default,
         [grad, rows, table, ids, *forward(rows, table, ids, unit_table), unit_table]),
    ]]


def test_gathered_dots_backward_refuses_a_forward_state_of_the_wrong_shape():
    """With unit_table the backward reads the forward's output and squared norms: a mismatch is named."""
    rows, table = torch.randn(4, 3, dtype=torch.float64), torch.randn(20, 3, dtype=torch.float64)
    ids, grad = torch.randint(20, (4, 2)), torch.randn(4, 2, dtype=torch.float64)
    output, squared_norms = torch.ops.pnn_fast.gathered_dots_fwd.default(rows, table, ids, True)
    assert squared_norms.shape == (4, 2)
    with pytest.raises(RuntimeError, match="squared_norms"):
        torch.ops.pnn_fast.gathered_dots_bwd.default(grad, rows, table, ids, output, squared_norms[:, :1], True)
    with pytest.raises(RuntimeError, match="output"):
        torch.ops.pnn_fast.gathered_dots_bwd.default(grad, rows, table, ids, output.float(), squared_norms, True)
