"""pnn_fast::history_sample, a uniform random subset of a user's known items by Floyd's algorithm
(the attention's history; not differentiable): against the reference on random draws and on the
ends of [0, 1), the subsets' frequencies, opcheck, and bad draws and users."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, requires_kernels, deferred_error
from pnn_fast import KnownPositives, _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def history_known() -> KnownPositives:
    """Users with 0, 1, 3, 5 (= L), 6, 40 and 300 known items among 400."""
    gen = torch.Generator().manual_seed(9)
    sizes = [0, 1, 3, 5, 6, 40, 300]
    users = torch.cat([torch.full((n,), u) for u, n in enumerate(sizes)])
    items = torch.cat([torch.randperm(400, generator=gen)[:n] for n in sizes])
    return KnownPositives.from_pairs(users, items, len(sizes), 400)


@pytest.mark.parametrize("device", DEVICES)
def test_history_sample_is_a_subset_of_min_n_l_known_items_and_matches_the_reference(device):
    known = history_known().to(device)
    users = torch.tensor([6, 0, 5, 1, 6, 2, 4, 3, 5], device=device)
    uniform = torch.rand(users.numel(), 5, generator=torch.Generator().manual_seed(4)).to(device)
    got = ops.history_sample(known, users, uniform)
    assert torch.equal(got, reference.history_sample(known, users, uniform))
    for row, user in zip(got.tolist(), users.tolist()):
        mine = set(known.indices[known.indptr[user]:known.indptr[user + 1]].tolist())
        taken = [i for i in row if i >= 0]
        assert len(taken) == min(len(mine), 5) and len(set(taken)) == len(taken) and set(taken) <= mine
        assert row[len(taken):] == [-1] * (5 - len(taken))
    # the same draws give the same subsets; the ends of [0, 1) are valid draws
    ends = torch.tensor([[0.0, 1.0 - 2.0**-24] * 2 + [0.0]], device=device).expand(users.numel(), -1).contiguous()
    assert torch.equal(ops.history_sample(known, users, ends), reference.history_sample(known, users, ends))


@pytest.mark.parametrize("device", DEVICES)
def test_history_sample_of_long_histories_matches_the_reference(device):
    """L = 250 of the 300-item user: most steps of Floyd's algorithm meet a position already taken,
    over several 64-bit words of the CPU's bitmap; rows of that user alternate with others, so a
    row that starts from positions the previous row left set would differ."""
    known = history_known().to(device)
    users = torch.tensor([6, 6, 5, 6, 0, 6, 4, 6], device=device)
    uniform = torch.rand(users.numel(), 250, generator=torch.Generator().manual_seed(5)).to(device)
    got = ops.history_sample(known, users, uniform)
    assert torch.equal(got, reference.history_sample(known, users, uniform))
    assert (got[0] >= 0).sum() == 250 and got[0].unique().numel() == 250


def test_history_sample_draws_every_subset_equally_often():
    """6 items, subsets of 3: each of the 20 subsets about 1/20 of 20000 draws (fixed seed)."""
    known = KnownPositives.from_pairs(torch.zeros(6, dtype=torch.long), torch.arange(6), 1, 6)
    uniform = torch.rand(20000, 3, generator=torch.Generator().manual_seed(0))
    subsets = ops.history_sample(known, torch.zeros(20000, dtype=torch.long), uniform).sort(dim=1).values
    keys = (subsets * torch.tensor([36, 6, 1])).sum(dim=1)
    counts = torch.bincount(keys, minlength=216)
    counts = counts[counts > 0]
    assert counts.numel() == 20
    chi2 = ((counts - 1000.0) ** 2 / 1000.0).sum().item()
    assert chi2 < 43.8  # the 0.999 quantile of chi-square with 19 degrees of freedom


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op."""
    known = history_known().to(device)
    users = torch.tensor([6, 0, 5, 2], device=device)
    uniform = torch.rand(4, 3, generator=torch.Generator().manual_seed(8)).to(device)
    return [(torch.ops.pnn_fast.history_sample.default, [known.indptr, known.indices, users, uniform])]


@pytest.mark.parametrize("device", DEVICES)
def test_history_sample_rejects_bad_draws(device):
    """Deferred input errors (no read-back, on CUDA too; see test_unknown_items_rejects_bad_draws_and_users),
    with an output inside the user's items or -1 meanwhile."""
    known = history_known().to(device)
    users = torch.tensor([6, 2], device=device)
    for bad in (1.0, -0.5, float("nan")):
        with deferred_error(r"^pnn_fast::history_sample: uniform must lie in \[0, 1\)$", device):
            out = ops.history_sample(known, users, torch.full((2, 4), bad, device=device))
        assert ((out == -1) | known.contains(users[:, None], out.clamp_min(0))).all()
    with pytest.raises(RuntimeError, match="uniform"):
        ops.history_sample(known, users, torch.rand(2, 4, dtype=torch.float64, device=device))
    with deferred_error(r"^pnn_fast::history_sample: users has ids outside \[0, 7\)$", device):
        ops.history_sample(known, torch.tensor([7, 0], device=device), torch.rand(2, 4, device=device))
