"""unknown_items, uniform draws mapped to items the user does not know (the sampler): reference against fused.

reference: ``reference.unknown_items``, one global searchsorted over every user's gap keys; fused:
``ops.unknown_items``, binary searches in the user's own row (8 draws a row) or a rank index of it (800).
Inputs: users int64 [2048], draws float32 [2048, K] in [0, 1), K = 8 (DNS, sampled PNN) and 800 (SL),
6,040 users knowing 165 of 3,706 items each. Result, compared exactly: item ids int64 [2048, K]. Forward only.
"""
import pytest
from _op_bench import BACKENDS, DEVICES, PER_ROW, SL_PER_ROW, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_row", [PER_ROW, SL_PER_ROW])
@pytest.mark.parametrize("device", DEVICES)
def test_unknown_items(benchmark, device, per_row, backend):
    batch = ml1m_batch(device)
    draws, _ = batch.draws(per_row)
    check_then_time(benchmark, device, backend, reference.unknown_items, ops.unknown_items,
                    (batch.known, batch.users, draws))
