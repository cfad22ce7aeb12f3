"""lowest_k_mask, each row's k lowest scores (SL's split of its 800 sampled negatives into PNN's
classes): reference against fused.

reference: ``reference.lowest_k_mask``, a stable argsort of each row and a scatter of the ranks;
fused: ``ops.lowest_k_mask``, a selection per row (a quickselect on the CPU, a block's radix select
on CUDA). Inputs: float32 [2048, 800], the rows' cosines
to their SL negatives (the batch's users and 800 sampled unknown items, both tables L2-normalised),
and k [2048], each row's negative class size by PNN's proportional rule (the users' known items
over the unknown ones, times 800). Result: the bool [2048, 800], exactly.
"""
import pytest
import torch.nn.functional as F
from _op_bench import BACKENDS, DEVICES, NUM_ITEMS, SL_PER_ROW, check_then_time, ml1m_batch, ops

from pnn_fast.backends import reference
from pnn_fast.backends.rows import negative_class_size


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_lowest_k_mask(benchmark, device, backend):
    batch = ml1m_batch(device)
    _, ids = batch.draws(SL_PER_ROW)
    cosines = ops.gathered_dots(F.normalize(batch.user_emb, dim=-1), F.normalize(batch.item_table, dim=-1), ids)
    unlabeled = ids.new_full((ids.shape[0],), SL_PER_ROW)
    k = negative_class_size(unlabeled, batch.known.count(batch.users), NUM_ITEMS, "proportional")
    check_then_time(benchmark, device, backend, reference.lowest_k_mask, ops.lowest_k_mask, (cosines, k))
