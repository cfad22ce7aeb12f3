"""Argument validation shared by the public entry points.

Every check raises a ValueError/TypeError whose message starts with the
argument's name, so a user sees what to fix instead of a kernel crash or a
silently wrong loss.  Shapes, dtypes and devices are known on the host and always
checked.  Values (id ranges, finiteness) are checked by one of the losses'
``validate`` modes (:data:`VALIDATE_MODES`):

- ``"deferred"`` (the default): id ranges are tested on the device, with no host read: a bad id is
  clamped into range and recorded in a per-device flag (csrc/common/checks.h), which
  :func:`check_kernel_inputs` reads (a loss's ``check()``; the trainer once an epoch).  The
  compiled ops record their own bad inputs the same way.  Until it is read, a bad id gives a wrong
  number; a non-finite input gives a non-finite loss.
- ``"eager"``: every call checks ids and finiteness, the whole item table included, with one host
  read (:func:`check_values`), and raises before any kernel runs: for debugging.
- ``False``: no value checks in Python (the compiled ops still record theirs).
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Iterable, NamedTuple, Optional, Sequence, Union

import torch

from . import _extension

if TYPE_CHECKING:
    from .known import KnownPositives

_ID_DTYPES = (torch.int32, torch.int64)


#: the losses' ``validate`` values; the first is the default (True is accepted as "eager")
VALIDATE_MODES = ("deferred", "eager", False)


def check_validate(value) -> Union[str, bool]:
    """A loss's ``validate`` argument as one of :data:`VALIDATE_MODES`."""
    if value is True:
        return "eager"
    if value is False or (isinstance(value, str) and value in VALIDATE_MODES):
        return value
    raise ValueError(f"validate must be 'deferred', 'eager' or False, got {value!r}")


def ids_in_range(ids: torch.Tensor, size: int, op: str, name: str) -> torch.Tensor:
    """``ids`` (a new tensor, same shape and dtype) with every entry outside [0, size) clamped into it
    and recorded as the deferred error "<op>: <name> has ids outside [0, size)": no host read.
    Without the compiled kernels, an eager check (one read) instead."""
    if not _extension.build_info()["compiled"]:
        check_values([(f"{op}: {name}", ids, size)], [])
        return ids
    if size <= 0 and ids.numel():
        raise ValueError(f"{op}: {name} holds {ids.numel()} ids but the range [0, {size}) is empty")
    return torch.ops.pnn_fast.ids_in_range(ids, size, op, name)


def check_kernel_inputs(device=None) -> None:
    """Raise the first deferred input error recorded on ``device`` (every device in use when None)
    since the last call, and clear it: one host read a device.

    The losses' ``validate="deferred"`` checks and the compiled ops record bad inputs (an id outside
    its table, a draw outside [0, 1)) on the device instead of reading them back; until this is
    called, such an input gives a wrong result. Raises ValueError naming the op and the argument.
    """
    devices = [torch.device(device)] if device is not None else [torch.device("cpu")] + (
        [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else [])
    for where in devices:
        pending = take_kernel_input_error(where)
        if pending is not None:
            raise_kernel_input_error(*pending.tolist())


def take_kernel_input_error(device) -> Optional[torch.Tensor]:
    """int64 [2] on ``device``: (code, bound) of its first deferred input error, zeros when none,
    then cleared; None without the compiled kernels. No host read: a caller that reads something
    else anyway (the trainer's epoch loss) reads it with that, then :func:`raise_kernel_input_error`."""
    if not _extension.build_info()["compiled"]:
        return None
    return torch.ops.pnn_fast.take_input_error(torch.empty(0, device=device))


def raise_kernel_input_error(code: int, bound: int) -> None:
    """Raise the deferred input error (code, bound) read from :func:`take_kernel_input_error`, if any."""
    if code:
        raise ValueError(_extension.input_error_message(code, bound))


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
            bounds = f" in {'(' if low_open else '['}{low:g}, {high:g}]"
        elif low > -math.inf:
            bounds = f" {'>' if low_open else '>='} {low:g}"
        else:
            bounds = ""
        raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}")
    return float(value)


def check_device(device) -> torch.device:
    """``device`` (a string such as 'cpu', 'cuda', 'cuda:1', or a torch.device) as a torch.device that
    this machine can use: a name torch does not know, or CUDA without a usable GPU, is one line
    naming the device rather than torch's list of every backend or a driver's message."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {device!r}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no usable GPU here (torch.cuda.is_available() is False); use --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 up")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: pnn_fast runs on cpu or cuda")
    return parsed


def check_bool(name: str, value) -> bool:
    """``value`` once it is True or False (a word such as "no", or 0 and 1, is refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int, once it is an integer (not a bool, not a float) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_cutoffs(name: str, ks) -> list[int]:
    """``ks`` as a list of ints once it is a non-empty sequence of ints >= 1 (a string "25" is not
    [2, 5], and a cut-off of 0 ranks nothing)."""
    try:
        values = None if isinstance(ks, (str, bytes)) else list(ks)
    except TypeError:  # not a sequence at all
        values = None
    if not values or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 1 for k in values):
        raise ValueError(f"{name} must be a list of positive ints, got {ks!r}")
    return [int(k) for k in values]


#: seeds are ints in [0, SEED_LIMIT): torch's CPU generator keeps a seed's low 32 bits, so seeds that
#: differ by 2^32 (or -1 and 2^32 - 1) would give the same run; the split's hidden share uses seed + 1
SEED_LIMIT = 2**31


def check_seed(name: str, value) -> int:
    """``value`` once it is an int in ``[0, 2^31)``: two such seeds never give the same random stream."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < SEED_LIMIT:
        raise ValueError(f"{name} must be an int in [0, 2^31), got {value!r}")
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


def _refuse_meta(name: str, x: torch.Tensor) -> None:
    if x.device.type == "meta":  # shapes only: nothing to compute from
        raise ValueError(f"{name} is a meta tensor (a shape with no data); pass it on a real device (cpu, cuda)")


def check_id_tensor(name: str, ids, shape: Optional[Sequence[int]]) -> None:
    require_tensor(name, ids)
    _refuse_meta(name, ids)
    if ids.dtype not in _ID_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {ids.dtype}")
    if shape is not None and tuple(ids.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(ids.shape)}")


def check_embedding(name: str, x, *, rows: Optional[int], dim: int) -> None:
    require_tensor(name, x)
    _refuse_meta(name, x)
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


class BatchIds(NamedTuple):
    """A loss call's id arguments after :func:`validate_batch` (in range under ``"deferred"``)."""
    users: torch.Tensor
    pos_items: torch.Tensor
    neg_items: Optional[torch.Tensor]
    hard_candidates: Optional[torch.Tensor]


def validate_batch(known: KnownPositives, dim: int, user_emb, item_table, users, pos_items, neg_items, noise,
                   validate: Union[str, bool] = "eager", hard_candidates=None, whole_table: bool = True,
                   op: str = "PNNLoss", shared_pool: bool = False) -> BatchIds:
    """Shapes, dtypes and devices of one loss call, then its values by ``validate`` (one of
    :data:`VALIDATE_MODES`): ``"eager"`` checks id ranges and finiteness with one host read (the
    whole ``item_table`` unless ``whole_table`` is False: the caller then checks the rows it reads);
    ``"deferred"`` clamps the ids into range on the device, recording errors named after ``op``.
    ``neg_items`` and ``hard_candidates``: int [B, K] or None (``neg_items`` also [M], one pool shared
    by the rows, with ``shared_pool``). Returns the ids to use."""
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
        pool = shared_pool and name == "neg_items" and candidates.dim() == 1 and candidates.numel() > 0
        if not pool and (candidates.dim() != 2 or candidates.shape[0] != batch or candidates.shape[1] == 0):
            shapes = f"[B={batch}, K>=1]" + (" or [M>=1] (a shared pool)" if shared_pool and name == "neg_items" else "")
            raise ValueError(f"{name} must have shape {shapes}, got {list(candidates.shape)}")
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
    given = {"users": users, "pos_items": pos_items, "neg_items": neg_items, "hard_candidates": hard_candidates}
    if validate == "eager":
        check_values(ids, floats)
    elif validate == "deferred":
        given.update({name: ids_in_range(x, size, op, name) for name, x, size in ids})
    return BatchIds(**given)
