"""pairwise_uniformity, L_uniform = log mean_{i != j} exp(-t ||x_i - x_j||^2): reference against fused.

reference: ``reference.pairwise_uniformity``, a [n, n] distance matrix and a log-sum-exp over it; fused:
``ops.pairwise_uniformity``, O(n d) memory and, on the CPU when x requires grad, the n (n - 1) / 2
exponentials its forward keeps for the backward. Input: x float32 [2048, 64], 2048 distinct item embeddings
normalised to unit length (as PNNLoss does by default), t = 2 (the paper's). Result: a float32 scalar,
to rounding; forward, and forward + backward to x.
"""
import pytest
import torch.nn.functional as F
from _op_bench import BACKENDS, BATCH, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference

TEMPERATURE = 2.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_pairwise_uniformity(benchmark, device, passes, backend):
    x = F.normalize(ml1m_batch(device).item_table[:BATCH], dim=1)
    check_then_time(benchmark, device, backend, reference.pairwise_uniformity, ops.pairwise_uniformity,
                    (x, TEMPERATURE), passes=passes, wrt=(0,))
