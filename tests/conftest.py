import os
from pathlib import Path

import pytest

DATA_DIR = Path(os.environ.get("PNN_FAST_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def data_path(name: str) -> Path:
    """Folder of a shared dataset, or skip the test when it is absent."""
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"dataset {name!r} not found under {DATA_DIR} (set PNN_FAST_DATA)")
    return path
