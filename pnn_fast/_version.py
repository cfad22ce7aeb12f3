"""The package version (pyproject.toml states it too, and tests/test_build.py checks that they agree),
and the source revision that runs, which a training run records beside each epoch."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__version__ = "0.1.0"

#: the paths whose changes change what a run computes: a study's own results and docs do not
SOURCE_PATHS = ("pnn_fast", "csrc", "setup.py", "pyproject.toml")


@functools.cache  # the code a process runs is the code it imported: one answer per process
def source_revision() -> str | None:
    """The git commit of the checkout this package is imported from (12 hex digits), with "+dirty"
    when a tracked file under :data:`SOURCE_PATHS` differs from it; None where the package is not the
    top of a git checkout (an installed wheel) or git is unavailable.

    Studies run for hours while the code under them may change: each epoch of a run records this,
    so a results.json says which code trained it.
    """
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # a package inside some other repository (a virtual environment in a project) is not its source
    if top is None or Path(top).resolve() != root:
        return None
    head = git("rev-parse", "--short=12", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", *SOURCE_PATHS)
    if head is None or changed is None:
        return None
    return head + ("+dirty" if changed else "")
