"""Readers for the on-disk interaction formats.

Each reader returns the interactions exactly as the file lists them
(:class:`RawInteractions`); filtering, deduplication, id remapping and
splitting happen in :mod:`pnn_fast.data.loaders`.  Anything malformed raises
:class:`~pnn_fast.data.dataset.DataFormatError` naming the file and the
1-based line: a bad line is never skipped silently.  Blank lines are ignored
in every format.

Files are decoded as UTF-8 with ``surrogateescape`` so that a stray non-UTF-8
byte becomes a format error naming its line, instead of a ``UnicodeDecodeError``
without a line number, or (in a token format) an id of its own: a garbage row
read as a new user.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dataset import DataFormatError

# Ids of up to 18 decimal digits always fit in int64.
_MAX_ID_DIGITS = 18


@dataclass
class RawInteractions:
    """One file's interactions before any processing.

    Attributes:
        path: the file read.
        users, items: original ids, np.ndarray [n]; int64 for LightGCN text,
            str for the token formats (.inter, MovieLens, CSV).
        ratings: float64 [n], or ``None`` when the file has no rating column.
        timestamps: float64 [n], or ``None`` when the file has no timestamp column.
    """

    path: Path
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray | None = None
    timestamps: np.ndarray | None = None


def _open(path: Path):
    # utf-8-sig: a byte-order mark (as spreadsheet exports write) is dropped rather than read
    # as part of line 1's first field, which would hide a CSV header or corrupt the first id.
    return open(path, encoding="utf-8-sig", errors="surrogateescape")


def read_lightgcn(path: os.PathLike | str) -> RawInteractions:
    """Read LightGCN text: one line per user, ``user item item ...``, non-negative integer ids.

    A line with a user and no items contributes nothing.  The fast path (one
    ``str.split`` per line, one validity test over all tokens, one numpy
    conversion) reads Gowalla's million interactions in a fraction of a second;
    only a file that fails the test is scanned again to locate the first bad token.
    """
    path = Path(path)
    tokens: list[str] = []
    lengths: list[int] = []
    with _open(path) as f:
        for line in f:
            fields = line.split()
            if fields:
                tokens.extend(fields)
                lengths.append(len(fields))
    if not tokens:
        return RawInteractions(path, np.empty(0, np.int64), np.empty(0, np.int64))
    joined = "".join(tokens)
    if not (joined.isascii() and joined.isdigit()) or max(map(len, tokens)) > _MAX_ID_DIGITS:
        raise next(_lightgcn_token_errors(path))

    values = np.array(tokens, dtype=np.int64)
    counts = np.array(lengths, dtype=np.int64)
    line_starts = np.cumsum(counts) - counts  # index of each line's user token
    is_item = np.ones(values.size, dtype=bool)
    is_item[line_starts] = False
    users = np.repeat(values[line_starts], counts - 1)
    return RawInteractions(path, users, values[is_item])


def _lightgcn_token_errors(path: Path) -> Iterator[DataFormatError]:
    """Errors for the invalid tokens of a LightGCN file, in file order."""
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            for position, token in enumerate(line.split()):
                role = "user" if position == 0 else "item"
                digits = token.removeprefix("-")
                if not (digits.isascii() and digits.isdigit()):
                    yield DataFormatError(path, lineno, f"{role} id {token!r} is not a non-negative integer")
                elif token.startswith("-"):
                    yield DataFormatError(path, lineno, f"{role} id {token} is negative")
                elif len(token) > _MAX_ID_DIGITS:
                    yield DataFormatError(
                        path, lineno, f"{role} id {token} is too large (more than {_MAX_ID_DIGITS} digits)"
                    )


#: RecBole's atomic-file field types, and the type each column this reader uses must be declared
_INTER_TYPES = ("token", "token_seq", "float", "float_seq")
_INTER_COLUMN_TYPES = {"user_id": "token", "item_id": "token", "rating": "float", "timestamp": "float"}


def read_atomic_inter(path: os.PathLike | str) -> RawInteractions:
    """Read a RecBole atomic ``.inter`` file.

    Tab-separated; line 1 is the header ``name:type`` per column, e.g.
    ``user_id:token\\titem_id:token\\trating:float\\ttimestamp:float``.
    Columns are found by name (``user_id``, ``item_id`` required; ``rating`` and
    ``timestamp`` optional; others ignored) and every row must have as many
    fields as the header. Types are RecBole's (token, token_seq, float, float_seq); the ids must be
    declared ``token`` and rating and timestamp ``float``, the types this reader reads them as.
    """
    path = Path(path)
    rows, linenos = _read_rows(path, "\t")
    if not rows or linenos[0] != 1:
        raise DataFormatError(path, 1, "missing header (expected e.g. 'user_id:token<TAB>item_id:token')")
    if len(rows[0]) == 1 and "," in rows[0][0]:
        raise DataFormatError(path, 1, "the header has commas and no tab: a .inter file is tab-separated "
                                       "(a comma-separated file is read as .csv)")
    position: dict[str, int] = {}
    for k, field in enumerate(rows[0]):
        name, colon, kind = field.strip().partition(":")
        if name in position:
            raise DataFormatError(path, 1, f"header names column {name!r} twice (fields {position[name] + 1} "
                                           f"and {k + 1})")
        if not colon:
            raise DataFormatError(path, 1, f"header field {field!r} is not of the form name:type")
        if kind not in _INTER_TYPES:
            raise DataFormatError(path, 1, f"header field {field!r} has type {kind!r}; RecBole's types are "
                                           f"{', '.join(_INTER_TYPES)}")
        wanted = _INTER_COLUMN_TYPES.get(name)
        if wanted is not None and kind != wanted:
            raise DataFormatError(path, 1, f"header declares {name} as {kind}; it is read as {wanted}, so declare "
                                           f"'{name}:{wanted}'")
        position[name] = k
    for required in ("user_id", "item_id"):
        if required not in position:
            raise DataFormatError(path, 1, f"header has no {required} column (found {sorted(position)})")
    return _table(
        path, rows[1:], linenos[1:], sep="\t", width=len(rows[0]),
        user=position["user_id"], item=position["item_id"],
        rating=position.get("rating"), timestamp=position.get("timestamp"),
    )


def read_movielens_dat(path: os.PathLike | str) -> RawInteractions:
    """Read MovieLens ``ratings.dat`` (ML-1M, ML-10M): ``user::item::rating::timestamp``, no header.

    The format's ids are integers (ML-1M's README: UserIDs range between 1 and 6040), so a
    non-integer or negative id is a located error rather than a new token.
    """
    path = Path(path)
    rows, linenos = _read_rows(path, "::")
    raw = _table(path, rows, linenos, sep="::", width=4, user=0, item=1, rating=2, timestamp=3)
    for role, ids in (("user", raw.users.tolist()), ("item", raw.items.tolist())):
        joined = "".join(ids)  # one test over every id (none is empty); a per-id scan only to locate a failure
        if ids and not (joined.isascii() and joined.isdigit()):  # a blank file has no ids, and no bad one
            bad = next(k for k, token in enumerate(ids) if not (token.isascii() and token.isdigit()))
            raise DataFormatError(path, linenos[bad], f"{role} id {ids[bad]!r} is not a non-negative integer")
    return raw


# Header names accepted by read_csv, compared after dropping a ``:type`` suffix
# and underscores and lower-casing ("userId", "user_id", "user_id:token" -> "userid").
_USER_NAMES = {"user", "userid", "uid"}
_ITEM_NAMES = {"item", "itemid", "iid", "movie", "movieid"}
_RATING_NAMES = {"rating"}
_TIME_NAMES = {"timestamp", "time"}


def _normalized(name: str) -> str:
    """A header field as compared with the names above: quotes, spaces, underscores and a ``:type``
    suffix dropped, lower case (``"User ID"`` and ``'"user_id"'`` -> ``userid``)."""
    return name.strip().strip("\"'").partition(":")[0].replace("_", "").replace(" ", "").lower()


def _is_header(fields: list[str]) -> bool:
    """Whether a CSV row names its columns: a user and an item column among known names."""
    names = {_normalized(field) for field in fields}
    return bool(names & _USER_NAMES) and bool(names & _ITEM_NAMES)


def read_csv(path: os.PathLike | str) -> RawInteractions:
    """Read comma-separated ``user,item[,rating[,timestamp]]`` (MovieLens ``ratings.csv`` included).

    The file has a header when its first line names a user column (``user``, ``user_id``,
    ``userId``, ``uid``, ``User ID``, quoted or not, any case) and an item column (``item``,
    ``item_id``, ``movieId``, ``iid``); columns are then found by name, in any order (also
    ``rating``; ``timestamp`` or ``time``), and other columns are ignored.  Without a header the
    columns are positional and every row must have as many fields as the first one (2 to 4).  A
    later line that names the columns (two files joined) is refused at its line, never read as an
    interaction.  Id fields are not unquoted.
    """
    path = Path(path)
    rows, linenos = _read_rows(path, ",")
    if not rows:
        return _table(path, rows, linenos, sep=",", width=2, user=0, item=1, rating=None, timestamp=None)
    has_header = _is_header(rows[0])
    named = {_normalized(field) for field in rows[0]}
    if not has_header and named & (_USER_NAMES | _ITEM_NAMES | _RATING_NAMES | _TIME_NAMES):
        missing = "user" if not named & _USER_NAMES else "item"
        names = sorted(_USER_NAMES if missing == "user" else _ITEM_NAMES)
        raise DataFormatError(path, linenos[0], f"header has no {missing} column (one of {names}), found {rows[0]}")
    # (a row of integer ids is no header: one cheap test a row before the name lookups)
    repeated = next((k for k in range(1, len(rows)) if not rows[k][0].strip().isdigit() and _is_header(rows[k])), None)
    if repeated is not None:
        raise DataFormatError(path, linenos[repeated], f"a header line {','.join(rows[repeated])!r} inside the data "
                                                       "(files joined?); only line 1 may name the columns")
    if has_header:
        first = [_normalized(field) for field in rows[0]]

        def column(names: set[str]) -> int | None:
            return next((k for k, name in enumerate(first) if name in names), None)

        return _table(
            path, rows[1:], linenos[1:], sep=",", width=len(first),
            user=column(_USER_NAMES), item=column(_ITEM_NAMES), rating=column(_RATING_NAMES),
            timestamp=column(_TIME_NAMES),
        )
    width = len(rows[0])
    if not 2 <= width <= 4:
        raise DataFormatError(path, linenos[0], f"expected user,item[,rating[,timestamp]], found {width} fields")
    return _table(
        path, rows, linenos, sep=",", width=width,
        user=0, item=1, rating=2 if width > 2 else None, timestamp=3 if width > 3 else None,
    )


def _read_rows(path: Path, sep: str) -> tuple[list[list[str]], list[int]]:
    """Non-blank lines split on ``sep``, with their 1-based line numbers."""
    rows: list[list[str]] = []
    linenos: list[int] = []
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.isascii():
                _require_utf8(path, lineno, line)
            if line.strip():
                rows.append(line.split(sep))
                linenos.append(lineno)
    return rows, linenos


def text_lines(path: os.PathLike | str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a text file, stripped, with their 1-based numbers; a line that is not
    UTF-8 is refused at its file:line (as every data file is)."""
    path = Path(path)
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            _require_utf8(path, lineno, line)
            if line.strip():
                yield lineno, line.strip()


def _require_utf8(path: Path, lineno: int, line: str) -> None:
    """A line decoded with surrogateescape holds a surrogate for each byte that was not UTF-8."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(line[err.start]) - 0xDC00
        raise DataFormatError(path, lineno, f"is not UTF-8 text (byte 0x{byte:02x} at column {err.start + 1})") from None


def _table(
    path: Path,
    rows: list[list[str]],
    linenos: list[int],
    *,
    sep: str,
    width: int,
    user: int,
    item: int,
    rating: int | None,
    timestamp: int | None,
) -> RawInteractions:
    """Pick the id / rating / timestamp columns out of split rows, checking every row."""
    bad = next((k for k, row in enumerate(rows) if len(row) != width), None)
    if bad is not None:
        found = len(rows[bad])
        raise DataFormatError(path, linenos[bad], f"expected {width} fields separated by {sep!r}, found {found}")
    users = [row[user].strip() for row in rows]
    items = [row[item].strip() for row in rows]
    for role, ids in (("user", users), ("item", items)):
        if not all(ids):
            raise DataFormatError(path, linenos[ids.index("")], f"empty {role} id")
        # numpy's str arrays drop trailing NULs: "a\0" would silently become user "a", and "\0" an empty id
        if "\0" in "".join(ids):
            bad = next(k for k, token in enumerate(ids) if "\0" in token)
            raise DataFormatError(path, linenos[bad], f"{role} id {ids[bad]!r} contains a NUL character")
    return RawInteractions(
        path,
        np.array(users, dtype=str),
        np.array(items, dtype=str),
        None if rating is None else _floats(path, [row[rating] for row in rows], linenos, "rating"),
        None if timestamp is None else _floats(path, [row[timestamp] for row in rows], linenos, "timestamp"),
    )


def _floats(path: Path, values: list[str], linenos: list[int], what: str) -> np.ndarray:
    """float64 [n] from strings; a non-number or a non-finite value is a located error.

    Only ASCII decimal literals are numbers: Python's float() also takes "1_0" and non-ASCII
    digits ("\u0661"), which no data format writes and which would hide a corrupted field.
    """
    joined = "".join(values)  # one test over every value; a per-value scan only to locate a failure
    try:
        if not joined.isascii() or "_" in joined:
            raise ValueError
        out = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:
        bad = next(k for k, v in enumerate(values) if not _is_float(v))
        raise DataFormatError(path, linenos[bad], f"{what} {values[bad].strip()!r} is not a number") from None
    nonfinite = np.flatnonzero(~np.isfinite(out))
    if nonfinite.size:
        k = int(nonfinite[0])
        raise DataFormatError(path, linenos[k], f"{what} {values[k].strip()!r} is not finite")
    return out


def _is_float(text: str) -> bool:
    if not text.isascii() or "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True
