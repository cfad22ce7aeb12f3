"""pnn_fast::unknown_items, uniform draws mapped to items a user has not interacted with (the
sampler's kernel; not differentiable): the kernel and the reference enumerate every unknown item
exactly and agree on draws at real sizes, opcheck, and bad draws and users."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, make_batch, requires_kernels, deferred_error
from pnn_fast import KnownPositives, _extension
from pnn_fast.sampling import sample_unknown, unknown_from_uniform

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def small_known(device="cpu") -> KnownPositives:
    """Users with no item, the first item, the last item, every item but one, and a random few."""
    items = {0: [], 1: [0], 2: [9], 3: [0, 1, 2, 3, 4, 5, 6, 8, 9], 4: [2, 3, 7]}
    users = [u for u, its in items.items() for _ in its]
    flat = [i for its in items.values() for i in its]
    return KnownPositives.from_pairs(torch.tensor(users), torch.tensor(flat), 5, 10).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_unknown_from_uniform_enumerates_the_unknown_items(device, backend):
    known = small_known(device)
    for user in range(5):
        unknown = sorted(set(range(10)) - set(known.indices[known.indptr[user]:known.indptr[user + 1]].tolist()))
        # the middle of each rank's interval, and its two ends (0 and the largest float32 below 1)
        middle = (torch.arange(len(unknown), dtype=torch.float32) + 0.5) / len(unknown)
        ends = torch.tensor([0.0, 1.0 - 2.0**-24])
        uniform = torch.cat([middle, ends]).to(device)[None, :]
        got = unknown_from_uniform(known, torch.tensor([user], device=device), uniform, backend)
        assert got.tolist() == [unknown + [unknown[0], unknown[-1]]], (user, backend)


def test_kernel_and_reference_samplers_agree_on_real_sizes():
    gen = torch.Generator().manual_seed(3)
    users = torch.randint(0, 300, (20000,), generator=gen)
    items = torch.randint(0, 2000, (20000,), generator=gen)
    known = KnownPositives.from_pairs(users, items, 300, 2000)
    batch = torch.randint(0, 300, (4096,), generator=gen)
    uniform = torch.rand(4096, 5, generator=gen)
    fused = unknown_from_uniform(known, batch, uniform, "cpu")
    assert torch.equal(fused, unknown_from_uniform(known, batch, uniform, "reference"))
    assert not known.contains(batch[:, None], fused).any()
    assert torch.equal(sample_unknown(known, batch, 3, torch.Generator().manual_seed(1), backend="cpu"),
                       sample_unknown(known, batch, 3, torch.Generator().manual_seed(1), backend="reference"))


@pytest.mark.parametrize("per_row", [1, 7, 37, 800])
def test_many_draws_per_user_agree_with_the_reference_on_any_thread_count(per_row):
    """Few draws a row (1 and 7, under the kernel's 32): groups of draws searched in lockstep, each
    group running its longest row's steps; groups and thread chunks straddle rows, and rows of every
    length meet in one group.  Many (37 and SL's 800): each row's rank index, or the searches where a
    row is too long to pay for one (1500 and 2999 known at 37 draws), over rows of every length and
    rows whose known items come in runs."""
    gen = torch.Generator().manual_seed(11)
    num_items = 3000
    lengths = [0, 1, 2, 3, num_items - 1, 1500, 64, 65, 127, 128, 129] + torch.randint(0, 400, (89,), generator=gen).tolist()
    rows = [torch.randperm(num_items, generator=gen)[:n] for n in lengths]
    # and known items in runs of consecutive ids, which the rank index's scans cross: one run of 1500,
    # and twenty short ones
    rows += [torch.arange(700, 2200), torch.cat([torch.arange(a, a + 40) for a in range(0, 2800, 140)])]
    users = [u for u, row in enumerate(rows) for _ in range(row.numel())]
    items = torch.cat(rows)
    known = KnownPositives.from_pairs(torch.tensor(users), items, len(rows), num_items)
    batch = torch.randint(0, len(rows), (301,), generator=gen)
    uniform = torch.rand(301, per_row, generator=gen)
    uniform[0, 0], uniform[-1, -1] = 0.0, 1.0 - 2.0**-24  # the first and the last unknown item
    expected = unknown_from_uniform(known, batch, uniform, "reference")
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert torch.equal(unknown_from_uniform(known, batch, uniform, "cpu"), expected), count
    finally:
        torch.set_num_threads(threads)
    assert not known.contains(batch[:, None], expected).any()


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    known = make_batch(4, 3, num_items=20, seed=8, device=device)["known"]
    users = torch.tensor([0, 1, 1, 3], device=device)
    uniform = torch.rand(4, 3, generator=torch.Generator().manual_seed(8)).to(device)
    return [(torch.ops.pnn_fast.unknown_items.default, [known.indptr, known.indices, users, uniform, known.num_items])]


@pytest.mark.parametrize("device", DEVICES)
def test_unknown_items_rejects_bad_draws_and_users(device):
    """Deferred input errors: recorded on the device with no read-back (on CUDA a read-back is a
    synchronisation, and a device-side assert would leave the context unusable:
    tests/test_ids_checked_before_launch.py runs an op after such errors), read by check_kernel_inputs."""
    full = KnownPositives.from_pairs(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]), 2, 2).to(device)  # user 0 knows all
    zero = torch.tensor([0], device=device)
    message = r"^pnn_fast::unknown_items: uniform must lie in \[0, 1\) and every user must have an unknown item$"
    with deferred_error(message, device):
        ops.unknown_items(full, zero, torch.tensor([[0.5]], device=device))
    known = small_known(device)
    for bad in (1.0, -0.25, float("nan")):
        with deferred_error(message, device):
            ops.unknown_items(known, zero, torch.tensor([[bad]], device=device))
    with deferred_error(r"^pnn_fast::unknown_items: users has ids outside \[0, 5\)$", device):
        ops.unknown_items(known, torch.tensor([5], device=device), torch.tensor([[0.0]], device=device))
    with pytest.raises(RuntimeError, match="uniform must be Float"):
        ops.unknown_items(known, zero, torch.tensor([[0.0]], dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="backend must be one of"):
        unknown_from_uniform(known, torch.tensor([0]), torch.tensor([[0.0]]), "gpu")
