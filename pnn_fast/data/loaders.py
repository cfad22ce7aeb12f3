"""``load_dataset``: files on disk to a split, remapped :class:`Dataset`.

Processing order (RecBole's, so that ``split="rs"`` follows the paper's protocol):

1. read every file of the dataset (:mod:`pnn_fast.data.parsers`);
2. ``rating_threshold``: keep interactions with ``rating >= threshold``;
3. drop duplicate (user, item) pairs, keeping one;
4. ``kcore``: iteratively drop users and items with fewer than ``kcore`` interactions;
5. remap ids to 0-based contiguous ids;
6. split (the files' own split, or RecBole's per-user random split);
7. ``hide_train_share``: hide a random share of each user's training interactions (they become
   unlabeled: simulated false negatives, the paper's Fig. 3).
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .._checks import check_real, check_seed
from .dataset import Dataset
from .parsers import RawInteractions, read_atomic_inter, read_csv, read_lightgcn, read_movielens_dat
from .split import normalized_ratios, random_share_by_user, random_split_by_user

FORMATS = ("auto", "lightgcn", "inter", "movielens", "csv")
SPLITS = ("auto", "files", "rs")

# LightGCN split files of a folder and the part each one fills.
_LIGHTGCN_PARTS = (("train.txt", 0), ("valid.txt", 1), ("test.txt", 2))


def load_dataset(
    path: os.PathLike | str,
    *,
    format: str = "auto",
    split: str = "auto",
    ratios: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 2020,
    rating_threshold: float | None = None,
    kcore: int = 0,
    hide_train_share: float = 0.0,
) -> Dataset:
    """Load an implicit-feedback dataset and split it into train / valid / test.

    Args:
        path: a folder or a file.  A folder holds either LightGCN text
            (``train.txt`` and optionally ``valid.txt``, ``test.txt``), or exactly one
            RecBole ``*.inter`` file, or MovieLens ``ratings.dat`` / ``ratings.csv``, or
            exactly one other ``*.csv`` file (looked for in that order).  A file's format
            follows from its name: ``*.txt`` LightGCN, ``*.inter``, ``*.dat`` MovieLens
            (``::``-separated), ``*.csv`` CSV.
        format: ``"auto"`` (as above), ``"lightgcn"``, ``"inter"``, ``"movielens"``
            (``ratings.dat``, or ``ratings.csv`` which is read as CSV) or ``"csv"``
            (``user,item[,rating[,timestamp]]``, header optional).
        split: ``"files"`` keeps the split of a LightGCN folder's ``train/valid/test.txt``
            (``test.txt`` required).  Without ``valid.txt`` (e.g. ML-1M-full) the
            validation set is taken out of each user's training interactions with
            RecBole's rounding and ratios ``ratios[0] : ratios[1]`` (8:1 by default,
            so a user with one training interaction keeps it), seeded by ``seed``; the
            test set is never touched.  ``"rs"`` merges everything and applies
            RecBole's per-user random split with ``ratios`` and ``seed`` (see
            :mod:`pnn_fast.data.split`).  ``"auto"`` is ``"files"`` for a LightGCN
            folder with a ``test.txt``, else ``"rs"``.
        ratios: train / valid / test proportions (need not sum to one).
        seed: seed of the random split.
        rating_threshold: keep interactions with ``rating >= rating_threshold``;
            a ``ValueError`` if the data has no rating column.
        kcore: drop users and items with fewer than ``kcore`` interactions, repeatedly,
            until none is left (RecBole's ``user_inter_num_interval`` /
            ``item_inter_num_interval = "[kcore,inf)"``).  It runs on all the
            interactions before splitting, also for ``split="files"``.
        hide_train_share: in [0, 1): after the split, ``floor(share * n)`` of each user's ``n``
            training interactions, drawn at random (seeded by ``seed + 1``, so the same for every
            model seed), leave the training set and no other split takes them: the model sees them
            as unlabeled items, and valid and test stay as they were (``Dataset.hidden``).

    Returns:
        A :class:`Dataset`.  Only users and items with at least one interaction
        left get ids; internal ids follow the sorted original ids (numerically when
        every original id is a canonical integer, so LightGCN's contiguous 0-based
        ids map to themselves; else as strings).  A (user, item) pair listed more
        than once is kept once; for ``split="files"`` in the earliest of train,
        valid, test, so no pair is in two splits; ``Dataset.duplicates`` counts the
        copies dropped and its ``summary()`` line reports them.  Timestamps are parsed (and
        checked) but not used: the split is random, not temporal.

    Raises:
        DataFormatError: a malformed line (the message names the file and line).
        FileNotFoundError: ``path`` or a file the format needs does not exist.
        ValueError: bad arguments, or no interaction left after filtering.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if len(ratios) != 3:
        raise ValueError(f"ratios must be (train, valid, test), got {tuple(ratios)}")
    ratios = normalized_ratios(ratios)
    if rating_threshold is not None:
        check_real("rating_threshold", rating_threshold, low=-math.inf)
    check_seed("seed", seed)
    if isinstance(kcore, bool) or not isinstance(kcore, int) or kcore < 0:
        raise ValueError(f"kcore must be an int >= 0, got {kcore!r}")
    if isinstance(hide_train_share, bool) or not isinstance(hide_train_share, (int, float)) \
            or not 0 <= hide_train_share < 1:
        raise ValueError(f"hide_train_share must be a number in [0, 1), got {hide_train_share!r}")

    path = Path(path)
    files = _find_files(path, format)  # [(file, reader, part or None)]
    file_parts = {part for _, _, part in files}
    if split == "auto":
        split = "files" if 2 in file_parts else "rs"
    if split == "files" and 2 not in file_parts:
        raise ValueError(f"split='files' needs a LightGCN folder with train.txt and test.txt; {path} is not one")

    raws = [reader(file) for file, reader, _ in files]
    users = np.concatenate([raw.users for raw in raws])
    items = np.concatenate([raw.items for raw in raws])
    parts = np.concatenate([np.full(raw.users.size, part if part is not None else 0, np.int64)
                            for raw, (_, _, part) in zip(raws, files)])
    ratings = _column(raws, "ratings")

    if rating_threshold is not None:
        if ratings is None:
            raise ValueError(f"rating_threshold={rating_threshold} but {path} has no rating column")
        keep = ratings >= float(rating_threshold)
        users, items, parts = users[keep], items[keep], parts[keep]

    user_codes, user_originals = _factorize(users)
    item_codes, item_originals = _factorize(items)

    first = _first_of_each_pair(user_codes, item_codes, parts, len(item_originals))
    duplicates = user_codes.size - first.size
    user_codes, item_codes, parts = user_codes[first], item_codes[first], parts[first]

    if kcore > 1:
        keep = _kcore_mask(user_codes, item_codes, kcore)
        user_codes, item_codes, parts = user_codes[keep], item_codes[keep], parts[keep]
    if user_codes.size == 0:
        raise ValueError(
            f"no interactions left in {path} (rating_threshold={rating_threshold}, kcore={kcore})"
        )

    # Drop ids left without interactions, keeping the others in order.
    used_users, user_codes = _dense_codes(user_codes, len(user_originals))
    used_items, item_codes = _dense_codes(item_codes, len(item_originals))
    users_t = torch.from_numpy(user_codes)
    items_t = torch.from_numpy(item_codes)
    num_users, num_items = used_users.size, used_items.size

    if split == "rs":
        part_t = random_split_by_user(users_t, num_users, ratios, seed)
    else:
        part_t = torch.from_numpy(parts)
        if 1 not in file_parts:
            train = torch.nonzero(part_t == 0).squeeze(1)
            carved = random_split_by_user(users_t[train], num_users, ratios[:2], seed)
            part_t[train[carved == 1]] = 1

    splits = [(users_t[part_t == p], items_t[part_t == p]) for p in range(3)]
    hidden = None
    if hide_train_share > 0:
        train_users, train_items = splits[0]
        chosen = random_share_by_user(train_users, num_users, float(hide_train_share), seed + 1)
        hidden = (train_users[chosen], train_items[chosen])
        splits[0] = (train_users[~chosen], train_items[~chosen])
    return Dataset(
        name=path.name if path.is_dir() else path.stem,
        num_users=int(num_users),
        num_items=int(num_items),
        train=splits[0],
        valid=splits[1],
        test=splits[2],
        user_ids=[user_originals[k] for k in used_users],
        item_ids=[item_originals[k] for k in used_items],
        duplicates=int(duplicates),
        hidden=hidden,
    )


def _find_files(path: Path, format: str) -> list:
    """The files to read for ``path`` and ``format``: ``[(file, reader, part)]``.

    ``part`` is 0/1/2 (train/valid/test) for a LightGCN folder, else ``None``.
    """
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if path.is_file():
        if format == "auto":
            format = {".txt": "lightgcn", ".inter": "inter", ".dat": "movielens", ".csv": "csv"}.get(path.suffix.lower())
            if format is None:
                raise ValueError(f"cannot tell the format of {path} from its suffix (.csv, .inter, .dat, .txt); "
                                 f"pass --format (format= in Python)")
        return [(path, _reader(format, path), None)]

    if format in ("auto", "lightgcn") and (path / "train.txt").is_file():
        return [(path / name, read_lightgcn, part) for name, part in _LIGHTGCN_PARTS if (path / name).is_file()]
    if format == "lightgcn":
        raise FileNotFoundError(f"LightGCN folder {path} has no train.txt")
    candidates = {
        "inter": sorted(path.glob("*.inter")),
        "movielens": [p for p in (path / "ratings.dat", path / "ratings.csv") if p.is_file()][:1],
        "csv": [p for p in sorted(path.glob("*.csv")) if p.name != "ratings.csv"],
    }
    if format == "csv":
        candidates["csv"] = sorted(path.glob("*.csv"))
    for fmt in ("inter", "movielens", "csv") if format == "auto" else (format,):
        found = candidates[fmt]
        if len(found) > 1:
            raise ValueError(f"{path} holds several {fmt} files ({', '.join(p.name for p in found)}); pass one of them")
        if found:
            return [(found[0], _reader(fmt, found[0]), None)]
    wanted = "train.txt, *.inter, ratings.dat, ratings.csv or *.csv" if format == "auto" else f"a {format} file"
    raise FileNotFoundError(f"{path} holds no {wanted}")


def _reader(format: str, file: Path):
    if format == "movielens":
        return read_csv if file.suffix == ".csv" else read_movielens_dat
    return {"lightgcn": read_lightgcn, "inter": read_atomic_inter, "csv": read_csv}[format]


def _column(raws: list[RawInteractions], name: str) -> np.ndarray | None:
    """Concatenate an optional column; ``None`` unless every file has it."""
    columns = [getattr(raw, name) for raw in raws]
    return None if any(c is None for c in columns) else np.concatenate(columns)


def _factorize(ids: np.ndarray) -> tuple[np.ndarray, list]:
    """Codes int64 [n] into the sorted distinct ids, and those ids as Python values.

    String ids that are all canonical integers ("0", "17", "-3"; not "007")
    are sorted and returned as ints.
    """
    if ids.dtype.kind == "U":
        try:
            numbers = ids.astype(np.int64)
        except (ValueError, OverflowError):
            numbers = None
        if numbers is not None and np.array_equal(numbers.astype(ids.dtype), ids):
            ids = numbers
    # Small non-negative integer ids (LightGCN's, MovieLens's) skip np.unique's sort.
    if ids.dtype.kind == "i" and ids.size and ids.min() >= 0 and ids.max() < 4 * ids.size + 2**20:
        distinct, codes = _dense_codes(ids, int(ids.max()) + 1)
    else:
        distinct, codes = np.unique(ids, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), distinct.tolist()


def _dense_codes(values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For int values in ``[0, size)``: the distinct values (sorted) and each value's rank among them."""
    present = np.zeros(size, dtype=bool)
    present[values] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present), rank[values]


def _first_of_each_pair(users: np.ndarray, items: np.ndarray, parts: np.ndarray, num_items: int) -> np.ndarray:
    """Indices int64 [m] of one interaction per (user, item) pair, in (user, item) order.

    The copy kept is one from the earliest part (train, valid, test), so no pair
    ends up in two splits; within a part which copy survives is immaterial since
    only the pair is kept.  The (user, item) order makes the random split
    independent of the files' line order.  The int64 key holds up to ~1.7e9
    distinct users and items.
    """
    order = np.argsort((users * num_items + items) * 3 + parts)
    sorted_users, sorted_items = users[order], items[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (sorted_users[1:] != sorted_users[:-1]) | (sorted_items[1:] != sorted_items[:-1])
    return order[first]


def _kcore_mask(users: np.ndarray, items: np.ndarray, k: int) -> np.ndarray:
    """bool [n]: the interactions of the largest sub-dataset where every user and item has >= k.

    Removing every user and item below ``k`` and recounting until nothing
    changes reaches that unique largest core (removal order does not matter).
    """
    keep = np.ones(users.size, dtype=bool)
    while True:
        user_degree = np.bincount(users[keep], minlength=users.max(initial=-1) + 1)
        item_degree = np.bincount(items[keep], minlength=items.max(initial=-1) + 1)
        new_keep = keep & (user_degree[users] >= k) & (item_degree[items] >= k)
        if new_keep.sum() == keep.sum():
            return keep
        keep = new_keep
