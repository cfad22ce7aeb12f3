"""history_sample, a uniform subset of min(N_u, L) known items per user (Floyd's algorithm): reference against fused.

reference: ``reference.history_sample``, L vectorised steps over the batch, each comparing with the earlier
picks; fused: ``ops.history_sample``, per row. Inputs: users int64 [2048], draws float32 [2048, 50] in
[0, 1), 6,040 users knowing 165 of 3,706 items each (so every row takes the sampling path). Result,
compared exactly: item ids int64 [2048, 50]. Forward only.
"""
import pytest
from _op_bench import BACKENDS, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_history_sample(benchmark, device, backend):
    batch = ml1m_batch(device)
    check_then_time(benchmark, device, backend, reference.history_sample, ops.history_sample,
                    (batch.known, batch.users, batch.history_draws))
