import os
from pathlib import Path

import pytest
import torch

from pnn_fast.data import default_data_dir

DATA_DIR = default_data_dir()


def data_path(name: str) -> Path:
    """Folder of a shared dataset, or skip the test when it is absent."""
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"dataset {name!r} not found under {DATA_DIR} (set PNN_FAST_DATA)")
    return path


@pytest.fixture
def one_thread():
    """torch at one thread for the test: the machines running these tests are small and shared,
    so the test's intra-op threads would only contend (``pytestmark = pytest.mark.usefixtures(...)``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# hypothesis profiles (tests/test_property_parity.py): "ci", the default, replays the same examples
# on every run; HYPOTHESIS_PROFILE=long searches far more, randomly.  No example database: a failure
# prints its reproduction (@example / @reproduce_failure blob) instead of hiding it in .hypothesis/.
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test extra; the property tests skip without it
    pass
else:
    _SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, database=None,
                              print_blob=True, suppress_health_check=_SLOW_DATA)
    settings.register_profile("long", max_examples=5000, deadline=None, database=None, print_blob=True,
                              suppress_health_check=_SLOW_DATA)
    # .ci/sanitize: "ci" with a quarter of the examples (and every @example), which keeps the ASan/UBSan
    # run (each example several times slower) within its share of CI's time
    settings.register_profile("sanitize", parent=settings.get_profile("ci"), max_examples=50)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
