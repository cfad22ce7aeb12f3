"""pnn_fast::ids_in_range: a loss's deferred check of its id arguments (``validate="deferred"``).

Called by :func:`pnn_fast._checks.ids_in_range`, which also serves the builds without kernels. The
op clamps the ids into [0, bound) and records an error in its device's flag when one was outside,
with no read-back (csrc/common/checks.h); :func:`pnn_fast.check_kernel_inputs` reads the flag.
"""
from __future__ import annotations

import torch


@torch.library.register_fake("pnn_fast::ids_in_range")
def _(ids, bound, op, name):
    return torch.empty_like(ids)
