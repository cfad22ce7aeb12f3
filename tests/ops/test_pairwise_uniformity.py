"""pnn_fast::pairwise_uniformity_fwd / _bwd, L_uniform (the log mean Gaussian potential over pairs
of rows): value and gradient against the reference and against the difference form at large
scales, float32, CUDA against CPU, gradcheck, opcheck, and bad input."""
from __future__ import annotations

import importlib

import pytest
import torch

from batches import DEVICES, TOLERANCE, requires_kernels, under_thread_counts
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops

CUDA = "cuda" in DEVICES


def uniformity_from_differences(x: torch.Tensor, t: float) -> torch.Tensor:
    """The uniformity from ||x_i - x_j||^2 summed over differences ([n, n, d] memory: tests only).

    The reference expands |x_i|^2 + |x_j|^2 - 2 x_i.x_j, which loses ~|x|^2 eps absolute per
    distance; at large scales this form is the accurate one to compare with.
    """
    n = x.shape[0]
    dist2 = (x[:, None, :] - x[None, :, :]).pow(2).sum(dim=-1)
    logits = (-t * dist2).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return torch.logsumexp(logits.reshape(-1), dim=0) - torch.log(torch.tensor(float(n * (n - 1)), dtype=x.dtype))


@pytest.mark.parametrize("n,dim", [(1, 3), (2, 1), (3, 5), (50, 67), (257, 8)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_pairwise_uniformity_matches_reference(n, dim, scale):
    x = (torch.randn(n, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(n)) * scale)
    grad_out = torch.tensor(0.7, dtype=torch.float64)
    want_fn = reference.pairwise_uniformity if scale <= 1 or n < 2 else uniformity_from_differences
    results = []
    for fn in (ops.pairwise_uniformity, want_fn):
        xr = x.clone().requires_grad_()
        value = fn(xr, 2.0)
        grad = torch.autograd.grad(value, xr, grad_out, allow_unused=True)[0]
        results.append((value, torch.zeros_like(x) if grad is None else grad))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    # the weights exp(l_ij - L) carry the absolute rounding of logits of size t |x|^2 (1e8 at
    # scale 1e3: 1e-8 in float64), whatever the formula
    grad_rtol = 1e-9 if scale <= 1 else 1e-6
    torch.testing.assert_close(got_grad, want_grad, rtol=grad_rtol, atol=1e-12)


def test_pairwise_uniformity_float32_at_large_scale():
    # distances from differences, exponentials behind a max: float32 stays accurate and finite
    x = torch.randn(300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 100
    want = reference.pairwise_uniformity(x, 2.0)
    got = ops.pairwise_uniformity(x.float(), 2.0)
    assert torch.isfinite(got)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_is_a_plain_tensor_on_any_thread_count(dtype):
    """The CPU kernels call ATen ops from parallel_for's worker threads: those must run below
    autograd as the caller does.  Found on a 16-core GPU machine: with x float64 (x_acc is x
    itself) the workers recorded a graph into the gradient (CopySlices) or failed an in-place check."""
    x = torch.randn(300, 8, dtype=dtype, generator=torch.Generator().manual_seed(3))

    def gradient():
        xr = x.clone().requires_grad_()
        value = ops.pairwise_uniformity(xr, 2.0)
        return value, torch.autograd.grad(value, xr)[0]

    (value_1, grad_1), (value_2, grad_2), (value_4, grad_4) = under_thread_counts((1, 2, 4), gradient)
    for grad in (grad_1, grad_2, grad_4):
        assert not grad.requires_grad and grad.grad_fn is None
    torch.testing.assert_close(torch.stack([value_2, value_4]), value_1.expand(2), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad_2, grad_1, **TOLERANCE[dtype])
    torch.testing.assert_close(grad_4, grad_1, **TOLERANCE[dtype])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
def test_cuda_uniformity_and_cpu_parity():
    x = torch.randn(3000, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results = []
    for device in ("cpu", "cuda"):
        xd = x.to(device).requires_grad_()
        value = ops.pairwise_uniformity(xd, 2.0)
        results.append((value.cpu(), torch.autograd.grad(value, xd)[0].cpu()))
    torch.testing.assert_close(results[0], results[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0.3, 30.0])
def test_pairwise_uniformity_gradcheck(device, scale):
    x = (torch.randn(9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale).to(device)
    assert torch.autograd.gradcheck(lambda y: ops.pairwise_uniformity(y, 2.0 / scale**2), (x.requires_grad_(),))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without an x requiring grad, and
    on the CPU with and without the saved exponentials."""
    x = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    grad = torch.tensor(0.5, dtype=torch.float64, device=device)
    cases = []
    keep = torch.arange(40, device=device) % 3 != 1
    for save in (False, True) if device == "cpu" else (False,):
        _, total, row_max, exps = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0, save)
        _, kept_total, kept_max, kept_exps = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0, save, keep)
        cases += [
            (torch.ops.pnn_fast.pairwise_uniformity_fwd.default, [x, 2.0, save]),
            (torch.ops.pnn_fast.pairwise_uniformity_fwd.default, [x.clone().requires_grad_(), 2.0, save]),
            (torch.ops.pnn_fast.pairwise_uniformity_bwd.default, [grad, x, 2.0, total, row_max, exps]),
            (torch.ops.pnn_fast.pairwise_uniformity_fwd.default, [x.clone().requires_grad_(), 2.0, save, keep]),
            (torch.ops.pnn_fast.pairwise_uniformity_bwd.default,
             [grad, x, 2.0, kept_total, kept_max, kept_exps, keep]),
        ]
    return cases


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kept", [0, 1, 2, 17, 40])
def test_kept_rows_give_the_uniformity_of_those_rows_alone(device, kept):
    """keep (bool [n]) gives the value and gradient of x[keep] in fixed shapes: the rows it drops get
    no gradient, and with fewer than two kept rows the value is 0."""
    gen = torch.Generator().manual_seed(kept)
    x = torch.randn(40, 5, dtype=torch.float64, generator=gen).to(device)
    keep = torch.zeros(40, dtype=torch.bool)
    keep[torch.randperm(40, generator=gen)[:kept]] = True
    keep = keep.to(device)
    got_x, want_x = x.clone().requires_grad_(), x[keep].clone().requires_grad_()
    got, want = ops.pairwise_uniformity(got_x, 1.5, keep), reference.pairwise_uniformity(want_x, 1.5)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    (got * 0.7).backward()
    if kept >= 2:
        (want * 0.7).backward()
        torch.testing.assert_close(got_x.grad[keep], want_x.grad, **TOLERANCE[torch.float64])
    assert not got_x.grad[~keep].any()


def pair_logits(x: torch.Tensor, t: float) -> torch.Tensor:
    """l_ij = -t ||x_i - x_j||^2 in float64 from the differences ([n, n, d] memory: tests only)."""
    x = x.double()
    return -t * (x[:, None, :] - x[None, :, :]).pow(2).sum(dim=-1)


@pytest.mark.parametrize("n", [2, 33, 200])
def test_saved_exponentials_are_each_rows_pairs_behind_its_max(n):
    """With save, the forward returns m_i = max_{j > i} l_ij and exp(l_ij - m_i) over j > i, packed
    row after row: checked against float64 logits from the differences."""
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(n))
    _, _, row_max, exps = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0, True)
    assert row_max.shape == (n,) and exps.shape == (n * (n - 1) // 2,) and exps.dtype == torch.float32
    logits = pair_logits(x, 2.0)
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    want_max = logits.masked_fill(~upper, float("-inf")).amax(dim=1)
    torch.testing.assert_close(row_max.double(), want_max, rtol=1e-5, atol=1e-5)
    want = (logits - want_max[:, None]).exp()[upper]  # row-major: row i's pairs j > i in order
    torch.testing.assert_close(exps.double(), want, rtol=1e-4, atol=1e-6)
    _, _, no_max, no_exps = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0, False)
    assert no_max.numel() == 0 and no_exps.numel() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saved_exponentials_give_the_recomputed_gradient_bit_for_bit(dtype, monkeypatch):
    """The backward from the forward's saved exponentials and the backward that computes them again
    (rows past the budget) give the same bits, on 1 and 2 threads, with a partial last block."""
    module = importlib.import_module("pnn_fast.ops.pairwise_uniformity")  # the package exports the function

    x = torch.randn(101, 19, dtype=dtype, generator=torch.Generator().manual_seed(7))

    def gradient(budget):
        monkeypatch.setattr(module, "SAVED_PAIRS_BUDGET", budget)
        xr = x.clone().requires_grad_()
        assert module.saves_pairs(xr) == (budget > 0)
        value = ops.pairwise_uniformity(xr, 2.0)
        return value, torch.autograd.grad(value, xr)[0]

    for threads in (1, 2):
        (saved_value, saved_grad), = under_thread_counts((threads,), lambda: gradient(1 << 23))
        (value, grad), = under_thread_counts((threads,), lambda: gradient(0))
        assert torch.equal(saved_value, value) and torch.equal(saved_grad, grad)
        assert grad.abs().max() > 0


def test_backward_allocates_nothing_of_the_saved_triangles_size():
    """The forward's saved exponentials are outputs that need no gradient; autograd must not hand the
    backward a zero tensor of their size (a fill of the whole triangle on every step)."""
    from torch.profiler import ProfilerActivity, profile

    n, dim = 300, 8
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(3)).requires_grad_()
    value = ops.pairwise_uniformity(x, 2.0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        value.backward()
    triangle_bytes = 4 * n * (n - 1) // 2
    largest = max(event.cpu_memory_usage for event in prof.events())
    # the backward's own buffers are O(n d) and a [32, n - 1] block of weights, far below the triangle
    assert 0 < largest < triangle_bytes // 2, f"the backward allocated {largest} bytes at once"
    assert x.grad.abs().max() > 0


def test_malformed_saved_exponentials_are_a_clear_error():
    x = torch.randn(10, 3)
    _, total, row_max, exps = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0, True)
    grad = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="saved_row_max and saved_exps must be the forward's"):
        torch.ops.pnn_fast.pairwise_uniformity_bwd(grad, x, 2.0, total, row_max, exps[:-1])
    with pytest.raises(RuntimeError, match="saved_row_max and saved_exps must be the forward's"):
        torch.ops.pnn_fast.pairwise_uniformity_bwd(grad, x, 2.0, total, row_max.double(), exps)


def test_bad_input_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no kernels for device type 'meta'"):
        ops.pairwise_uniformity(torch.zeros(3, 2, device="meta"), 2.0)
    with pytest.raises(RuntimeError, match=r"x must be a floating-point \[n, d\] tensor"):
        ops.pairwise_uniformity(torch.zeros(3), 2.0)
    with pytest.raises(RuntimeError, match="t must be finite"):
        ops.pairwise_uniformity(torch.zeros(3, 2), float("nan"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradient_is_off_only_by_its_own_rounding(device, dtype):
    """The backward weights exp(l_ij - L) use the forward's float64 L, not L rebuilt from the loss
    rounded to x's dtype: with the loss near -20 (a bf16 ulp of 0.125 there) that rounding alone
    would scale every gradient by up to 6%. What remains is the rounding of each gradient entry to
    x's dtype, at most half an ulp."""
    x = (torch.randn(30, 8, generator=torch.Generator().manual_seed(4)) * 1.0).to(dtype).to(device)
    value = ops.pairwise_uniformity(x.requires_grad_(), 2.0)
    assert value.item() < -8  # a loss whose rounding in x's dtype is far coarser than the gradients'
    grad = torch.autograd.grad(value, x)[0].double()
    x64 = x.detach().double().requires_grad_()
    want = torch.autograd.grad(ops.pairwise_uniformity(x64, 2.0), x64)[0]
    half_ulp = torch.finfo(dtype).eps / 2
    tiny = torch.finfo(dtype).tiny  # entries that underflow in the low precision
    assert ((grad - want).abs() <= half_ulp * want.abs() * 1.01 + 4 * tiny + 1e-6 * want.abs().max()).all()
