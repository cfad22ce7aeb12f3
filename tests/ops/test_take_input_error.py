"""pnn_fast::take_input_error: (code, bound) of a device's first deferred input error, zeros when
none, and the flag cleared; the code's text names the op and the argument."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, requires_kernels
from pnn_fast import _extension, check_kernel_inputs

pytestmark = requires_kernels


@pytest.mark.parametrize("device", DEVICES)
def test_takes_the_first_error_once(device):
    check_kernel_inputs(device)
    like = torch.empty(0, device=device)
    assert torch.ops.pnn_fast.take_input_error(like).tolist() == [0, 0]
    torch.ops.pnn_fast.ids_in_range(torch.tensor([8], device=device), 3, "SomeLoss", "users")
    code, bound = torch.ops.pnn_fast.take_input_error(like).tolist()
    assert code > 0 and bound == 3
    assert _extension.input_error_message(code, bound) == "SomeLoss: users has ids outside [0, 3)"
    assert torch.ops.pnn_fast.take_input_error(like).tolist() == [0, 0]  # cleared


def test_an_unknown_code_is_refused():
    with pytest.raises(ValueError, match="no input error has code 999999"):
        _extension.input_error_message(999999, 1)


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op (with no error pending, every call gives zeros)."""
    return [(torch.ops.pnn_fast.take_input_error.default, [torch.empty(0, device=device)])]
