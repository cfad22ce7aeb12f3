"""The two implementations of every term, and the choice between them.

* :mod:`~pnn_fast.backends.reference`: pure PyTorch, written for clarity; the test oracle.
* :mod:`~pnn_fast.backends.fused`: the same functions on the compiled kernels (:mod:`pnn_fast.ops`),
  present only when the extension was built.

Both modules offer the same functions with the same signatures, so a caller asks :func:`select`
for a module once and calls it; :mod:`~pnn_fast.backends.rows` holds what they share.
"""
from __future__ import annotations

from types import ModuleType

import torch

from .. import _extension
from . import reference

if _extension.has_kernels("cpu"):
    from . import fused
else:  # no compiled extension: "auto" falls back to the reference (one warning at import)
    fused = None

#: the accepted ``backend=`` arguments
NAMES = ("auto", "reference", "cpu", "cuda")


def check_name(backend: str) -> str:
    """``backend`` itself, or a ValueError naming the argument and the choices."""
    if backend not in NAMES:
        raise ValueError(f"backend must be one of {NAMES}, got {backend!r}")
    return backend


def select(backend: str, device: torch.device) -> ModuleType:
    """The module implementing the terms for ``backend`` on ``device``.

    "auto" takes the fused kernels when they were built for the device type and the reference
    otherwise; "cpu"/"cuda" demand the fused kernels of that device type (RuntimeError saying
    how to rebuild when they are missing).
    """
    check_name(backend)
    device = torch.device(device)
    if backend == "reference":
        return reference
    if backend == "auto":
        return fused if _extension.has_kernels(device.type) else reference
    if device.type != backend:
        raise ValueError(f"backend={backend!r} but the inputs are on {device}; move them or use backend='auto'")
    _extension.require_kernels(device)
    return fused


__all__ = ["NAMES", "check_name", "fused", "reference", "select"]
