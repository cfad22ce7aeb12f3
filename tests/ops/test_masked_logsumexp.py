"""pnn_fast::masked_logsumexp_fwd / _bwd, the sampled softmax losses' denominators: value and gradient
against a loop over each row's kept entries and against the reference (autograd's masked fills and
torch.logsumexp), with and without a shift and an exclusion mask, rows with nothing left, NaN and
infinities, every float dtype, gradcheck, thread-count independence, opcheck, and bad input."""
from __future__ import annotations

import math

import pytest
import torch

from batches import DEVICES, requires_kernels, under_thread_counts
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def problem(rows: int, columns: int, seed: int, dtype=torch.float64, excluded_share: float = 0.3):
    """Continuous x in about [-3, 3], a shift of logQ's size, a mask excluding about excluded_share
    of the entries, one row with nothing left (row 1) and one with everything kept (row 0)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, columns, generator=gen, dtype=torch.float64)).to(dtype)
    shift = (torch.rand(columns, generator=gen, dtype=torch.float64) * 6 - 9).to(dtype)
    excluded = torch.rand(rows, columns, generator=gen) < excluded_share
    excluded[0] = False
    if rows > 1:
        excluded[1] = True
    weights = torch.randn(rows, generator=gen, dtype=torch.float64).to(dtype)
    return x, shift, excluded, weights


def loop(x, scale, shift, excluded):
    """The definition, one row and one entry at a time, in float64."""
    out = []
    for b in range(x.shape[0]):
        terms = [scale * float(x[b, j]) - (float(shift[j]) if shift is not None else 0.0)
                 for j in range(x.shape[1]) if excluded is None or not bool(excluded[b, j])]
        if not terms:
            out.append(-math.inf)
            continue
        top = max(terms)
        out.append(top + math.log(sum(math.exp(t - top) for t in terms)))
    return torch.tensor(out, dtype=torch.float64)


def value_and_grad(fn, x, weights, *args):
    x = x.clone().requires_grad_()
    out = fn(x, *args)
    (out.masked_fill(torch.isinf(out), 0) * weights).sum().backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_shift", [False, True], ids=["no-shift", "shift"])
@pytest.mark.parametrize("with_mask", [False, True], ids=["all-kept", "excluded"])
@pytest.mark.parametrize("columns", [1, 9, 100, 3000])
def test_masked_logsumexp_matches_the_loop_and_the_reference(device, with_shift, with_mask, columns):
    x, shift, excluded, weights = problem(23, columns, seed=columns)
    shift = shift if with_shift else None
    excluded = excluded if with_mask else None
    scale = 1 / 0.07
    want = loop(x, scale, shift, excluded)
    args = [a.to(device) if a is not None else None for a in (shift, excluded)]
    fused_value, fused_grad = value_and_grad(ops.masked_logsumexp, x.to(device), weights.to(device), scale, *args)
    ref_value, ref_grad = value_and_grad(reference.masked_logsumexp, x.to(device), weights.to(device), scale, *args)
    torch.testing.assert_close(fused_value.cpu(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref_value.cpu(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused_grad, ref_grad, rtol=1e-12, atol=1e-14)
    if with_mask:
        assert fused_value[1] == -math.inf and bool((fused_grad[1] == 0).all())
        assert bool((fused_grad[excluded.to(device)] == 0).all())
    # the gradient is a softmax times the row's weight and scale: each row sums to weight x scale
    kept = fused_value.isfinite()
    torch.testing.assert_close(fused_grad[kept].sum(1), (weights.to(device) * scale)[kept], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_logsumexp_gradcheck(device):
    x, shift, excluded, _ = problem(5, 7, seed=3)
    x, shift, excluded = x[:, :].to(device), shift.to(device), excluded.to(device)
    excluded[1, 0] = False  # gradcheck's finite differences need finite values
    assert torch.autograd.gradcheck(lambda t: ops.masked_logsumexp(t, 2.5, shift, excluded), (x.requires_grad_(),))
    assert torch.autograd.gradcheck(lambda t: ops.masked_logsumexp(t, 0.5), (x.detach().requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_masked_logsumexp_low_precision_agrees_with_the_reference_to_rounding(device, dtype):
    x, shift, excluded, weights = problem(64, 500, seed=4, dtype=dtype)
    x, shift, excluded, weights = x.to(device), shift.to(device), excluded.to(device), weights.to(device)
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    got = value_and_grad(ops.masked_logsumexp, x, weights, 10.0, shift, excluded)
    want = value_and_grad(reference.masked_logsumexp, x.double(), weights.double(), 10.0, shift.double(), excluded)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w, rtol=tolerance, atol=tolerance, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_logsumexp_nan_and_infinities_as_torch_logsumexp(device):
    """A NaN kept gives NaN; an excluded NaN is ignored; a row of -inf gives -inf; +inf gives +inf."""
    x = torch.zeros(5, 4, dtype=torch.float64)
    x[0, 2] = math.nan
    x[1, 2] = math.nan
    x[2] = -math.inf
    x[3, 1] = math.inf
    excluded = torch.zeros(5, 4, dtype=torch.bool)
    excluded[1, 2] = True
    got = ops.masked_logsumexp(x.to(device), 1.0, None, excluded.to(device)).cpu()
    want = reference.masked_logsumexp(x, 1.0, None, excluded)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert math.isnan(got[0]) and got[1] == math.log(3) and got[2] == -math.inf and got[3] == math.inf
    assert got[4] == pytest.approx(math.log(4))


def test_masked_logsumexp_results_do_not_depend_on_the_thread_count():
    x, shift, excluded, weights = problem(2048, 2848, seed=5, dtype=torch.float32)
    results = under_thread_counts((1, 3), lambda: value_and_grad(ops.masked_logsumexp, x, weights, 10.0, shift,
                                                                 excluded))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_masked_logsumexp_rejects_bad_input_by_name():
    x = torch.ones(4, 3)
    with pytest.raises(RuntimeError, match=r"masked_logsumexp_fwd: x must be a floating-point \[B, M\] tensor"):
        ops.masked_logsumexp(torch.ones(5))
    with pytest.raises(RuntimeError, match=r"masked_logsumexp_fwd: shift must have shape"):
        ops.masked_logsumexp(x, 1.0, torch.ones(4))
    with pytest.raises(RuntimeError, match=r"masked_logsumexp_fwd: shift must be Float"):
        ops.masked_logsumexp(x, 1.0, torch.ones(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"masked_logsumexp_fwd: excluded must be Bool"):
        ops.masked_logsumexp(x, 1.0, None, torch.ones(4, 3))
    with pytest.raises(ValueError, match=r"masked_logsumexp_fwd: scale must be finite"):
        ops.masked_logsumexp(x, math.inf)
    with pytest.raises(ValueError, match=r"shift gets no gradient"):
        ops.masked_logsumexp(x, 1.0, torch.ones(3, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"masked_logsumexp_bwd: lse must have shape"):
        torch.ops.pnn_fast.masked_logsumexp_bwd(torch.ones(4), x, 1.0, None, None, torch.ones(5))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without inputs requiring grad."""
    x, shift, excluded, _ = problem(6, 5, seed=13)
    x, shift, excluded = x.to(device), shift.to(device), excluded.to(device)
    excluded[1, 0] = False
    lse = reference.masked_logsumexp(x, 2.0, shift, excluded)  # float64 x: its accumulation dtype
    grad = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(14)).to(device)
    return [
        (torch.ops.pnn_fast.masked_logsumexp_fwd.default, [x, 2.0, shift, excluded]),
        (torch.ops.pnn_fast.masked_logsumexp_fwd.default, [x.clone().requires_grad_(), 2.0, shift, excluded]),
        (torch.ops.pnn_fast.masked_logsumexp_fwd.default, [x.clone().requires_grad_(), 0.5, None, None]),
        (torch.ops.pnn_fast.masked_logsumexp_bwd.default, [grad, x, 2.0, shift, excluded, lse]),
    ]
