"""pnn_fast::count_unlabeled, each row's number of unlabeled candidates |U_b| without scoring (not
differentiable): against the reference, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, make_batch, raw_args, requires_kernels, row_args
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grid", [True, False])
@pytest.mark.parametrize("per_row", [None, 7])
def test_count_unlabeled_matches_reference(device, per_row, grid):
    """Shared and per-row candidates, repeated (grid) and distinct ones; users who know many of the
    150 items, so that rows with few unlabeled candidates are common."""
    batch = make_batch(128, 8, per_row=per_row, grid=grid, num_users=40, num_items=150, known_per_user=20, seed=3,
                       device=device)
    # make_batch's (user, positive) pairs are known ones; rolled, most positives are not known to their
    # row's user, so that excluding the positive and excluding the known items are both tested
    batch["pos_items"] = batch["pos_items"].roll(1)
    unlabeled = reference.unlabeled_mask(batch["known"], batch["users"], batch["pos_items"], batch["candidates"])
    count = ops.count_unlabeled(*row_args(batch))
    assert count.dtype == torch.int64
    assert torch.equal(count, unlabeled.sum(dim=1))


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    batch = make_batch(10, 5, per_row=4, num_items=20, seed=5, device=device)
    return [(torch.ops.pnn_fast.count_unlabeled.default, raw_args(batch))]


def test_kernel_preconditions_are_clear_errors():
    args = raw_args(make_batch(6, 4, seed=6))
    with pytest.raises(RuntimeError, match="pos_items must be Long"):
        torch.ops.pnn_fast.count_unlabeled(*args[:3], args[3].int(), *args[4:])
    with pytest.raises(RuntimeError, match="candidates must be"):
        torch.ops.pnn_fast.count_unlabeled(*args[:4], args[4][None, None], *args[5:])
