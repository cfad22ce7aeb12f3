"""Replay of the parser fuzzer's corpus and crash reproducers (tests/fuzz/), without atheris.

Every file of ``tests/fuzz/corpus/<parser>/`` and ``tests/fuzz/crashes/<parser>/`` goes through
the fuzzer's own :func:`check`: it must parse into well-formed interactions or raise a one-line
DataFormatError naming an existing line. Corpus seeds are named for what they are: ``valid*``
must parse, the others must be rejected. A crash reproducer only has to stop crashing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.fuzz_parsers import PARSERS, check
from pnn_fast.data.dataset import DataFormatError

FUZZ = Path(__file__).resolve().parent / "fuzz"
CORPUS = sorted(FUZZ.glob("corpus/*/*"))
CRASHES = sorted(FUZZ.glob("crashes/*/*"))


def test_every_parser_has_seeds_of_both_kinds():
    for parser in PARSERS:
        names = [path.name for path in CORPUS if path.parent.name == parser]
        assert any(name.startswith("valid") for name in names), parser
        assert any(not name.startswith("valid") for name in names), parser


@pytest.mark.parametrize("path", CORPUS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_corpus_seed(path, tmp_path):
    outcome = check(path.parent.name, path.read_bytes(), tmp_path)
    if path.name.startswith("valid"):
        assert not isinstance(outcome, DataFormatError), str(outcome)
    else:
        assert isinstance(outcome, DataFormatError), f"{path.name} parsed"


@pytest.mark.parametrize("path", CRASHES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_crash_reproducer(path, tmp_path):
    check(path.parent.name, path.read_bytes(), tmp_path)
