"""A guard that fails on every read of a tensor's value by the host (issue 65, item 1).

On CUDA each such read is a synchronisation: the host waits for the device to drain. On the CPU
they cost nothing, so nothing shows them; this guard makes them visible to the CPU tests:

- a ``TorchDispatchMode`` sees the aten ops whose result the host must read:
  ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``float(t)``), ``nonzero``, ``unique``,
  ``masked_select`` and a copy to another device;
- Python-level patches see ``Tensor.tolist``, ``.cpu``, ``.numpy``, ``.item`` and ``bool``, which on
  the CPU read the memory without dispatching;
- the compiled ops' own checks count their read-backs (``pnn_fast._C.host_read_count``).
"""
from __future__ import annotations

import contextlib
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops whose output the host must read, or whose output shape depends on the data
READ_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten._unique2.default",
            "aten.unique_dim.default", "aten.unique_consecutive.default", "aten.masked_select.default",
            "aten.is_nonzero.default", "aten.equal.default"}
#: Tensor methods that read on the host without a dispatch on the CPU
READ_METHODS = ("tolist", "cpu", "numpy", "item", "__bool__")


class HostReads(TorchDispatchMode):
    """Records each host read as (what, where); :attr:`reads` after the block."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str]] = []

    def note(self, what: str) -> None:
        self.reads.append((what, "".join(traceback.format_stack(limit=6)[:-2])))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        to_other_device = name in ("aten._to_copy.default", "aten.copy_.default") and _crosses_devices(args, kwargs)
        if name in READ_OPS or to_other_device:
            self.note(name)
        return func(*args, **kwargs)


def _crosses_devices(args, kwargs) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    target = kwargs.get("device")
    devices = {t.device for t in tensors} | ({torch.device(target)} if target is not None else set())
    return len(devices) > 1


@contextlib.contextmanager
def host_reads():
    """Yields a :class:`HostReads` that holds, after the block, every host read made inside it,
    including the compiled ops' counted read-backs (as ``("pnn_fast C++ read-back", "")``)."""
    from pnn_fast._extension import host_read_count

    guard = HostReads()
    originals = {name: getattr(torch.Tensor, name) for name in READ_METHODS}

    def patched(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            guard.note(f"Tensor.{name}")
            return original(self, *args, **kwargs)
        return method

    before = host_read_count()
    try:
        for name in READ_METHODS:
            setattr(torch.Tensor, name, patched(name))
        with guard:
            yield guard
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    guard.reads += [("pnn_fast C++ read-back", "")] * (host_read_count() - before)
