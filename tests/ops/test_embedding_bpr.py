"""pnn_fast::embedding_bpr_fwd / _bwd, BPR (with RecBole's EmbLoss) straight from the embedding
tables: value and table gradients against a per-pair loop and the reference in float64, float32
with large scores, gradcheck, CPU gradients independent of the thread count, opcheck, and bad
input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batches import DEVICES, bpr_inputs, requires_kernels, under_thread_counts, value_and_grads
from pnn_fast import _extension, embedding_bpr
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def bpr_by_loops(user_table, item_table, users, pos, neg):
    """The definition, one (row, negative) pair at a time."""
    terms = [F.softplus(item_table[n] @ user_table[u] - item_table[p] @ user_table[u])
             for u, p, row in zip(users.tolist(), pos.tolist(), neg.tolist()) for n in row]
    return torch.stack(terms).mean()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("negatives", [1, 4])
def test_embedding_bpr_matches_the_definition_float64(device, negatives):
    inputs = bpr_inputs(device=device, negatives=negatives)
    expected = value_and_grads(bpr_by_loops, *inputs)
    for fn in (ops.embedding_bpr, reference.embedding_bpr):
        for got, want in zip(value_and_grads(fn, *inputs), expected):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_bpr_float32_and_large_scores(device):
    user_table, item_table, *ids = bpr_inputs(dtype=torch.float32, device=device, rows=300)
    item_table = item_table * 8  # pushes some s_neg - s_pos above softplus' threshold of 20
    got = value_and_grads(ops.embedding_bpr, user_table, item_table, *ids)
    want = value_and_grads(reference.embedding_bpr, user_table, item_table, *ids)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("negatives", [1, 3])
def test_embedding_bpr_with_embloss_matches_recbole_form(device, negatives):
    """reg_weight adds RecBole's EmbLoss of U[users], I[pos], I[neg] (each its own Frobenius norm) / B."""
    inputs = bpr_inputs(device=device, negatives=negatives)
    user_table, item_table, users, pos, neg = inputs

    def by_definition(u, i, users, pos, neg):
        embloss = u[users].norm() + i[pos].norm() + i[neg].norm()
        return bpr_by_loops(u, i, users, pos, neg) + 0.25 * embloss / users.numel()

    expected = value_and_grads(by_definition, *inputs)
    for fn in (ops.embedding_bpr, reference.embedding_bpr):
        got = value_and_grads(lambda *a: fn(*a, reg_weight=0.25), *inputs)
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # a table of zeros: norm 0, whose gradient torch takes as 0 (not NaN)
    zero_items = torch.zeros_like(item_table)
    got = value_and_grads(lambda *a: ops.embedding_bpr(*a, reg_weight=0.25), user_table, zero_items, users, pos, neg)
    want = value_and_grads(lambda *a: reference.embedding_bpr(*a, reg_weight=0.25), user_table, zero_items, users,
                           pos, neg)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reg_weight", [0.0, 0.5])
def test_embedding_bpr_gradcheck(reg_weight):
    inputs = bpr_inputs(rows=9, negatives=2)
    tables = tuple(t.clone().requires_grad_() for t in inputs[:2])
    assert torch.autograd.gradcheck(lambda u, i: ops.embedding_bpr(u, i, *inputs[2:], reg_weight=reg_weight), tables)


def test_cpu_scatter_is_the_same_for_any_thread_count():
    user_table, item_table, users, pos, neg = bpr_inputs(dtype=torch.float32, rows=20000, negatives=2, seed=4)
    results = under_thread_counts((1, 2, 4), lambda: value_and_grads(
        lambda *a: ops.embedding_bpr(*a, reg_weight=0.1), user_table, item_table, users, pos, neg))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, without and with the fused EmbLoss term, the forward
    with and without tables requiring grad."""
    user_table, item_table, users, pos, neg = bpr_inputs(device=device, rows=4, negatives=2, seed=8)
    bpr = [user_table, item_table, users, pos, neg]
    grad = torch.tensor(0.7, dtype=torch.float64, device=device)
    cases = []
    for reg_weight in (0.0, 0.3):
        _, coef, norms = torch.ops.pnn_fast.embedding_bpr_fwd(*bpr, reg_weight)
        cases += [
            (torch.ops.pnn_fast.embedding_bpr_fwd.default, bpr + [reg_weight]),
            (torch.ops.pnn_fast.embedding_bpr_fwd.default,
             [user_table.clone().requires_grad_(), item_table.clone().requires_grad_()] + bpr[2:] + [reg_weight]),
            (torch.ops.pnn_fast.embedding_bpr_bwd.default, [grad, coef, norms] + bpr + [reg_weight]),
        ]
    return cases


def test_embedding_bpr_bad_input_names_the_argument():
    user_table, item_table, users, pos, neg = bpr_inputs(rows=5)
    with pytest.raises(ValueError, match="users"):
        embedding_bpr(user_table, item_table, users + 100, pos, neg, validate="eager")
    with pytest.raises(ValueError, match="neg_items"):
        embedding_bpr(user_table, item_table, users, pos, neg[:4])
    with pytest.raises(ValueError, match="neg_items"):
        embedding_bpr(user_table, item_table, users, pos, neg[:, :0])
    with pytest.raises(TypeError, match="item_table has dtype"):
        embedding_bpr(user_table, item_table.float(), users, pos, neg)
    with pytest.raises(TypeError, match="pos_items must be int32 or int64"):
        embedding_bpr(user_table, item_table, users, pos.float(), neg)
    with pytest.raises(ValueError, match="empty"):
        embedding_bpr(user_table, item_table, users[:0], pos[:0], neg[:0])
    for bad in (-1e-4, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="reg_weight"):
            embedding_bpr(user_table, item_table, users, pos, neg, reg_weight=bad)
    with pytest.raises(RuntimeError, match="reg_weight must be finite"):
        torch.ops.pnn_fast.embedding_bpr_fwd(user_table, item_table, users, pos, neg, -1.0)
