"""pnn_fast::csr_spmm, a CSR matrix times a dense table (the graph models' propagation): bit for bit
the stored-order sum it documents, against float64 dense products and torch's own CSR product on
continuous random matrices (rectangular, empty rows, long-tailed degrees), every float dtype,
thread-count independence, the backends' product and gradient through models.graph, opcheck, and bad
input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, requires_kernels, under_thread_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.csr import CSR
from pnn_fast.models.graph import layer_mean, sparse_matmul

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops
    from pnn_fast.backends import fused


def random_csr(rows: int, cols: int, density: float, gen: torch.Generator, dtype=torch.float64) -> CSR:
    """A CSR [rows, cols] with continuous values: each row's density drawn from a long tail (some
    rows empty, some far denser than the mean), entries Gaussian of assorted scales."""
    row_density = density * -torch.rand(rows, 1, generator=gen, dtype=torch.float64).log()  # exponential
    row_density[:: 7] = 0  # empty rows
    mask = torch.rand(rows, cols, generator=gen) < row_density
    r, c = mask.nonzero(as_tuple=True)
    values = (torch.randn(r.numel(), generator=gen, dtype=torch.float64)
              * torch.logspace(-2, 2, r.numel(), dtype=torch.float64)[torch.randperm(r.numel(), generator=gen)])
    return CSR.from_pairs(r, c, rows, cols, values.to(dtype))


def dense(csr: CSR) -> torch.Tensor:
    out = torch.zeros(csr.num_rows, csr.num_cols, dtype=csr.values.dtype)
    rows = torch.repeat_interleave(torch.arange(csr.num_rows), csr.indptr.diff())
    out[rows, csr.indices] = csr.values
    return out


def stored_order_sum(csr: CSR, x: torch.Tensor, addend=None, divisor=1.0) -> torch.Tensor:
    """The op's documented result, written as a loop: per row, acc = acc + value * x[col] in stored
    order, each product and sum rounded to the accumulation dtype (float32 for 16-bit inputs), then
    (addend + acc) / divisor, rounded once to x's dtype."""
    acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.zeros(csr.num_rows, x.shape[1], dtype=acc_dtype)
    for r in range(csr.num_rows):
        for e in range(int(csr.indptr[r]), int(csr.indptr[r + 1])):
            out[r] = out[r] + csr.values[e].to(acc_dtype) * x[csr.indices[e]].to(acc_dtype)
    if addend is not None:
        out = addend.to(acc_dtype) + out
    if divisor != 1:
        out = out / torch.tensor(divisor, dtype=acc_dtype)
    return out.to(x.dtype)


def spmm(csr: CSR, x: torch.Tensor, addend=None, divisor=1.0) -> torch.Tensor:
    return ops.csr_spmm(csr.indptr, csr.indices, csr.values, x, addend, divisor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 7, 64, 130])
@pytest.mark.parametrize("with_addend, divisor", [(False, 1.0), (True, 1.0), (True, 3.0), (False, 0.7)])
def test_csr_spmm_is_the_stored_order_sum_bit_for_bit(dtype, d, with_addend, divisor):
    gen = torch.Generator().manual_seed(d)
    csr = random_csr(60, 45, 0.2, gen, dtype)
    x = torch.randn(45, d, generator=gen).to(dtype)
    addend = torch.randn(60, d, generator=gen).to(dtype) if with_addend else None
    got = spmm(csr, x, addend, divisor)
    assert got.dtype == dtype and got.shape == (60, d)
    assert torch.equal(got, stored_order_sum(csr, x, addend, divisor))


@pytest.mark.parametrize("d", [1, 7, 64, 257])
def test_csr_spmm_matches_dense_and_torch_products(d):
    gen = torch.Generator().manual_seed(100 + d)
    csr = random_csr(300, 170, 0.05, gen)
    x = torch.randn(170, d, generator=gen, dtype=torch.float64)
    want = dense(csr) @ x
    torch.testing.assert_close(spmm(csr, x), want, rtol=1e-12, atol=1e-12)
    adj = torch.sparse_csr_tensor(csr.indptr, csr.indices, csr.values, (300, 170), check_invariants=True)
    torch.testing.assert_close(fused.csr_spmm(adj, x), reference.csr_spmm(adj, x), rtol=1e-12, atol=1e-12)
    addend = torch.randn(300, d, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(fused.csr_spmm(adj, x, addend, 3.0), (addend + want) / 3, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference.csr_spmm(adj, x, addend, 3.0), (addend + want) / 3, rtol=1e-12, atol=1e-12)
    # float32: within torch's own product's rounding of the float64 result
    x32, adj32 = x.float(), torch.sparse_csr_tensor(csr.indptr, csr.indices, csr.values.float(), (300, 170),
                                                            check_invariants=True)
    err_fused = (fused.csr_spmm(adj32, x32).double() - want).abs().max()
    err_torch = (reference.csr_spmm(adj32, x32).double() - want).abs().max()
    assert err_fused <= 2 * err_torch + 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_spmm_on_each_device_is_within_rounding_of_the_exact_result(device, dtype):
    """The CPU kernel and the CUDA one (fused multiply-adds) each within the first-order rounding bound
    of ``(addend + A @ x) / divisor`` computed in float64, on a long-tailed graph-like matrix; and the
    index check on each device."""
    gen = torch.Generator().manual_seed(31)
    csr = random_csr(700, 500, 0.03, gen, dtype)
    x = torch.randn(500, 64, generator=gen, dtype=torch.float64).to(dtype)
    addend = torch.randn(700, 64, generator=gen, dtype=torch.float64).to(dtype)
    got = ops.csr_spmm(*(t.to(device) for t in (csr.indptr, csr.indices, csr.values, x, addend)), 3.0).cpu().double()
    a = dense(csr).double()
    want = (addend.double() + a @ x.double()) / 3
    u = torch.finfo(dtype).eps / 2
    n = int(csr.indptr.diff().max()) + 2
    bound = 2 * n * u / (1 - n * u) * (addend.double().abs() + a.abs() @ x.double().abs()) / 3
    assert bool(((got - want).abs() <= bound).all())
    bad = csr.indices.clone()
    bad[5] = 500
    with pytest.raises(RuntimeError, match=r"csr_spmm: indices has ids outside \[0, 500\)"):
        ops.csr_spmm(*(t.to(device) for t in (csr.indptr, bad, csr.values, x)))


@settings(suppress_health_check=list(HealthCheck), max_examples=40, deadline=None)
@given(rows=st.integers(0, 80), cols=st.integers(1, 80), d=st.integers(0, 70), density=st.floats(0.001, 0.6),
       double=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_csr_spmm_property_within_the_rounding_bound_of_the_exact_product(rows, cols, d, density, double, seed):
    """Any shape (no rows, no columns of x, a single column), any density: each entry within the
    first-order bound of a stored-order float sum, gamma_{n} * sum |value| |x|, of the float64 product."""
    dtype = torch.float64 if double else torch.float32
    gen = torch.Generator().manual_seed(seed)
    csr = random_csr(rows, cols, density, gen, dtype) if rows else CSR(torch.zeros(1, dtype=torch.long),
                                                                          torch.zeros(0, dtype=torch.long), 0, cols,
                                                                          torch.zeros(0, dtype=dtype))
    x = torch.randn(cols, d, generator=gen, dtype=torch.float64).to(dtype)
    got = spmm(csr, x).double()
    a, xd = dense(csr).double(), x.double()
    u = torch.finfo(dtype).eps / 2
    n = max(int(csr.indptr.diff().max()) if rows else 0, 1)
    bound = 2 * n * u / (1 - n * u) * (a.abs() @ xd.abs()) + 2 * torch.finfo(dtype).tiny
    assert got.shape == (rows, d)
    assert bool(((got - a @ xd).abs() <= bound).all())


def test_csr_spmm_results_do_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(7)
    csr = random_csr(4000, 3000, 0.01, gen, torch.float32)
    x = torch.randn(3000, 64, generator=gen)
    results = under_thread_counts((1, 2, 3), lambda: spmm(csr, x))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_graph_propagation_on_the_kernel_has_the_dense_gradient():
    """models.graph.sparse_matmul (forward and transpose-product backward) runs on fused.csr_spmm on
    the CPU, for a symmetric and for a non-symmetric matrix with its transpose."""
    gen = torch.Generator().manual_seed(8)
    m = dense(random_csr(50, 50, 0.1, gen))
    for a in (m, m + m.T):
        x = torch.randn(50, 9, dtype=torch.float64, generator=gen, requires_grad=True)
        w = torch.randn(50, 9, dtype=torch.float64, generator=gen)
        (sparse_matmul(a.to_sparse_csr(), x, a.T.to_sparse_csr()) * w).sum().backward()
        torch.testing.assert_close(x.grad, a.T @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_layers", [0, 1, 2, 3, 5])
def test_layer_mean_is_the_mean_of_the_layers_and_has_its_gradient(n_layers):
    """layer_mean's Horner form (products that add ego and, last, divide) against the layers summed one
    by one, value and gradient, on a symmetric matrix of continuous values, on each backend; and gradcheck."""
    gen = torch.Generator().manual_seed(20 + n_layers)
    m = dense(random_csr(70, 70, 0.08, gen))
    a = m + m.T
    a = a / a.abs().sum(dim=1).max()  # spectral radius at most 1, as the normalised adjacency's
    adj = a.to_sparse_csr()
    ego = torch.randn(70, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(70, 6, dtype=torch.float64, generator=gen)
    layers = [ego]
    for _ in range(n_layers):
        layers.append(a @ layers[-1])
    want = torch.stack(layers).mean(0)
    (want_grad,) = torch.autograd.grad((want * w).sum(), ego)
    for backend in ("auto", "reference", "cpu"):
        got = layer_mean(adj, ego, n_layers, backend)
        (got_grad,) = torch.autograd.grad((got * w).sum(), ego)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda e: layer_mean(adj, e, n_layers), (ego[:, :2].detach().clone().requires_grad_(),))


def test_csr_spmm_rejects_bad_input_by_name():
    indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    values, x = torch.ones(3), torch.ones(3, 4)
    with pytest.raises(RuntimeError, match=r"csr_spmm: x must be a floating-point \[n, d\] tensor"):
        ops.csr_spmm(indptr, indices, values, torch.ones(3))
    with pytest.raises(RuntimeError, match=r"csr_spmm: values must be Float, got Double"):
        ops.csr_spmm(indptr, indices, values.double(), x)
    with pytest.raises(RuntimeError, match=r"csr_spmm: values must have shape \[3\]"):
        ops.csr_spmm(indptr, indices, torch.ones(2), x)
    with pytest.raises(RuntimeError, match=r"csr_spmm: indices must be Long"):
        ops.csr_spmm(indptr, indices.int(), values, x)
    with pytest.raises(ValueError, match=r"csr_spmm: indptr must rise from 0 to the length of indices \(3\)"):
        ops.csr_spmm(torch.tensor([0, 2, 4]), indices, values, x)
    with pytest.raises(RuntimeError, match=r"csr_spmm: indices has ids outside \[0, 3\)"):
        ops.csr_spmm(indptr, torch.tensor([0, 3, 1]), values, x)
    with pytest.raises(RuntimeError, match=r"csr_spmm: indices has ids outside \[0, 3\)"):
        ops.csr_spmm(indptr, torch.tensor([0, -1, 1]), values, x)
    with pytest.raises(RuntimeError, match=r"csr_spmm: addend must have shape \[2, 4\]"):
        ops.csr_spmm(indptr, indices, values, x, torch.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"csr_spmm: addend must be Float"):
        ops.csr_spmm(indptr, indices, values, x, torch.ones(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"csr_spmm: divisor must be finite and non-zero, got 0"):
        ops.csr_spmm(indptr, indices, values, x, None, 0.0)


def opcheck_cases(device: str) -> list:
    """(op, args) without and with the addend and the divisor."""
    gen = torch.Generator().manual_seed(9)
    csr = random_csr(6, 5, 0.4, gen)
    x, addend = torch.randn(5, 3, dtype=torch.float64, generator=gen), torch.randn(6, 3, dtype=torch.float64, generator=gen)
    parts = [t.to(device) for t in (csr.indptr, csr.indices, csr.values)]
    op = torch.ops.pnn_fast.csr_spmm.default
    return [(op, [*parts, x.to(device)]), (op, [*parts, x.to(device), addend.to(device), 3.0])]
