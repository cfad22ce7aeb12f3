"""unknown_items, uniform draws mapped to items the user does not know (the sampler): reference against fused.

reference: ``reference.unknown_items``, one global searchsorted over every user's gap keys; fused:
``ops.unknown_items``, one binary search in the user's own row. Inputs: users int64 [2048], draws float32
[2048, 8] in [0, 1), 6,040 users knowing 165 of 3,706 items each. Result, compared exactly: item ids
int64 [2048, 8]. Forward only.
"""
import pytest
from _op_bench import BACKENDS, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_unknown_items(benchmark, device, backend):
    batch = ml1m_batch(device)
    check_then_time(benchmark, device, backend, reference.unknown_items, ops.unknown_items,
                    (batch.known, batch.users, batch.unknown_draws))
