"""pnn_fast::class_terms_fwd / _bwd, L_rank and L_constrain of each row from its class centroids:
values and the four gradients against a per-row loop written from the equations and against the
reference, on continuous inputs with the edge rows (not valid, no negative class, a zero or tiny
centroid, softplus beyond its threshold); float32/float16/bfloat16 against the reference,
gradcheck, CPU results independent of the thread count, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batches import DEVICES, requires_kernels, under_thread_counts
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops

EPS = 1e-12  # F.normalize's


def class_terms_inputs(rows=48, dim=7, dtype=torch.float64, device="cpu", seed=0) -> list:
    """[user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative]: continuous
    values, and among the rows: 0 (not valid), 1 (no negative class), 2 (a zero negative centroid),
    3 (a negative centroid of norm below eps), 4 (scores far beyond softplus's threshold 20)."""
    gen = torch.Generator().manual_seed(seed)
    user, pos, neutral, negative = (torch.randn(rows, dim, dtype=torch.float64, generator=gen) for _ in range(4))
    noise_pos, noise_neg = (0.1 * torch.rand(rows, dim, dtype=torch.float64, generator=gen) for _ in range(2))
    valid = torch.rand(rows, generator=gen) > 0.15
    num_negative = torch.randint(0, 4, (rows,), generator=gen)
    valid[0], valid[1:5] = False, True
    num_negative[1], num_negative[2:5] = 0, 2
    negative[2] = 0
    negative[3] = 1e-14
    user[4], neutral[4] = 3.0, 4.0  # <u, c_neu> - <u, p> and <u, c_neg> - <u, c_neu> beyond 20
    pos[4], negative[4] = -2.0, 5.0
    floats = [x.to(dtype).to(device) for x in (user, pos, neutral, negative, noise_pos, noise_neg)]
    return floats + [valid.to(device), num_negative.to(device)]


def terms_by_loops(user, pos, neutral, negative, noise_pos, noise_neg, valid, num_negative):
    """The definition, one row at a time."""
    ranks, constrains = [], []
    for b in range(user.shape[0]):
        rank = constrain = user.new_zeros(())
        if valid[b]:
            rank = F.softplus(user[b] @ neutral[b] - user[b] @ pos[b])
            if num_negative[b] > 0:
                rank = rank + F.softplus(user[b] @ negative[b] - user[b] @ neutral[b])
                unit_pos = pos[b] / pos[b].norm().clamp_min(EPS)
                unit_neg = negative[b] / negative[b].norm().clamp_min(EPS)
                constrain = ((noise_pos[b] * unit_pos - noise_neg[b] * unit_neg) ** 2).sum()
        ranks.append(rank)
        constrains.append(constrain)
    return torch.stack(ranks), torch.stack(constrains)


def values_and_grads(fn, inputs, seed=1):
    """(rank, constrain, and the gradients of a random weighting of both w.r.t. the four embeddings)."""
    leaves = [x.clone().requires_grad_() for x in inputs[:4]]
    rank, constrain = fn(*leaves, *inputs[4:])
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(2, rank.shape[0], dtype=torch.float64, generator=gen).to(rank.device, rank.dtype)
    grads = torch.autograd.grad((weights[0] * rank + weights[1] * constrain).sum(), leaves)
    return [rank.detach(), constrain.detach(), *grads]


@pytest.mark.parametrize("device", DEVICES)
def test_class_terms_matches_the_definition_float64(device):
    inputs = class_terms_inputs(device=device)
    expected = values_and_grads(terms_by_loops, inputs)
    assert expected[5][2].abs().max() > 1e6  # row 2's zero centroid: F.normalize's 1/eps gradient is exercised
    for fn in (ops.class_terms, reference.class_terms):
        for got, want in zip(values_and_grads(fn, inputs), expected):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_class_terms_low_precision_against_the_reference_in_float64(device, dtype):
    """The op accumulates in float32: it must be at least as close to float64 as the dtype allows."""
    inputs = class_terms_inputs(rows=200, dim=64, dtype=dtype, device=device, seed=3)
    exact = values_and_grads(reference.class_terms, [x.double() if x.is_floating_point() else x for x in inputs])
    got = values_and_grads(ops.class_terms, inputs)
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    for g, want in zip(got, exact):
        assert g.dtype == dtype
        finite = want.abs() < torch.finfo(dtype).max / 2  # the 1/eps gradients of rows 2 and 3 overflow float16
        torch.testing.assert_close(g.double()[finite], want[finite], rtol=tolerance, atol=tolerance)


def test_class_terms_gradcheck():
    inputs = class_terms_inputs(rows=6, dim=3, seed=4)
    inputs[3][2:4] = torch.randn(2, 3, dtype=torch.float64)  # gradcheck's finite differences need norms >> eps
    leaves = [x.clone().requires_grad_() for x in inputs[:4]]
    assert torch.autograd.gradcheck(lambda *x: ops.class_terms(*x, *inputs[4:]), leaves)


def test_class_terms_do_not_depend_on_the_thread_count():
    inputs = class_terms_inputs(rows=5000, dim=64, dtype=torch.float32, seed=5)
    results = under_thread_counts((1, 3), lambda: values_and_grads(ops.class_terms, inputs))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_class_terms_bad_input_is_named():
    inputs = class_terms_inputs(rows=6, dim=3)
    with pytest.raises(TypeError, match="negative has dtype torch.float32 but user_emb has torch.float64"):
        ops.class_terms(*inputs[:3], inputs[3].float(), *inputs[4:])
    with pytest.raises(RuntimeError, match=r"noise_neg must have shape \[6, 3\]"):
        ops.class_terms(*inputs[:5], inputs[5][:2], *inputs[6:])
    with pytest.raises(RuntimeError, match=r"num_negative must have shape \[6\]"):
        ops.class_terms(*inputs[:7], inputs[7][:3])
    with pytest.raises(ValueError, match="valid is on meta but user_emb is on cpu"):
        ops.class_terms(*inputs[:6], inputs[6].to("meta"), inputs[7])


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without inputs requiring grad."""
    inputs = class_terms_inputs(rows=5, dim=3, device=device, seed=6)
    grads = [torch.randn(5, dtype=torch.float64).to(device) for _ in range(2)]
    return [
        (torch.ops.pnn_fast.class_terms_fwd.default, inputs),
        (torch.ops.pnn_fast.class_terms_fwd.default, [x.clone().requires_grad_() for x in inputs[:4]] + inputs[4:]),
        (torch.ops.pnn_fast.class_terms_bwd.default, grads + inputs),
    ]
