"""embedding_bpr, BPR with RecBole's EmbLoss straight from the embedding tables: reference against fused.

reference: ``reference.embedding_bpr``, gathered [2048, 64] and [2048, 8, 64] rows, softplus and three
gathered norms; fused: ``ops.embedding_bpr``, one op each way. Inputs: user_table float32 [6040, 64],
item_table float32 [3706, 64], users and pos_items int64 [2048], neg_items int64 [2048, 8] (unknown items),
reg_weight 1e-4 (the trainer's default). Result: a float32 scalar, to rounding; forward, and forward +
backward to both tables (dense gradients).
"""
import pytest
from _op_bench import BACKENDS, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference

REG_WEIGHT = 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_embedding_bpr(benchmark, device, passes, backend):
    batch = ml1m_batch(device)
    args = (batch.user_table, batch.item_table, batch.users, batch.pos_items, batch.sampled_items, REG_WEIGHT)
    check_then_time(benchmark, device, backend, reference.embedding_bpr, ops.embedding_bpr, args,
                    passes=passes, wrt=(0, 1))
