"""Every registered ``pnn_fast::`` schema is opchecked with the cases of the test file named after
its op (``opcheck_cases(device)`` in tests/ops/test_<op>.py, for the schema <op> or <op>_fwd /
<op>_bwd): a new op without an opcheck fails here. The opchecks themselves run here, once per op
file and device."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from batches import DEVICES, requires_kernels

pytestmark = requires_kernels

OP_TEST_FILES = sorted(path for path in Path(__file__).parent.glob("test_*.py") if path.name != Path(__file__).name)


def registered_schemas() -> set:
    """The names ("pnn_fast::<schema>") of the ops the extension registered."""
    return {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("pnn_fast::")}


def op_of(schema: str) -> str:
    """The op a schema belongs to: "pnn_fast::class_centroids_bwd" -> "class_centroids"."""
    return re.sub(r"_(fwd|bwd)$", "", schema.removeprefix("pnn_fast::"))


def load(path: Path):
    """The test module at ``path``, loaded from its file (whatever pytest's import mode)."""
    spec = importlib.util.spec_from_file_location(f"opcheck_cases_of_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_registered_schema_is_opchecked_by_the_file_of_its_op():
    opchecked_by = {}
    for path in OP_TEST_FILES:
        for op, _ in load(path).opcheck_cases("cpu"):
            opchecked_by.setdefault(op.name(), set()).add(path.stem)
    assert set(opchecked_by) == registered_schemas()
    for schema, files in opchecked_by.items():
        assert files == {f"test_{op_of(schema)}"}, schema


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", OP_TEST_FILES, ids=lambda path: path.stem)
def test_opcheck(path, device):
    for op, args in load(path).opcheck_cases(device):
        torch.library.opcheck(op, args)
