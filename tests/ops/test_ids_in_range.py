"""pnn_fast::ids_in_range, a loss's deferred check of its ids: the ids clamped into [0, bound), a new
tensor, and an error recorded on the device (read by check_kernel_inputs) when one was outside."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, deferred_error, requires_kernels
from pnn_fast import check_kernel_inputs

pytestmark = requires_kernels


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_good_ids_come_back_equal_in_a_new_tensor(device, dtype):
    check_kernel_inputs(device)
    ids = torch.tensor([[0, 4], [2, 3]], dtype=dtype, device=device)
    out = torch.ops.pnn_fast.ids_in_range(ids, 5, "SomeLoss", "neg_items")
    assert torch.equal(out, ids) and out.dtype == dtype and out.data_ptr() != ids.data_ptr()
    check_kernel_inputs(device)  # nothing recorded


@pytest.mark.parametrize("device", DEVICES)
def test_bad_ids_are_clamped_and_recorded_first_error_kept(device):
    with deferred_error(r"^SomeLoss: users has ids outside \[0, 5\)$", device):
        out = torch.ops.pnn_fast.ids_in_range(torch.tensor([-3, 1, 9], device=device), 5, "SomeLoss", "users")
        torch.ops.pnn_fast.ids_in_range(torch.tensor([7], device=device), 6, "SomeLoss", "pos_items")  # second: kept out
    assert out.tolist() == [0, 1, 4]


def test_an_empty_range_with_ids_is_refused_at_once():
    with pytest.raises(ValueError, match=r"users holds 1 ids but the range \[0, 0\) is empty"):
        torch.ops.pnn_fast.ids_in_range(torch.tensor([0]), 0, "SomeLoss", "users")


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    ids = torch.tensor([[0, 4], [2, 3]], device=device)
    return [(torch.ops.pnn_fast.ids_in_range.default, [ids, 5, "SomeLoss", "neg_items"])]
