"""What every op wrapper shares: the op namespace, the accumulation dtype, the per-row arguments."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ..known import KnownPositives

if not _extension.build_info()["compiled"]:
    raise ImportError(f"pnn_fast.ops needs the compiled kernels: {_extension.build_info()['reason']}")

#: the registered kernels (csrc/pnn_fast.cpp has the schemas)
OPS = torch.ops.pnn_fast


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels accumulate ``dtype`` in (float16/bfloat16 in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def row_args(user_emb, item_table, users, pos_items, candidates, known: KnownPositives) -> tuple:
    """Device/dtype checks; the positional arguments every per-row op starts with."""
    _extension.require_kernels(user_emb.device)
    check_same("user_emb", user_emb, [("item_table", item_table)], dtype=True)
    check_same("user_emb", user_emb, [("users", users), ("pos_items", pos_items), ("candidates", candidates),
                                      ("known", known.indptr)], dtype=False)
    return (user_emb, item_table, users.long(), pos_items.long(), candidates.long(), known.indptr, known.indices)
