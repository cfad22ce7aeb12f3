"""masked_topk, each score row's k best columns with the user's known items excluded (the
evaluator's ranking): reference against fused.

reference: ``reference.masked_topk``, a masked copy of the scores and ``torch.topk``; fused:
``ops.masked_topk``, one pass per row. Inputs: the scores of the batch's 2048 users against all
3,706 items (float32 [2048, 3706], the evaluator's product), each user's 165 known items excluded,
k = 20. Result: the values and the item ids, exactly.
"""
import pytest
from _op_bench import BACKENDS, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_masked_topk(benchmark, device, backend):
    batch = ml1m_batch(device)
    scores = batch.user_table[batch.users] @ batch.item_table.T
    check_then_time(benchmark, device, backend, reference.masked_topk, ops.masked_topk,
                    (scores, batch.users, [batch.known], 20))
