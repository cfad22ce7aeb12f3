"""csr_spmm, the graph models' propagation: torch's CSR product against the kernel.

reference: ``reference.csr_spmm``, torch's product (MKL on the CPU) and, for the addend and the
divisor, torch's add and div; fused: ``fused.csr_spmm``, the ``csr_spmm`` kernel on the CPU (the
reference elsewhere). Input: LightGCN's normalised adjacency of Gowalla's per-user 8:1:1 training
split (70,839 nodes, 1.69 M stored entries) and a Gaussian float32 [70839, 64] table. Two cases:

* one product ``A_hat @ x``, with the symmetric matrix's backward (the same product);
* LightGCN's whole propagation in training, ``models.graph.layer_mean`` with 2 layers, forward and
  backward: what one training step of LightGCN on Gowalla spends outside its loss.

Needs ``gowalla`` in the data folder (``pnn_fast.data.default_data_dir()``).
"""
import functools

import pytest
import torch
from _op_bench import BACKENDS, DEVICES, DIM, PASSES, check_then_time

from pnn_fast import backends
from pnn_fast.data import default_data_dir, load_dataset
from pnn_fast.models.graph import NormalizedAdjacency, layer_mean


@functools.lru_cache(maxsize=1)
def gowalla_adjacency() -> NormalizedAdjacency:
    folder = default_data_dir() / "gowalla"
    if not folder.is_dir():
        pytest.skip(f"gowalla not found under {folder.parent}")
    data = load_dataset(folder, split="rs")
    (users, items), num_users, num_items = data.train, data.num_users, data.num_items
    return NormalizedAdjacency(users, items, num_users, num_items)


class _Layer(torch.autograd.Function):
    """``product(adj, x)`` with the symmetric adjacency's backward ``product(adj, grad)``, as models.graph's."""

    @staticmethod
    def forward(ctx, product, adj, x):
        ctx.product, ctx.adj = product, adj
        return product(adj, x)

    @staticmethod
    def backward(ctx, grad):
        return None, None, ctx.product(ctx.adj, grad)


#: one product with its backward, or LightGCN's whole propagation (2 layers) in training
CASES = ("one-product", "layer-mean-2")


def propagation(case: str, backend: str):
    """``case`` on ``backend`` ("reference" or "auto", the fused kernel): (CSR buffers, x [n, d]) -> [n, d]."""
    def propagate(parts, x):
        adj = torch.sparse_csr_tensor(*parts, (x.shape[0], x.shape[0]), check_invariants=False)
        if case == "layer-mean-2":
            return layer_mean(adj, x, 2, backend)
        return _Layer.apply(backends.select(backend, x.device).csr_spmm, adj, x)
    return propagate


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_csr_spmm_gowalla_adjacency(benchmark, device, case, passes, backend):
    adj = gowalla_adjacency().to(device)
    x = torch.randn(adj.num_nodes, DIM, generator=torch.Generator().manual_seed(4)).to(device)
    parts = (adj.crow_indices, adj.col_indices, adj.values)
    check_then_time(benchmark, device, backend, propagation(case, "reference"), propagation(case, "auto"), (parts, x),
                    passes=passes, wrt=(1,))
