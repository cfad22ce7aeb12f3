"""pnn_fast::masked_topk, each score row's k best columns with per-user exclusions: against a loop
written from the definition and against the reference, on continuous random scores with planted
ties, infinities, excluded and fully excluded rows, every k from 1 to I, rows sorted ascending and
descending (the selection's worst cases), all dtypes; CPU results independent of the thread
count; NaN and bad input named; opcheck."""
from __future__ import annotations

import math

import pytest
import torch

from batches import DEVICES, requires_kernels, under_thread_counts
from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.csr import CSR

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def random_exclusions(num_users: int, num_items: int, share: float, seed: int) -> CSR:
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(num_users, num_items, generator=g) < share
    users, items = keep.nonzero(as_tuple=True)
    return CSR.from_pairs(users, items, num_users, num_items)


def scores_with_ties(rows: int, cols: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Continuous scores; a quarter of each row copies other entries of the row (exact ties), and a
    few entries are +-inf."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    copies = torch.randint(0, cols, (rows, cols // 4), generator=g)
    targets = torch.randint(0, cols, (rows, cols // 4), generator=g)
    scores.scatter_(1, targets, scores.gather(1, copies))
    infinities = torch.randint(0, cols, (rows, 2), generator=g)
    scores.scatter_(1, infinities[:, :1], math.inf)
    scores.scatter_(1, infinities[:, 1:], -math.inf)
    return scores.to(dtype)


def by_definition(scores: torch.Tensor, users: torch.Tensor, exclude: list, k: int):
    """Sort every column of a row by (excluded -> -inf score, descending; column, ascending)."""
    values, columns = [], []
    for r in range(scores.shape[0]):
        excluded = set()
        for csr in exclude:
            u = int(users[r])
            excluded |= set(csr.indices[csr.indptr[u]:csr.indptr[u + 1]].tolist())
        row = [(-math.inf if j in excluded else float(scores[r, j]), j) for j in range(scores.shape[1])]
        best = sorted(row, key=lambda entry: (-entry[0], entry[1]))[:k]
        values.append([v for v, _ in best])
        columns.append([j for _, j in best])
    return torch.tensor(values, dtype=torch.float64), torch.tensor(columns)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols,k", [(1, 1), (7, 1), (7, 7), (50, 3), (50, 20), (300, 20), (300, 299), (1000, 57)])
def test_matches_the_definition(device, cols, k):
    rows, num_users = 23, 30
    scores = scores_with_ties(rows, cols, seed=cols + k)
    users = torch.randint(0, num_users, (rows,), generator=torch.Generator().manual_seed(k))
    exclude = [random_exclusions(num_users, cols, 0.3, seed=1), random_exclusions(num_users, cols, 0.1, seed=2)]
    values, columns = ops.masked_topk(scores.to(device), users.to(device), [e.to(device) for e in exclude], k)
    want_values, want_columns = by_definition(scores, users, exclude, k)
    assert torch.equal(columns.cpu(), want_columns)
    assert torch.equal(values.cpu(), want_values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("order", ["random", "ascending", "descending"])
def test_matches_the_reference(device, dtype, order):
    rows, cols, num_users = 64, 2000, 64
    scores = scores_with_ties(rows, cols, seed=3, dtype=dtype)
    if order != "random":  # every column enters (ascending) or none after the first (descending)
        scores = scores.sort(dim=1, descending=order == "descending").values
    users = torch.randperm(num_users, generator=torch.Generator().manual_seed(4))[:rows]
    exclude = [random_exclusions(num_users, cols, 0.05, seed=5)]
    for k in (1, 20, 100, cols):
        got = ops.masked_topk(scores.to(device), users.to(device), [e.to(device) for e in exclude], k)
        want = reference.masked_topk(scores.float() if dtype in (torch.float16, torch.bfloat16) else scores,
                                     users, exclude, k)
        assert torch.equal(got[1].cpu(), want[1]), (k, order)
        assert torch.equal(got[0].cpu().to(want[0].dtype), want[0]), (k, order)


def long_rows(layout: str, rows: int, cols: int, dtype: torch.dtype):
    """(scores, users, exclusions) whose rows start the CPU scan from a sampled threshold (rows of
    256 columns or more; every 8th column sampled), laid out so that the sample misleads it."""
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    users = torch.arange(rows)
    exclude = random_exclusions(rows, cols, 0.2, seed=12)
    excluded = torch.zeros(rows, cols, dtype=torch.bool)
    excluded[exclude.entries_of(users)] = True
    if layout == "excluded_on_top":  # a trained model: the training items score highest
        scores = torch.where(excluded, scores + 10.0, scores)
    elif layout == "best_at_sampled_columns":  # the sample's best are the row's only best
        scores[:, ::8] += 10.0
    elif layout == "grid":  # a few values, so many columns tie with the threshold
        scores = torch.randint(0, 3, (rows, cols), generator=g).double()
    elif layout == "mostly_minus_inf":
        scores[torch.rand(rows, cols, generator=g) < 0.98] = -math.inf
    elif layout == "nan_at_excluded_sampled_columns":
        scores[:, ::8] = torch.where(excluded[:, ::8], math.nan, scores[:, ::8])
    return scores.to(dtype), users, [exclude]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["excluded_on_top", "best_at_sampled_columns", "grid", "mostly_minus_inf",
                                    "nan_at_excluded_sampled_columns"])
def test_long_rows_whatever_their_sample_says(device, dtype, layout):
    scores, users, exclude = long_rows(layout, rows=16, cols=1000, dtype=dtype)
    for k in (1, 20, 57, 300, 990):
        got = ops.masked_topk(scores.to(device), users.to(device), [e.to(device) for e in exclude], k)
        want = reference.masked_topk(scores, users, exclude, k)
        assert torch.equal(got[1].cpu(), want[1]), (layout, k)
        assert torch.equal(got[0].cpu(), want[0]), (layout, k)


@pytest.mark.parametrize("device", DEVICES)
def test_excluded_columns_fill_the_tail_in_column_order(device):
    """A user with fewer than k columns left: the excluded ones follow, at -inf, by column, as do
    columns scoring -inf themselves; an all-excluded row is all -inf."""
    scores = torch.tensor([[0.5, 2.0, -math.inf, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0]], device=device)
    exclude = CSR.from_pairs(torch.tensor([0, 0, 1, 1, 1, 1, 1]), torch.tensor([1, 4, 0, 1, 2, 3, 4]), 2, 5).to(device)
    values, columns = ops.masked_topk(scores, torch.tensor([0, 1], device=device), [exclude], 5)
    assert columns.tolist() == [[3, 0, 1, 2, 4], [0, 1, 2, 3, 4]]
    assert values.tolist() == [[1.0, 0.5, -math.inf, -math.inf, -math.inf], [-math.inf] * 5]
    values, columns = ops.masked_topk(scores, torch.tensor([0, 1], device=device), [], 3)
    assert columns.tolist() == [[4, 1, 3], [0, 1, 2]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [40, 600])  # below and above the sampled rows' length
def test_exclusions_outside_the_columns_match_none(device, cols):
    """Exclusion ids below 0 or at I and beyond are not checked by the op and match no column: the
    result equals that of the in-range exclusions alone."""
    scores = scores_with_ties(6, cols, seed=cols, dtype=torch.float32)
    users = torch.tensor([0, 1, 2, 0, 1, 2])
    inside = random_exclusions(3, cols, 0.2, seed=3)
    rows = torch.repeat_interleave(torch.arange(3), inside.indptr[1:] - inside.indptr[:-1])
    stray_rows, stray_items = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([-5, cols, cols + 63, cols + 64, 10 * cols])
    order = torch.argsort(torch.cat([rows, stray_rows]) * (20 * cols) + torch.cat([inside.indices, stray_items]))
    every_row = torch.cat([rows, stray_rows])[order]
    indptr = torch.zeros(4, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(every_row, minlength=3), 0)
    with_strays = CSR(indptr, torch.cat([inside.indices, stray_items])[order], 3, cols)
    got = ops.masked_topk(scores.to(device), users.to(device), [with_strays.to(device)], 20)
    want = ops.masked_topk(scores.to(device), users.to(device), [inside.to(device)], 20)
    assert torch.equal(got[1].cpu(), want[1].cpu()) and torch.equal(got[0].cpu(), want[0].cpu())


def test_results_do_not_depend_on_the_thread_count():
    scores = scores_with_ties(500, 700, seed=6, dtype=torch.float32)
    users = torch.arange(500) % 40
    exclude = [random_exclusions(40, 700, 0.2, seed=7)]
    results = under_thread_counts((1, 2, 4), lambda: ops.masked_topk(scores, users, exclude, 20))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("device", DEVICES)
def test_a_nan_is_an_error_unless_excluded(device):
    scores = torch.randn(3, 10, device=device)
    scores[2, 6] = math.nan
    users = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(ValueError, match="NaN at a column that is not excluded"):
        ops.masked_topk(scores, users, [], 4)
    excluded = CSR.from_pairs(torch.tensor([2]), torch.tensor([6]), 3, 10).to(device)
    values, columns = ops.masked_topk(scores, users, [excluded], 10)
    assert columns[2, -1].item() == 6 and values[2, -1].item() == -math.inf


def test_bad_input_is_a_clear_error():
    scores = torch.randn(2, 5)
    users = torch.tensor([0, 1])
    empty = CSR(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 5)
    with pytest.raises(ValueError, match=r"k must lie in \[1, I\] = \[1, 5\], got 6"):
        ops.masked_topk(scores, users, [], 6)
    with pytest.raises(ValueError, match="k must lie in"):
        ops.masked_topk(scores, users, [], 0)
    with pytest.raises(ValueError, match="at most 8 exclusion sets, got 9"):
        ops.masked_topk(scores, users, [empty] * 9, 2)
    bad = CSR(torch.tensor([0, 3, 2]), torch.tensor([1, 2]), 2, 5)
    with pytest.raises(ValueError, match=r"exclude_indptr\[0\] must rise from 0 to the length"):
        ops.masked_topk(scores, users, [bad], 2)
    with pytest.raises(RuntimeError, match=r"scores must be a floating-point \[B, I\] tensor"):
        ops.masked_topk(scores[0], users, [], 2)
    with pytest.raises(ValueError, match="users is on meta but scores is on cpu"):
        ops.masked_topk(scores, users.to("meta"), [], 2)


def opcheck_cases(device: str) -> list:
    """(op, args) for the op's schema."""
    scores = scores_with_ties(6, 40, seed=8, dtype=torch.float32).to(device)
    exclude = random_exclusions(6, 40, 0.2, seed=9).to(device)
    users = torch.tensor([5, 0, 1, 1, 3, 2], device=device)
    return [(torch.ops.pnn_fast.masked_topk.default, [scores, users, [exclude.indptr], [exclude.indices], 7])]
