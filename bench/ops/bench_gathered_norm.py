"""gathered_norm, the Frobenius norm of gathered table rows (an EmbLoss term): reference against fused.

reference: ``reference.gathered_norm``, a [16384, 64] gather and its norm; fused: ``ops.gathered_norm``,
no gather. Inputs: item_table float32 [3706, 64], ids int64 [2048, 8] (the BPR negatives, the largest of
EmbLoss's three terms). Result: a float32 scalar, to rounding; forward, and forward + backward to
item_table (dense gradient).
"""
import pytest
from _op_bench import BACKENDS, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_norm(benchmark, device, passes, backend):
    batch = ml1m_batch(device)
    check_then_time(benchmark, device, backend, reference.gathered_norm, ops.gathered_norm,
                    (batch.item_table, batch.sampled_items), passes=passes, wrt=(0,))
