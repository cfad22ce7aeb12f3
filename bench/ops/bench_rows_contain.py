"""rows_contain, whether each ranked item is among its user's held-out items (the evaluator's
relevance lookup): reference against fused.

reference: ``reference.rows_contain``, one searchsorted over the rows' concatenated (row, item)
keys; fused: ``ops.rows_contain``, a binary search in each user's row.  Inputs: the batch's 2048
users, each with its top 20 items by score (``masked_topk``, nothing excluded) looked up among
its known items (165 on average), so that both answers occur.  Result: the bool [2048, 20], exactly.
"""
import pytest
from _op_bench import BACKENDS, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_rows_contain(benchmark, device, backend):
    batch = ml1m_batch(device)
    _, top = ops.masked_topk(batch.user_table[batch.users] @ batch.item_table.T, batch.users, [], 20)
    check_then_time(benchmark, device, backend, reference.rows_contain, ops.rows_contain, (batch.known, batch.users, top))
