"""Fuzzing entry point (atheris, libFuzzer) for the data parsers of :mod:`pnn_fast.data.parsers`.

    pip install --no-build-isolation -e ".[fuzz]"
    python tests/fuzz/fuzz_parsers.py --parser csv /tmp/fuzz-csv tests/fuzz/corpus/csv \\
        -dict=tests/fuzz/parsers.dict -max_total_time=150 -timeout=10

``--parser`` is one of :data:`PARSERS`; the other arguments go to libFuzzer (a first folder
receives the inputs it finds, later ones are only read; ``-timeout`` turns a hang into a crash).
Each input is written, as raw bytes, to a file with that format's suffix and read by its parser.
The contract (:mod:`pnn_fast.data.parsers`) is that any bytes either parse into well-formed
:class:`RawInteractions` or raise a one-line :class:`DataFormatError` naming ``<file>:<line>``;
:func:`check` asserts exactly that, so any other exception, a malformed result, a bad location or
a hang is a crash. ``tests/test_fuzz_corpus.py`` replays the committed corpus and crash
reproducers through :func:`check` without atheris.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path

import numpy as np

from pnn_fast.data import parsers
from pnn_fast.data.dataset import DataFormatError
from pnn_fast.data.parsers import RawInteractions

# Each format's reader and the suffix load_dataset recognises it by.
PARSERS = {
    "lightgcn": (parsers.read_lightgcn, ".txt"),
    "inter": (parsers.read_atomic_inter, ".inter"),
    "movielens": (parsers.read_movielens_dat, ".dat"),
    "csv": (parsers.read_csv, ".csv"),
}


def check(parser: str, data: bytes, folder: Path) -> RawInteractions | DataFormatError:
    """Parse ``data`` as a file of format ``parser`` written in ``folder``, and check the outcome.

    Returns the parsed interactions, or the :class:`DataFormatError` the parser raised, once
    they are found well formed (AssertionError otherwise). Any other exception propagates.
    """
    read, suffix = PARSERS[parser]
    path = Path(folder) / f"input{suffix}"
    path.write_bytes(data)
    try:
        raw = read(path)
    except DataFormatError as error:
        _check_error(error, path)
        return error
    _check_result(raw, parser, path)
    return raw


def _check_error(error: DataFormatError, path: Path) -> None:
    """One line, ``<file>:<line>: <problem>``, with a line that exists (line 1 for an empty file)."""
    message = str(error)
    assert len(message.splitlines()) == 1, f"not one line: {message!r}"
    assert error.path == str(path) and message.startswith(f"{path}:{error.line}: "), message
    with open(path, encoding="utf-8", errors="surrogateescape") as f:  # the parsers' own line splitting
        lines = sum(1 for _ in f)
    assert 1 <= error.line <= max(lines, 1), f"line {error.line} of a {lines}-line file: {message}"


def _check_result(raw: RawInteractions, parser: str, path: Path) -> None:
    """The shape and types RawInteractions documents, and ids as the format defines them."""
    assert isinstance(raw, RawInteractions) and raw.path == path
    n = raw.users.shape[0]
    assert raw.users.shape == raw.items.shape == (n,)
    for column in (raw.ratings, raw.timestamps):
        assert column is None or (column.dtype == np.float64 and column.shape == (n,) and np.isfinite(column).all())
    if parser == "lightgcn":
        assert raw.users.dtype == raw.items.dtype == np.int64 and raw.ratings is None and raw.timestamps is None
        assert n == 0 or min(raw.users.min(), raw.items.min()) >= 0
        return
    assert raw.users.dtype.kind == raw.items.dtype.kind == "U"
    for ids in (raw.users.tolist(), raw.items.tolist()):
        # an id is its field stripped: never empty, never edged by whitespace
        assert all(token and token == token.strip() for token in ids), ids
        if parser == "movielens":
            assert all(token.isascii() and token.isdigit() for token in ids), ids


def main(argv: list[str] | None = None) -> None:
    """Fuzz one parser; arguments other than ``--parser`` are libFuzzer's."""
    import atheris  # only the fuzzing run needs it (the `fuzz` extra), not the corpus replay

    options = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    options.add_argument("--parser", required=True, choices=sorted(PARSERS))
    args, libfuzzer_args = options.parse_known_args(sys.argv[1:] if argv is None else argv)
    # Coverage from the parsers' own code only: instrumenting torch and numpy on import would take
    # minutes and steer the search into them. instrument_func patches the code objects in place.
    for function in vars(parsers).values():
        if inspect.isfunction(function) and function.__module__ == parsers.__name__:
            atheris.instrument_func(function)
    folder = Path(tempfile.mkdtemp(prefix="fuzz-parsers-"))
    atheris.Setup([sys.argv[0], *libfuzzer_args], lambda data: check(args.parser, data, folder))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
