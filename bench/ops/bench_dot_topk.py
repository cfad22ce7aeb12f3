"""dot_topk, each user's k best items by dot product with the user's known items excluded (the CPU
evaluator's ranking of a batch): the product and masked_topk against the fused op.

reference: ``reference.masked_topk`` of ``user_rows @ item_table.T`` (the whole [2048, 3706] product,
a masked copy and ``torch.topk``); fused: ``ops.dot_topk``, the product block by block with each
user's top k kept across the blocks. Inputs: the batch's 2048 users against all 3,706 items, each
user's 165 known items excluded, k = 20 (the harness's grid makes every score exact, so both give
the same values and items). CPU only: on a GPU the evaluator ranks chunks with masked_topk.
"""
import pytest
from _op_bench import BACKENDS, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


def product_then_masked_topk(user_rows, item_table, users, exclude, k):
    return reference.masked_topk(user_rows @ item_table.T, users, exclude, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dot_topk(benchmark, backend):
    batch = ml1m_batch("cpu")
    check_then_time(benchmark, "cpu", backend, product_then_masked_topk, ops.dot_topk,
                    (batch.user_table[batch.users], batch.item_table, batch.users, [batch.known], 20))
