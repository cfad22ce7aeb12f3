"""class_terms, L_rank and L_constrain of each row from its class centroids: reference against fused.

reference: ``reference.class_terms``, some 25 ATen ops on [B, d] tensors forward and 35 backward (three
dots, two softplus, two F.normalize, the masks); fused: ``ops.class_terms``, one pass per row each way.
Inputs: user_emb float32 [2048, 64], pos_emb float32 [2048, 64] (the positives' rows), the neutral and
negative centroids float32 [2048, 64] of ``ops.class_centroids`` over 8 unknown items per row with
PNNLoss's "proportional" class sizes, noise float32 [2048, 64] in [0, 0.1) twice, valid bool [2048] and
num_negative int64 [2048]. Results: rank and constrain float32 [2048] (to rounding); forward, and
forward + backward to the four embeddings.
"""
import pytest
import torch
from _op_bench import BACKENDS, DEVICES, PASSES, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference
from pnn_fast.backends.rows import negative_class_size


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_class_terms(benchmark, device, passes, backend):
    batch = ml1m_batch(device)
    user_emb, item_table, users, pos_items, candidates, known = batch.row_args("per-row-8")
    num_unlabeled = ops.count_unlabeled(user_emb, item_table, users, pos_items, candidates, known)
    k = negative_class_size(num_unlabeled, known.count(users), known.num_items, "proportional")
    neutral, negative, _, num_negative, _, _, _ = ops.class_centroids(user_emb, item_table, users, pos_items,
                                                                      candidates, known, k)
    generator = torch.Generator().manual_seed(2)
    noise = [0.1 * torch.rand(user_emb.shape, generator=generator).to(device) for _ in range(2)]
    args = (user_emb, item_table[pos_items], neutral, negative, *noise, num_unlabeled > 0, num_negative)
    check_then_time(benchmark, device, backend, reference.class_terms, ops.class_terms, args, passes=passes,
                    wrt=(0, 1, 2, 3))
