"""Argument validation shared by the public entry points.

Every check raises a ValueError/TypeError whose message starts with the
argument's name, so a user sees what to fix instead of a kernel crash or a
silently wrong loss.  Value checks (id ranges, finiteness) are batched into a
single host synchronisation by :func:`check_values`.
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import torch

if TYPE_CHECKING:
    from .known import KnownPositives

_ID_DTYPES = (torch.int32, torch.int64)


def require_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_real(name: str, value, *, low: float = 0.0, high: float = math.inf, low_open: bool = False) -> float:
    """``value`` as a float, once it is a finite real number in ``[low, high]`` (``(low, high]`` when
    ``low_open``): a loss weight, a noise magnitude, a temperature.

    NaN and inf are refused too: a weight of NaN or a negative one makes a loss meaningless or
    unbounded below, and training on it "works" until it diverges far from the cause. bool and str
    are refused rather than coerced (``float("0.5")`` would hide a typed-in string).
    """
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or not (low < value if low_open else low <= value) or value > high):
        if high < math.inf:
            bounds = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            bounds = f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return float(value)


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int, once it is an integer (not a bool, not a float) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_neg_size(neg_size, candidates: Optional[int] = None, candidates_name: str = "num_candidates"):
    """``neg_size`` itself: "proportional", "count" or an int >= 0, and below ``candidates`` when
    given: a row's negative class holds at most K - 1 of its K candidates (the neutral class keeps
    one), so a larger fixed size would never be honoured."""
    if isinstance(neg_size, str) and neg_size in ("proportional", "count"):
        return neg_size
    if (isinstance(neg_size, numbers.Integral) and not isinstance(neg_size, bool) and neg_size >= 0
            and (candidates is None or neg_size < candidates)):
        return int(neg_size)
    sizes = ">= 0" if candidates is None else f"in [0, {candidates_name}) = [0, {candidates})"
    raise ValueError(f"neg_size must be 'proportional', 'count' or an int {sizes}, got {neg_size!r}")


def check_ids(name: str, ids, size: int, shape: Optional[Sequence[int]]) -> None:
    """Type, dtype, shape and range check of an id tensor (syncs once)."""
    check_id_tensor(name, ids, shape)
    check_values([(name, ids, size)], [])


def check_id_tensor(name: str, ids, shape: Optional[Sequence[int]]) -> None:
    require_tensor(name, ids)
    if ids.dtype not in _ID_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {ids.dtype}")
    if shape is not None and tuple(ids.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(ids.shape)}")


def check_embedding(name: str, x, *, rows: Optional[int], dim: int) -> None:
    require_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, dim], got shape {list(x.shape)}")
    if x.shape[1] != dim:
        raise ValueError(f"{name} has embedding size {x.shape[1]}, expected dim={dim}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got {x.shape[0]}")


def check_same(ref_name: str, ref: torch.Tensor, others: Iterable[tuple[str, torch.Tensor]], *, dtype: bool) -> None:
    """All ``others`` on ``ref``'s device (and of its dtype when ``dtype``)."""
    for name, x in others:
        if x.device != ref.device:
            raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}; put them on one device")
        if dtype and x.dtype != ref.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}; use one dtype")


def check_values(id_checks: Sequence[tuple[str, torch.Tensor, int]], finite_checks: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Range-check ids (``0 <= id < size``) and finiteness of floats with one host sync.

    Skipped while torch.compile traces (a data-dependent branch would break the graph).
    """
    if torch.compiler.is_compiling():
        return
    flags = []
    for _, ids, size in id_checks:
        flags.append(((ids < 0) | (ids >= size)).any() if ids.numel() else torch.zeros((), dtype=torch.bool, device=ids.device))
    for _, x in finite_checks:
        flags.append(~torch.isfinite(x).all())
    if not flags:
        return
    bad = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
    for ok_index, is_bad in enumerate(bad):
        if not is_bad:
            continue
        if ok_index < len(id_checks):
            name, ids, size = id_checks[ok_index]
            lo, hi = int(ids.min()), int(ids.max())
            raise ValueError(f"{name} has ids outside [0, {size}): min {lo}, max {hi}")
        name, _ = finite_checks[ok_index - len(id_checks)]
        raise ValueError(f"{name} contains NaN or inf")


def validate_batch(known: KnownPositives, dim: int, user_emb, item_table, users, pos_items, neg_items, noise,
                   values: bool = True, hard_candidates=None, whole_table: bool = True) -> None:
    """Shapes, dtypes and devices of one loss call; with ``values`` also id ranges and finiteness
    (one host sync). ``neg_items`` and ``hard_candidates``: int [B, K] or None. ``whole_table``
    False leaves ``item_table``'s finiteness to the caller, which checks the rows it reads."""
    check_embedding("user_emb", user_emb, rows=None, dim=dim)
    batch = user_emb.shape[0]
    if batch == 0:
        raise ValueError("user_emb is an empty batch (0 rows); a loss needs at least one row")
    check_embedding("item_table", item_table, rows=known.num_items, dim=dim)
    check_same("user_emb", user_emb, [("item_table", item_table)], dtype=True)
    check_id_tensor("users", users, (batch,))
    check_id_tensor("pos_items", pos_items, (batch,))
    ids = [("users", users, known.num_users), ("pos_items", pos_items, known.num_items)]
    floats = [("user_emb", user_emb)] + ([("item_table", item_table)] if whole_table else [])
    same_device = [("users", users), ("pos_items", pos_items)]
    for name, candidates in (("neg_items", neg_items), ("hard_candidates", hard_candidates)):
        if candidates is None:
            continue
        require_tensor(name, candidates)
        if candidates.dim() != 2 or candidates.shape[0] != batch or candidates.shape[1] == 0:
            raise ValueError(f"{name} must have shape [B={batch}, K>=1], got {list(candidates.shape)}")
        check_id_tensor(name, candidates, None)
        ids.append((name, candidates, known.num_items))
        same_device.append((name, candidates))
    if noise is not None:
        if not isinstance(noise, (tuple, list)) or len(noise) != 2:
            raise TypeError("noise must be a pair (noise_pos, noise_neg) of [B, d] tensors")
        for name, x in zip(("noise_pos", "noise_neg"), noise):
            check_embedding(name, x, rows=batch, dim=dim)
            floats.append((name, x))
        check_same("user_emb", user_emb, [("noise_pos", noise[0]), ("noise_neg", noise[1])], dtype=True)
    check_same("user_emb", user_emb, same_device, dtype=False)
    if values:
        check_values(ids, floats)
