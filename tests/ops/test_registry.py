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


def _tensors(value) -> list:
    """The tensors of an op's result (one tensor or a tuple of them), in order."""
    return [t for t in (value if isinstance(value, (tuple, list)) else (value,)) if isinstance(t, torch.Tensor)]


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device and the CUDA kernels")
def test_every_op_captures_into_a_cuda_graph_with_fresh_outputs_from_its_pool():
    """torch.compile's mode="reduce-overhead" records the step into CUDA graphs and then checks that
    each output it did not receive as an input lives in the graphs' memory pool ("These storage data
    ptrs are not allocated in pool"). Here each opcheck case of every op is captured on its own, its
    outputs are checked the same way (and for aliasing an input or each other, which the schemas do
    not declare), and a replay must give the eager result: a failure names the op that breaks it."""
    problems = []
    for path in OP_TEST_FILES:
        for op, args in load(path).opcheck_cases("cuda"):
            args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
            with torch.no_grad():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    expected = _tensors(op(*args))  # the eager result, and the warm-up a capture needs first
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                torch._C._cuda_clearCublasWorkspaces()  # as torch's CUDA-graph trees do: not a live output
                try:
                    with torch.cuda.graph(graph):
                        outputs = _tensors(op(*args))
                except RuntimeError as error:
                    problems.append(f"{op.name()}: the capture failed: {str(error).splitlines()[0]}")
                    continue
                torch._C._cuda_clearCublasWorkspaces()
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            pointers = [t.untyped_storage().data_ptr() for t in outputs]
            fresh = [p for p in pointers if p != 0]
            if inputs & set(fresh):
                problems.append(f"{op.name()}: an output is an input's storage")
            if len(set(fresh)) != len(fresh):
                problems.append(f"{op.name()}: two outputs share a storage")
            if not torch._C._cuda_checkPoolLiveAllocations(torch.cuda.current_device(), graph.pool(), set(fresh)):
                problems.append(f"{op.name()}: the graph's pool does not hold exactly its outputs")
            graph.replay()
            torch.cuda.synchronize()
            for i, (got, want) in enumerate(zip(outputs, expected)):
                if not torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-6, equal_nan=True):
                    problems.append(f"{op.name()}: output {i} of the replay differs from the eager call")
    assert not problems, "\n".join(problems)
