"""class_centroids, the mean embedding of each row's neutral and negative class: reference against fused.

reference: the classes of ``reference.pnn_row_terms``, from [B, C] scores, an unlabeled mask, a stable
sort for the k lowest-scored (``reference.bottom_k_mask``) and a masked matrix product per class; fused:
``ops.class_centroids``, one scoring pass per row. Inputs: user_emb float32 [2048, 64], item_table float32
[3706, 64], users and pos_items int64 [2048], candidates int64 [2048] (the batch's positives, shared by
every row) or [2048, 8] (unknown items per row), k int64 [2048] by PNNLoss's default "proportional" rule.
Results: the neutral and negative centroids float32 [2048, 64] (to rounding), the class sizes and the hard
negative int64 [2048] (exactly); forward, and forward + backward to item_table (dense [3706, 64]).
"""
import pytest
from _op_bench import BACKENDS, CANDIDATES, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference
from pnn_fast.backends.rows import negative_class_size

NEG_SIZE = "proportional"  # PNNLoss's default


def reference_class_centroids(user_emb, item_table, users, pos_items, candidates, known, k):
    """``(neutral, negative, num_neutral, num_negative, hard)`` as in ``reference.pnn_row_terms``."""
    cand_emb = reference.candidate_embeddings(item_table, candidates)
    scores = reference.row_scores(user_emb, item_table, candidates)
    unlabeled = reference.unlabeled_mask(known, users, pos_items, candidates)
    negative = reference.bottom_k_mask(scores, unlabeled, k)
    neutral = unlabeled & ~negative
    num_neutral, num_negative = neutral.sum(dim=1), negative.sum(dim=1)

    def centroid(mask, count):
        return reference.class_sum(mask.to(user_emb.dtype), cand_emb) / count.clamp_min(1)[:, None].to(user_emb.dtype)

    return (centroid(neutral, num_neutral), centroid(negative, num_negative), num_neutral, num_negative,
            reference.hard_negative(scores, unlabeled))


def fused_class_centroids(user_emb, item_table, users, pos_items, candidates, known, k):
    """``ops.class_centroids`` without its selection state (threshold, cutoff), which the reference lacks."""
    neutral, negative, num_neutral, num_negative, _, _, hard = ops.class_centroids(
        user_emb, item_table, users, pos_items, candidates, known, k)
    return neutral, negative, num_neutral, num_negative, hard


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("candidates", CANDIDATES)
@pytest.mark.parametrize("device", DEVICES)
def test_class_centroids(benchmark, device, candidates, passes, backend):
    batch = ml1m_batch(device)
    user_emb, item_table, users, pos_items, cands, known = batch.row_args(candidates)
    num_unlabeled = reference.unlabeled_mask(known, users, pos_items, cands).sum(dim=1)
    k = negative_class_size(num_unlabeled, known.count(users), known.num_items, NEG_SIZE)
    args = (user_emb, item_table, users, pos_items, cands, known, k)
    check_then_time(benchmark, device, backend, reference_class_centroids, fused_class_centroids, args,
                    passes=passes, wrt=(1,))
