"""Files written whole or not at all."""
from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: os.PathLike | str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file beside it and an atomic rename.

    Whatever stops the process in between, a reader sees the old file or the new one, never a part
    of the new one: a study takes a cell with a ``results.json`` as finished, so a truncated one
    would be skipped for good and break the summary.  The temporary name carries the process id,
    so two processes writing the same file (two studies' summaries) do not write into one another.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
