"""unit_rows, F.normalize(x, dim=-1) of a whole table (sampled softmax's cosines): reference against fused.

reference: ``reference.unit_rows``, F.normalize and its autograd (about ten passes over [n, d] buffers);
fused: ``ops.unit_rows``, one pass forward and one backward. Input: Gowalla's item table, float32
[40981, 64], Gaussian. Result: float32 [40981, 64], to rounding; forward, and forward + backward.
"""
import pytest
import torch
from _op_bench import BACKENDS, DEVICES, DIM, GOWALLA_ITEMS, PASSES, check_then_time, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_unit_rows_gowalla_table(benchmark, device, passes, backend):
    table = torch.randn(GOWALLA_ITEMS, DIM, generator=torch.Generator().manual_seed(3)).to(device)
    check_then_time(benchmark, device, backend, reference.unit_rows, ops.unit_rows, (table,), passes=passes, wrt=(0,))
