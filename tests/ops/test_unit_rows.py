"""pnn_fast::unit_rows_fwd / _bwd, F.normalize(x, dim=-1) of a whole table (sampled softmax's
cosines): value and gradient against F.normalize's autograd on continuous random rows, rows at and
below eps, every float dtype, gradcheck, thread-count independence, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batches import DEVICES, requires_kernels, under_thread_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def value_and_grad(fn, x, weights):
    """(fn(x), d <fn(x), weights> / dx) on a copy of x."""
    x = x.clone().requires_grad_()
    out = fn(x)
    (out * weights).sum().backward()
    return out.detach(), x.grad


def rows_with_edge_cases(n: int, d: int, dtype, gen) -> torch.Tensor:
    """Gaussian rows of assorted scales, then a zero row, one of norm 1e-13 (below eps, where
    F.normalize divides by eps and its gradient has no radial part) and one of norm 1e-6."""
    x = torch.randn(n, d, dtype=torch.float64, generator=gen) * torch.logspace(-3, 3, n, dtype=torch.float64)[:, None]
    x[0] = 0
    x[1] = F.normalize(x[1], dim=0) * 1e-13
    x[2] = F.normalize(x[2], dim=0) * 1e-6
    return x.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [1, 7, 64, 257])
def test_unit_rows_matches_f_normalize_and_its_gradient(device, d):
    gen = torch.Generator().manual_seed(d)
    x = rows_with_edge_cases(300, d, torch.float64, gen).to(device)
    weights = torch.randn(300, d, dtype=torch.float64, generator=gen).to(device)
    expected_value, expected_grad = value_and_grad(lambda t: F.normalize(t, dim=-1), x, weights)
    # a row's gradient is O(1 / its norm), and its two parts cancel (exactly, where d is 1): compare
    # gradients times the row's denominator, so that each row is held to the same absolute error
    denominator = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    for fn in (ops.unit_rows, reference.unit_rows):
        value, grad = value_and_grad(fn, x, weights)
        torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad * denominator, expected_grad * denominator, rtol=1e-12, atol=1e-13)
    assert torch.autograd.gradcheck(ops.unit_rows, (x[3:9].clone().requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_unit_rows_low_precision_agrees_with_the_reference_to_rounding(device, dtype):
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(500, 64, generator=gen) * 3).to(dtype).to(device)
    weights = torch.randn(500, 64, generator=gen).to(dtype).to(device)
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    got = value_and_grad(ops.unit_rows, x, weights)
    want = value_and_grad(reference.unit_rows, x.double(), weights.double())
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w, rtol=tolerance, atol=tolerance)


def unit_rounding(dtype) -> float:
    return torch.finfo(dtype).eps / 2


@pytest.mark.parametrize("device", DEVICES)
@settings(suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 300), dim=st.integers(1, 257), double=st.booleans(), tiny_share=st.floats(0, 0.5),
       seed=st.integers(0, 2**31 - 1))
def test_unit_rows_property_agrees_with_exact_normalisation(device, rows, dim, double, tiny_share, seed):
    """Random shapes, both float widths, rows of norms from 1e-6 to 1e6 and a share of zero rows and of
    rows below eps (never within a factor 2 of it, where the backends' rounding could pick different
    branches): the fused op and the reference each within a first-order rounding bound of F.normalize
    computed in float64, value and gradient, entry by entry."""
    dtype = torch.float64 if double else torch.float32
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, dtype=torch.float64, generator=gen)
    x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-300)
    scale = 10 ** (torch.rand(rows, 1, dtype=torch.float64, generator=gen) * 12 - 6)
    tiny = torch.rand(rows, 1, generator=gen) < tiny_share
    exponent = 12.5 + torch.rand(rows, 1, dtype=torch.float64, generator=gen)  # norms 3e-14 to 3e-13
    below_eps = torch.where(torch.rand(rows, 1, generator=gen) < 0.5, 0.0, 10 ** -exponent)
    x = torch.where(tiny, x * below_eps, x * scale).to(dtype)
    weights = torch.randn(rows, dim, dtype=torch.float64, generator=gen).to(dtype)
    exact = x.double()
    want_value, want_grad = value_and_grad(lambda t: F.normalize(t, dim=-1), exact, weights.double())
    # first-order worst cases (any summation order, with or without fma), doubled: a d-term sum of
    # squares or products is off by gamma_{d} of its absolute terms, the rest a few roundings
    u = unit_rounding(dtype)
    gamma = 2 * (dim + 8) * u / (1 - (dim + 8) * u)
    denominator = exact.norm(dim=1, keepdim=True).clamp_min(1e-12)
    dy = weights.double()
    radial = exact.abs() * (dy.abs() * exact.abs()).sum(dim=1, keepdim=True) / denominator ** 3
    value_bound = gamma * want_value.abs() + 2 * torch.finfo(dtype).tiny
    grad_bound = gamma * (dy.abs() / denominator + radial) + 2 * torch.finfo(dtype).tiny
    for fn in (ops.unit_rows, reference.unit_rows):
        value, grad = value_and_grad(fn, x.to(device), weights.to(device))
        assert value.dtype == dtype and grad.dtype == dtype
        assert bool(((value.cpu().double() - want_value).abs() <= value_bound).all()), fn
        assert bool(((grad.cpu().double() - want_grad).abs() <= grad_bound).all()), fn


def test_unit_rows_results_do_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(12)
    x, weights = torch.randn(40981, 64, generator=gen), torch.randn(40981, 64, generator=gen)
    results = under_thread_counts((1, 3), lambda: value_and_grad(ops.unit_rows, x, weights))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_unit_rows_rejects_bad_input_by_name():
    with pytest.raises(RuntimeError, match=r"unit_rows_fwd: x must be a floating-point \[n, d\] tensor"):
        ops.unit_rows(torch.ones(5))
    with pytest.raises(RuntimeError, match=r"unit_rows_fwd: x must be a floating-point \[n, d\] tensor"):
        ops.unit_rows(torch.ones(5, 3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match=r"unit_rows_bwd: grad must have shape"):
        torch.ops.pnn_fast.unit_rows_bwd(torch.ones(4, 3), torch.ones(5, 3))
    with pytest.raises(RuntimeError, match=r"unit_rows_bwd: grad must be Double"):
        torch.ops.pnn_fast.unit_rows_bwd(torch.ones(5, 3), torch.ones(5, 3, dtype=torch.float64))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without inputs requiring grad."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(6, 5, dtype=torch.float64, generator=gen).to(device)
    grad = torch.randn(6, 5, dtype=torch.float64, generator=gen).to(device)
    return [
        (torch.ops.pnn_fast.unit_rows_fwd.default, [x]),
        (torch.ops.pnn_fast.unit_rows_fwd.default, [x.clone().requires_grad_()]),
        (torch.ops.pnn_fast.unit_rows_bwd.default, [grad, x]),
    ]
