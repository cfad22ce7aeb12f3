"""pnn_fast::hard_negative_argmax, each row's hardest unlabeled candidate (not differentiable):
against the reference on exact grid inputs and on continuous ones, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, make_batch, raw_args, reference_classes, requires_kernels, row_args
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 7])
def test_hard_negative_argmax(device, per_row):
    batch = make_batch(150, 9, per_row=per_row, dtype=torch.float32, num_items=50, seed=1, device=device)
    hard, num_unlabeled = ops.hard_negative_argmax(*row_args(batch))
    scores, unlabeled, _ = reference_classes(batch, torch.zeros(150, dtype=torch.long, device=device))
    assert torch.equal(hard, reference.hard_negative(scores, unlabeled))
    assert torch.equal(num_unlabeled, unlabeled.sum(dim=1))
    assert torch.equal(ops.count_unlabeled(*row_args(batch)), num_unlabeled)
    # the centroid pass finds the same hard negative
    assert torch.equal(ops.class_centroids(*row_args(batch), torch.ones_like(hard))[6], hard)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 7])
def test_hard_negative_argmax_on_continuous_inputs(device, per_row):
    """float64 scores off the grid, distinct candidates in each row: the same argmax as the reference."""
    batch = make_batch(150, 33, per_row=per_row, seed=2, device=device)
    hard, num_unlabeled = ops.hard_negative_argmax(*row_args(batch))
    scores, unlabeled, _ = reference_classes(batch, torch.zeros(150, dtype=torch.long, device=device))
    assert bool((hard >= 0).any())
    assert torch.equal(hard, reference.hard_negative(scores, unlabeled))
    assert torch.equal(num_unlabeled, unlabeled.sum(dim=1))


def test_empty_batch_and_no_candidates():
    batch = make_batch(5, 3, per_row=2, seed=7)
    empty = dict(batch, user_emb=batch["user_emb"][:0], users=batch["users"][:0], pos_items=batch["pos_items"][:0],
                 candidates=batch["candidates"][:0])
    hard, count = ops.hard_negative_argmax(*row_args(empty))
    assert hard.shape == (0,) and count.shape == (0,)
    no_cands = dict(batch, candidates=batch["candidates"][:, :0])
    hard, count = ops.hard_negative_argmax(*row_args(no_cands))
    assert hard.tolist() == [-1] * 5 and count.tolist() == [0] * 5


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    batch = make_batch(10, 5, per_row=4, num_items=20, seed=5, device=device)
    return [(torch.ops.pnn_fast.hard_negative_argmax.default, raw_args(batch))]


def test_kernel_preconditions_are_clear_errors():
    args = raw_args(make_batch(6, 4, seed=6))
    with pytest.raises(RuntimeError, match="users must be Long"):
        torch.ops.pnn_fast.hard_negative_argmax(args[0], args[1], args[2].int(), *args[3:])
    with pytest.raises(RuntimeError, match=r"item_table must have shape \[-1, 4\]"):
        torch.ops.pnn_fast.hard_negative_argmax(args[0], args[1][:, :3], *args[2:])


def test_mixed_devices_and_dtypes_are_clear_errors():
    batch = make_batch(8, 4, seed=17)
    with pytest.raises(TypeError, match="item_table has dtype torch.float32 but user_emb has torch.float64"):
        ops.hard_negative_argmax(*row_args(dict(batch, item_table=batch["item_table"].float())))
    with pytest.raises(ValueError, match="candidates is on meta but user_emb is on cpu"):
        ops.hard_negative_argmax(*row_args(dict(batch, candidates=batch["candidates"].to("meta"))))
