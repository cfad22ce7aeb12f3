"""pnn_fast::gathered_norm_fwd / _bwd, the Frobenius norm of gathered table rows (RecBole's EmbLoss
term): value and table gradient against the definition and the reference, the origin and empty
ids, gradcheck, CPU gradients independent of the thread count, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, bpr_inputs, requires_kernels, under_thread_counts, value_and_grads
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


@pytest.mark.parametrize("device", DEVICES)
def test_gathered_norm(device):
    table = torch.randn(10, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    ids = torch.tensor([3, 3, 0, 9, 3], device=device)
    expected = value_and_grads(lambda t, _, i: torch.sqrt(sum((t[j] ** 2).sum() for j in i.tolist())), table, table,
                               ids)
    got = value_and_grads(lambda t, _, i: ops.gathered_norm(t, i), table, table, ids)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-15)
    zero = torch.zeros(4, 3, dtype=torch.float64, device=device, requires_grad=True)
    ops.gathered_norm(zero, torch.tensor([1, 2], device=device)).backward()
    assert not zero.grad.any()  # torch's norm has gradient 0 at the origin, not NaN
    assert ops.gathered_norm(table, ids[:0]).item() == 0.0
    assert torch.autograd.gradcheck(lambda t: ops.gathered_norm(t, ids), (table.clone().requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
def test_gathered_norm_matches_reference_float32(device):
    """Repeated ids of a [B, K] block: the value and the scattered gradient of reference.gathered_norm."""
    _, item_table, _, _, neg = bpr_inputs(dtype=torch.float32, device=device, rows=200, negatives=3, seed=1)
    got = value_and_grads(lambda t, _, i: ops.gathered_norm(t, i), item_table, item_table, neg)
    want = value_and_grads(lambda t, _, i: reference.gathered_norm(t, i), item_table, item_table, neg)
    for g, w in zip(got[:2], want[:2]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_gathered_norm_gradients_do_not_depend_on_the_thread_count():
    user_table, item_table, users, _, _ = bpr_inputs(dtype=torch.float32, rows=20000, negatives=2, seed=4)
    results = under_thread_counts((1, 2, 4), lambda: value_and_grads(
        lambda u, i, ids: ops.gathered_norm(u, ids) + ops.gathered_norm(i, ids), user_table, item_table[:12], users))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    _, item_table, _, _, neg = bpr_inputs(device=device, rows=4, negatives=2, seed=8)
    ids = neg.reshape(-1)
    norm = torch.ops.pnn_fast.gathered_norm_fwd(item_table, ids)
    grad = torch.tensor(0.7, dtype=torch.float64, device=device)
    return [
        (torch.ops.pnn_fast.gathered_norm_fwd.default, [item_table.clone().requires_grad_(), ids]),
        (torch.ops.pnn_fast.gathered_norm_bwd.default, [grad, item_table, ids, norm]),
    ]


def test_bad_input_is_a_clear_error():
    table = torch.randn(10, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"table must be a floating-point \[n, d\] tensor"):
        ops.gathered_norm(table[0], torch.tensor([3]))
    with pytest.raises(ValueError, match="ids is on meta but table is on cpu"):
        ops.gathered_norm(table, torch.tensor([3], device="meta"))
