"""masked_logsumexp, the sampled softmax losses' denominators over a pool shared by the batch: reference
against fused.

reference: ``reference.masked_logsumexp``, the scale, the shift, two masked fills and torch.logsumexp
with their autograd (about fifteen passes over [B, M] buffers); fused: ``ops.masked_logsumexp``, one
pass forward and one backward. Input: the mixed negatives of the Gowalla study's step (``sl-t01-mixed-logq``:
B = 2048 rows, the batch's 2048 positives and a pool of 800 uniform items, M = 2848), cosines in
[-1, 1], temperature 0.1, a logQ shift, 1% of the entries excluded (known items); float32 [B], to
rounding; forward, and forward + backward.
"""
import pytest
import torch
from _op_bench import BACKENDS, DEVICES, PASSES, check_then_time, ops

from pnn_fast.backends import reference

ROWS, POOL = 2048, 2048 + 800


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_masked_logsumexp_mixed_pool(benchmark, device, passes, backend):
    gen = torch.Generator().manual_seed(3)
    cosines = (torch.rand(ROWS, POOL, generator=gen) * 2 - 1).to(device)
    shift = (torch.rand(POOL, generator=gen) * 4 - 12).to(device)
    excluded = (torch.rand(ROWS, POOL, generator=gen) < 0.01).to(device)
    check_then_time(benchmark, device, backend, lambda x: reference.masked_logsumexp(x, 10.0, shift, excluded),
                    lambda x: ops.masked_logsumexp(x, 10.0, shift, excluded), (cosines,), passes=passes, wrt=(0,))
