"""The ``pnn-fast`` command (and ``python -m pnn_fast``): the CLI of :mod:`pnn_fast.cli`, or, where
the trainer's packages are not installed, one line saying how to install them.

The loss library itself (``pip install pnn_fast``) needs only torch and numpy; the trainer, the
study runner and the plots need the ``train`` extra.
"""
from __future__ import annotations

import sys

#: the packages of the ``train`` extra (pyproject.toml) that the CLI's modules import
TRAIN_EXTRA = ("tqdm", "scipy", "matplotlib", "tomli")

try:
    from .cli import main as cli_main
    MISSING = None
except ModuleNotFoundError as err:  # only the train extra's packages: anything else is a real error
    if (err.name or "").split(".")[0] not in TRAIN_EXTRA:
        raise
    cli_main, MISSING = None, err.name.split(".")[0]


def main(argv=None) -> int:
    if MISSING is not None:
        print(f"pnn-fast: the trainer needs the train extra ({MISSING} is not installed): "
              f"pip install \"pnn_fast[train]\"", file=sys.stderr)
        return 1
    return cli_main(argv)
