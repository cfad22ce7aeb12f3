"""gathered_dots, out[b, k] = <rows[b], table[ids[b, k]]>: reference against fused.

reference: ``reference.gathered_dots``, a [2048, 8, 64] gather, products and a sum; fused:
``ops.gathered_dots``, no gather. Inputs: rows float32 [2048, 64] (the users' embeddings), table float32
[3706, 64] (the items'), ids int64 [2048, 8] (unknown items per row). Result: float32 [2048, 8], to
rounding; forward, and forward + backward to rows and table (dense gradient).
"""
import pytest
from _op_bench import BACKENDS, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots(benchmark, device, passes, backend):
    batch = ml1m_batch(device)
    check_then_time(benchmark, device, backend, reference.gathered_dots, ops.gathered_dots,
                    (batch.user_emb, batch.item_table, batch.sampled_items), passes=passes, wrt=(0, 1))
