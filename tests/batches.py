"""Inputs and helpers shared by the op tests (tests/ops/), the backend tests and the loss tests.

Two kinds of inputs keep a comparison with the reference about arithmetic, not about the luck
of rounding at a class boundary (the argmax and the bottom-k selection are discontinuous in the
scores):

* grid inputs, multiples of 1/16 in [-4, 4] (float32 and the tie tests): every score and
  distance is exact whatever the summation order, so equal scores are equal in both backends,
  and repeated items (ties broken by the smallest candidate index) can be tested;
* continuous float64 inputs with distinct candidates in each row.  Repeated items are left out
  there because the reference's matmul does not give two equal columns bit-identical scores
  (MKL edge kernels), so its tie-break between them is decided by rounding noise.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.known import KnownPositives
from pnn_fast.models import build_model

#: skips a whole test module (``pytestmark = requires_kernels``) when the extension is not built
requires_kernels = pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")

#: the devices with compiled kernels: cpu, and cuda where there are a GPU and the CUDA kernels
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _extension.has_kernels("cuda") else [])

#: fused against reference: the tolerance of each dtype
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float64: {"rtol": 1e-10, "atol": 1e-10}}

#: the names of make_batch's entries that the per-row ops take, in their order
ROW_ARGS = ("user_emb", "item_table", "users", "pos_items", "candidates", "known")


@contextlib.contextmanager
def deferred_error(match: str, device="cpu"):
    """The ops' deferred input errors (csrc/common/checks.h): the body's calls run, and the next
    ``check_kernel_inputs`` raises a ValueError matching ``match``, then nothing (the error is cleared)."""
    from pnn_fast import check_kernel_inputs

    check_kernel_inputs(device)  # nothing left over from an earlier test
    yield
    with pytest.raises(ValueError, match=match) as info:
        check_kernel_inputs(device)
    assert "\n" not in str(info.value)
    check_kernel_inputs(device)


def make_batch(rows: int, dim: int, *, per_row: int | None = None, dtype=torch.float64,
               grid: bool | None = None, num_users: int = 100, num_items: int = 400, known_per_user: int = 8,
               seed: int = 0, device="cpu") -> dict:
    """Random inputs of pnn_row_terms and of the per-row ops (see the module docstring).

    ``per_row=None`` gives shared (in-batch) candidates ``pos_items``, else ``[rows, per_row]``
    sampled ones.  ``grid`` defaults to True below float64; without it the candidates of a row
    are distinct.  Few items make repeated items and rows with zero or one unlabeled candidate
    common.
    """
    grid = dtype != torch.float64 if grid is None else grid
    gen = torch.Generator().manual_seed(seed)
    pair_users = torch.randint(0, num_users, (num_users * known_per_user,), generator=gen)
    pair_items = torch.randint(0, num_items, (num_users * known_per_user,), generator=gen)
    known = KnownPositives.from_pairs(pair_users, pair_items, num_users, num_items)
    order = torch.randperm(pair_users.numel(), generator=gen)
    if not grid and per_row is None:  # one interaction per positive item: distinct shared candidates
        first = torch.ones_like(order, dtype=torch.bool)
        first[1:] = pair_items[order][1:] != pair_items[order][:-1]
        order = order[torch.sort(pair_items[order], stable=True).indices][first]
        order = order[torch.randperm(order.numel(), generator=gen)]
        assert order.numel() >= rows, "not enough distinct items for distinct candidates"
    pick = order[:rows] if order.numel() >= rows else torch.randint(0, order.numel(), (rows,), generator=gen)

    def embedding(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        if grid:
            x = (x * 16).round().clamp(-64, 64) / 16
        return x.to(dtype)

    batch = {
        "user_emb": embedding(rows, dim), "item_table": embedding(num_items, dim),
        "users": pair_users[pick], "pos_items": pair_items[pick],
        "noise_pos": torch.rand(rows, dim, generator=gen, dtype=torch.float64).to(dtype) * 0.1,
        "noise_neg": torch.rand(rows, dim, generator=gen, dtype=torch.float64).to(dtype) * 0.1,
    }
    if per_row is None:
        batch["candidates"] = batch["pos_items"]
    elif grid:
        batch["candidates"] = torch.randint(0, num_items, (rows, per_row), generator=gen)
    else:
        batch["candidates"] = torch.rand(rows, num_items, generator=gen).argsort(dim=1)[:, :per_row]
    batch = {name: x.to(device) for name, x in batch.items()}
    batch["known"] = known.to(device)
    return batch


def row_args(batch: dict) -> list:
    """The arguments of the per-row op wrappers (``pnn_fast.ops``), from a make_batch batch."""
    return [batch[name] for name in ROW_ARGS]


def raw_args(batch: dict) -> list:
    """The positional tensors of the registered per-row ops (``torch.ops.pnn_fast``)."""
    known = batch["known"]
    return [batch["user_emb"], batch["item_table"], batch["users"], batch["pos_items"], batch["candidates"],
            known.indptr, known.indices]


def reference_classes(batch: dict, k: torch.Tensor):
    """(scores, unlabeled, negative) of reference.py, the negative class being the k[b] lowest."""
    scores = reference.row_scores(batch["user_emb"], batch["item_table"], batch["candidates"])
    unlabeled = reference.unlabeled_mask(batch["known"], batch["users"], batch["pos_items"], batch["candidates"])
    return scores, unlabeled, reference.bottom_k_mask(scores, unlabeled, k)


def bpr_inputs(dtype=torch.float64, device="cpu", rows=64, negatives=3, seed=0):
    """(user_table, item_table, users, pos, neg) for the table-lookup ops: many repeated users and
    items, so that the scatters of the backward have to add up."""
    gen = torch.Generator().manual_seed(seed)
    user_table = torch.randn(12, 7, generator=gen, dtype=torch.float64).to(dtype).to(device)
    item_table = torch.randn(30, 7, generator=gen, dtype=torch.float64).to(dtype).to(device)
    users = torch.randint(0, 12, (rows,), generator=gen).to(device)
    pos = torch.randint(0, 30, (rows,), generator=gen).to(device)
    neg = torch.randint(0, 30, (rows, negatives), generator=gen).to(device)
    return user_table, item_table, users, pos, neg


def tiny_mf(known: dict, num_items: int, dim: int, seed: int = 0, varied_norms: bool = False):
    """(KnownPositives, float64 MF model) over ``known`` {user: [items]}, users 0 .. len(known) - 1, with
    N(0, 1) embeddings; ``varied_norms`` scales each row by a factor in [0.1, 3.1), so that cosine
    scores differ from dot products."""
    torch.manual_seed(seed)
    num_users = len(known)
    users = torch.tensor([u for u, items in known.items() for _ in items])
    items = torch.tensor([i for row in known.values() for i in row])
    model = build_model("mf", num_users, num_items, users, items, dim=dim).double()
    with torch.no_grad():
        for table, rows in ((model.user_embedding.weight, num_users), (model.item_embedding.weight, num_items)):
            table.normal_()
            if varied_norms:
                table.mul_(torch.rand(rows, 1, dtype=torch.float64) * 3 + 0.1)
    return KnownPositives.from_pairs(users, items, num_users, num_items), model


def value_and_grads(fn, first, second, *rest):
    """(value, d value / d first, d value / d second) of the scalar ``fn(first, second, *rest)``,
    on copies of the two tensors."""
    first, second = first.clone().requires_grad_(), second.clone().requires_grad_()
    value = fn(first, second, *rest)
    value.backward()
    return value.detach(), first.grad, second.grad


def under_thread_counts(counts, fn) -> list:
    """``[fn() under torch.set_num_threads(n) for n in counts]``; the thread count is restored after."""
    threads = torch.get_num_threads()
    results = []
    try:
        for n in counts:
            torch.set_num_threads(n)
            results.append(fn())
    finally:
        torch.set_num_threads(threads)
    return results
