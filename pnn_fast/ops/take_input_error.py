"""pnn_fast::take_input_error: the first deferred input error of a device, (code, bound) as int64 [2]
(zeros when none), which it clears. Read by :func:`pnn_fast.check_kernel_inputs` and by the trainer
with its epoch's loss; the code's text comes from :func:`pnn_fast._extension.input_error_message`.
"""
from __future__ import annotations

import torch


@torch.library.register_fake("pnn_fast::take_input_error")
def _(like):
    return like.new_empty(2, dtype=torch.int64)
