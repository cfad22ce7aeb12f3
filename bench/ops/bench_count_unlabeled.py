"""count_unlabeled, each row's number of unlabeled candidates |U_b|: reference against fused.

reference: the row sums of ``reference.unlabeled_mask`` (bool [B, C], one global searchsorted over the
known (user, item) keys); fused: ``ops.count_unlabeled``, a search in each user's own row, no scoring.
Inputs: users and pos_items int64 [2048], candidates int64 [2048] (the batch's positives, shared by every
row) or [2048, 8] (unknown items per row); the float32 embeddings [2048, 64] and [3706, 64] only fix the
device. Result, compared exactly: int64 [2048]. Forward only.
"""
import pytest
from _op_bench import BACKENDS, CANDIDATES, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


def reference_count_unlabeled(user_emb, item_table, users, pos_items, candidates, known):
    """``|U_b|`` from reference.py's unlabeled mask, with the arguments of ``ops.count_unlabeled``."""
    return reference.unlabeled_mask(known, users, pos_items, candidates).sum(dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("candidates", CANDIDATES)
@pytest.mark.parametrize("device", DEVICES)
def test_count_unlabeled(benchmark, device, candidates, backend):
    args = ml1m_batch(device).row_args(candidates)
    check_then_time(benchmark, device, backend, reference_count_unlabeled, ops.count_unlabeled, args)
