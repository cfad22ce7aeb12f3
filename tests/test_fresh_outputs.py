"""What a CUDA graph needs, checked on the CPU: every op and every loss returns fresh tensors.

``torch.compile(mode="reduce-overhead")`` replays a step from CUDA graphs and requires each output
to live in the graphs' memory pool ("storage data ptrs are not allocated in pool"). An output that
aliases an input, another output, or state kept across calls (a saved buffer, a workspace or a
cached tensor on a module or a ``KnownPositives``) breaks that, and the cached kind also hands the
caller a tensor the next call overwrites. These tests find each kind without a GPU: outputs are
compared, by storage, with the inputs, with each other, with every tensor the module or the known
positives hold, and with the outputs of a previous call that are still alive.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from batches import requires_kernels

pytestmark = requires_kernels

#: the op test files, each with its ``opcheck_cases(device)`` (test_registry.py runs them)
OP_TESTS = sorted(p for p in (Path(__file__).parent / "ops").glob("test_*.py") if p.name != "test_registry.py")


def _storages(tensors) -> list:
    """The data pointers of the tensors' storages (0, an empty storage, left out)."""
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            pointer = t.untyped_storage().data_ptr()
            if pointer:
                out.append(pointer)
        elif isinstance(t, torch.Tensor):  # a sparse gradient: its indices and values
            out += _storages([t._indices(), t._values()])
    return out


def _flat(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def _held(obj, seen=None) -> list:
    """Every tensor an object holds in its attributes (modules, KnownPositives, their caches), recursively."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    found = []
    if isinstance(obj, torch.nn.Module):
        found += list(obj.parameters()) + list(obj.buffers())
    for value in getattr(obj, "__dict__", {}).values():
        if isinstance(value, (torch.Tensor, torch.nn.Module)) or hasattr(value, "__dict__"):
            found += _held(value, seen)
        elif isinstance(value, (tuple, list, dict)):
            for item in _flat(value):
                found += _held(item, seen)
    return found


def _problems(name: str, outputs, inputs, held, earlier) -> list:
    mine = _storages(outputs)
    found = []
    if set(mine) & set(_storages(inputs)):
        found.append(f"{name}: an output is an input's storage")
    if len(set(mine)) != len(mine):
        found.append(f"{name}: two outputs share a storage")
    if set(mine) & set(_storages(held)):
        found.append(f"{name}: an output is a tensor the module or its known positives keep")
    if set(mine) & set(_storages(earlier)):
        found.append(f"{name}: an output is a previous call's output (a cached buffer)")
    return found


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"fresh_outputs_cases_of_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", OP_TESTS, ids=lambda path: path.stem)
def test_every_op_returns_fresh_tensors(path):
    """Each opcheck case of every op, called twice: no output is an input, another output, or an
    output of the first call (kept alive, so a reused buffer would show)."""
    problems = []
    for op, args in _load(path).opcheck_cases("cpu"):
        args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.no_grad():
            first = _flat(op(*args))
            second = _flat(op(*args))
        inputs = [t for a in args for t in _flat(a)]
        problems += _problems(op.name(), first, inputs, [], [])
        problems += _problems(op.name(), second, inputs, [], first)
    assert not problems, "\n".join(problems)


# every loss of tests/test_sparse.py, dense and sparse, with return_components where it has them
from test_sparse import DIM, _problem  # noqa: E402

from pnn_fast import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss  # noqa: E402

LOSSES = {
    "pnn-in-batch": lambda known, sparse: PNNLoss(known, DIM, sparse=sparse).double(),
    "pnn-preset": lambda known, sparse: PNNLoss.from_preset("dns-anchored", known, DIM, sparse=sparse).double(),
    "dns": lambda known, sparse: DNSLoss(known, sparse=sparse),
    "bpr": lambda known, sparse: BPRLoss(sparse=sparse),
    "sl": lambda known, sparse: SampledSoftmaxLoss(known, num_negatives=9, sparse=sparse),
}


def _call(name, loss_fn, user_emb, item_table, users, pos, neg, noise):
    if name.startswith("pnn"):
        loss, components = loss_fn(user_emb, item_table, users, pos, None if name == "pnn-in-batch" else neg,
                                   noise=noise, return_components=True)
        return [loss, *components.values()]
    if name == "bpr":
        return [loss_fn(user_emb, item_table, pos, neg)]
    return [loss_fn(user_emb, item_table, users, pos, neg)]


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_returns_fresh_tensors_and_gradients(name, sparse):
    """A loss's outputs (its per-row components too) and the gradients its backward leaves are fresh:
    not an input, not each other, not a tensor the module keeps, not a previous call's."""
    known, users, pos, neg, user_table, item_table, noise = _problem(4)
    user_table.requires_grad_(True)
    item_table.requires_grad_(True)
    loss_fn = LOSSES[name](known, sparse)
    inputs = [user_table, item_table, users, pos, neg, *noise]
    problems, earlier, earlier_grads = [], [], []
    for call in range(2):
        user_emb = user_table.index_select(0, users)
        outputs = _call(name, loss_fn, user_emb, item_table, users, pos, neg, noise)
        held = _held(loss_fn) + _held(known)
        problems += _problems(f"{name} call {call + 1}", outputs, inputs + [user_emb], held, earlier)
        user_table.grad = item_table.grad = None
        outputs[0].backward()
        grads = [user_table.grad, item_table.grad]
        problems += _problems(f"{name} call {call + 1}'s gradients", grads, inputs, held, earlier_grads)
        earlier, earlier_grads = outputs, grads
    assert not problems, "\n".join(problems)


def test_each_kind_of_shared_storage_is_found():
    """The checks above can fail: each kind of sharing, made on purpose, is reported."""
    x, cache = torch.randn(4, 3), torch.zeros(2)
    first = [torch.ones(2)]
    assert _problems("input", [x[1:]], [x], [], []) == ["input: an output is an input's storage"]
    assert _problems("pair", [x, x.view(-1)], [], [], []) == ["pair: two outputs share a storage"]
    assert _problems("cache", [cache], [], [cache], []) == [
        "cache: an output is a tensor the module or its known positives keep"]
    assert _problems("again", first, [], [], first) == ["again: an output is a previous call's output (a cached buffer)"]
    assert _problems("fresh", [torch.ones(2), torch.zeros(3)], [x], [cache], first) == []
    module = torch.nn.Linear(2, 2)
    module.workspace = torch.empty(5)  # a workspace kept on a module is found among what it holds
    assert module.workspace.untyped_storage().data_ptr() in _storages(_held(module))
