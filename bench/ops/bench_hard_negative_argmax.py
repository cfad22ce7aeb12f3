"""hard_negative_argmax, each row's hardest unlabeled candidate: reference against fused.

reference: ``reference.row_scores`` (float32 [B, C] scores), ``reference.unlabeled_mask`` (bool [B, C]) and
``reference.hard_negative``, composed as ``reference.hard_negative_bpr`` composes them; fused:
``ops.hard_negative_argmax``, which scores row by row and builds nothing of size [B, C].
Inputs: user_emb float32 [2048, 64], item_table float32 [3706, 64], users and pos_items int64 [2048],
candidates int64 [2048] (the batch's positives, shared by every row) or [2048, 8] (unknown items per row).
Results, compared exactly: the hard negative's candidate index and |U_b|, int64 [2048] each. Forward only.
"""
import pytest
from _op_bench import BACKENDS, CANDIDATES, DEVICES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference


def reference_hard_negative_argmax(user_emb, item_table, users, pos_items, candidates, known):
    """``(hard, num_unlabeled)`` as ``ops.hard_negative_argmax`` returns them, from reference.py's [B, C] matrices."""
    scores = reference.row_scores(user_emb, item_table, candidates)
    unlabeled = reference.unlabeled_mask(known, users, pos_items, candidates)
    return reference.hard_negative(scores, unlabeled), unlabeled.sum(dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("candidates", CANDIDATES)
@pytest.mark.parametrize("device", DEVICES)
def test_hard_negative_argmax(benchmark, device, candidates, backend):
    args = ml1m_batch(device).row_args(candidates)
    check_then_time(benchmark, device, backend, reference_hard_negative_argmax, ops.hard_negative_argmax, args)
