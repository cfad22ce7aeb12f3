"""Where the tests, benchmarks and CI find the real datasets (ml-100k, ml-1m, ml-1m-full, gowalla)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: the checkout this module lives in (an editable install); elsewhere only $PNN_FAST_DATA applies
_CHECKOUT = Path(__file__).resolve().parents[2]


def _cloned_from(checkout: Path) -> Path | None:
    """The local repository ``checkout`` was cloned from (``git clone /work/main /tmp/ci``), or None.

    A throwaway clone made to test a commit has no ``shared/`` beside it, but the repository it came
    from has; remote URLs that are not local paths (https, ssh) give None."""
    try:
        url = subprocess.run(["git", "-C", str(checkout), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git, or not a repository
        return None
    url = url.removeprefix("file://")
    return Path(url).resolve() if url.startswith("/") else None


def default_data_dir(checkout: Path = _CHECKOUT) -> Path:
    """The dataset folder: ``$PNN_FAST_DATA`` when set and not empty; else ``shared/data`` beside the
    checkout; else beside the local repository the checkout was cloned from. When none of these
    exists it returns the one beside the checkout, so that a message naming it says where data goes.

    Args:
        checkout: the repository root (this package's own checkout by default).
    Returns:
        a ``Path``, which exists unless no candidate does (then the caller skips or fails, naming it).
    """
    if os.environ.get("PNN_FAST_DATA"):
        return Path(os.environ["PNN_FAST_DATA"])
    beside = checkout.parent / "shared" / "data"
    if beside.is_dir():  # the usual case: no git process at import of every test and bench module
        return beside
    origin = _cloned_from(checkout)
    if origin is not None and (origin.parent / "shared" / "data").is_dir():
        return origin.parent / "shared" / "data"
    return beside
