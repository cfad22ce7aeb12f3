"""Loading of the compiled kernels (``pnn_fast._C``) and a record of what they were built for.

Importing ``_C`` runs its ``TORCH_LIBRARY`` registrations, after which the kernels are reachable
as ``torch.ops.pnn_fast.*``.  setup.py writes ``_build_info.json`` beside ``_C`` when it builds
it; that file is read *before* ``_C`` is imported so that a build made against another torch
fails with a message naming both versions rather than an undefined-symbol error.

Without ``_C`` the package still works: one warning is issued here and the ``"auto"`` backend
of the losses falls back to the pure-PyTorch reference.
"""
from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import torch

_BUILD_INFO_FILE = Path(__file__).with_name("_build_info.json")
_BUILD_COMMAND = "pip install --no-build-isolation -e ."
_CUDA_BUILD_COMMAND = f"FORCE_CUDA=1 {_BUILD_COMMAND}"


def _load() -> dict:
    info = {"compiled": False, "with_cuda": False, "torch_version": None, "cuda_version": None,
            "cuda_arch_list": None}
    if importlib.util.find_spec(f"{__package__}._C") is None:
        info["reason"] = f"pnn_fast._C is not built (run `{_BUILD_COMMAND}` in the source tree)"
        warnings.warn(f"{info['reason']}; the pure-PyTorch reference backend will be used", RuntimeWarning,
                      stacklevel=3)
        return info
    recorded = json.loads(_BUILD_INFO_FILE.read_text()) if _BUILD_INFO_FILE.exists() else {}
    built_for = recorded.get("torch_version")
    if built_for is not None and built_for != torch.__version__:
        raise ImportError(f"pnn_fast._C was built against torch {built_for}, but torch {torch.__version__} is "
                          f"imported; rebuild it with `{_BUILD_COMMAND}` in this environment")
    from . import _C  # noqa: F401  (runs the TORCH_LIBRARY registrations)

    info.update(recorded)
    info["compiled"] = True
    return info


_INFO = _load()


def build_info() -> dict:
    """What the compiled kernels were built for.

    Keys: ``compiled`` (bool), ``with_cuda`` (bool), ``torch_version`` / ``cuda_version`` (those
    of the build, None when not compiled), ``cuda_arch_list`` (TORCH_CUDA_ARCH_LIST of the
    build), ``variant_reason`` (why setup.py chose the CPU or CUDA variant), ``debug``, ``sanitize``
    (the sanitizers of a SANITIZE= build, e.g. ``["address", "undefined"]``; absent from builds older
    than the switch) and, when not compiled, ``reason``.
    """
    return dict(_INFO)


def cpu_simd_level() -> str | None:
    """The instruction set the CPU kernels run with: ``"avx512"``, ``"avx2"`` or ``"baseline"`` (the
    build's own), None when ``_C`` is not compiled.  It is the CPU's widest, capped by the environment
    variable ``PNN_FAST_SIMD_LEVEL`` (``avx2`` or ``baseline``); every level gives the same bits."""
    if not _INFO["compiled"]:
        return None
    from . import _C
    return _C.simd_level()


def input_error_message(code: int, bound: int) -> str:
    """The text of the compiled ops' deferred input error ``code`` (csrc/common/checks.h), with the
    range [0, bound) when bound >= 0."""
    from . import _C
    return _C.input_error_message(int(code), int(bound))


def host_read_count() -> int:
    """How many read-backs the compiled ops' checks have made (each a synchronisation on CUDA);
    0 without the compiled kernels."""
    if not _INFO["compiled"]:
        return 0
    from . import _C
    return _C.host_read_count()


def has_kernels(device_type: str) -> bool:
    """Whether fused kernels exist for ``device_type`` ("cpu" or "cuda")."""
    if not _INFO["compiled"]:
        return False
    return device_type == "cpu" or (device_type == "cuda" and bool(_INFO["with_cuda"]))


def require_kernels(device: torch.device) -> None:
    """Raise RuntimeError, saying why and how to rebuild, unless :func:`has_kernels` for ``device``."""
    device = torch.device(device)
    if has_kernels(device.type):
        return
    if not _INFO["compiled"]:
        raise RuntimeError(f"pnn_fast has no compiled kernels: {_INFO['reason']}. Build them, or use "
                           "backend='reference'")
    if device.type == "cuda":
        why = _INFO.get("variant_reason", "CPU-only build")
        raise RuntimeError(f"pnn_fast was built without CUDA kernels ({why}) but got a tensor on {device}; rebuild "
                           f"with `{_CUDA_BUILD_COMMAND}`, or use backend='reference'")
    raise RuntimeError(f"pnn_fast has no kernels for device type {device.type!r} (only cpu and cuda); use "
                       "backend='reference'")
