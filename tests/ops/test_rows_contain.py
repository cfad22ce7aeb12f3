"""pnn_fast::rows_contain, whether each column is in its row of a CSR: against the definition
(Python sets) and the reference on random rows of every length (empty, one entry, long), columns
inside and outside the column range and repeated; the evaluator's shapes; bad input named; opcheck."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, requires_kernels, deferred_error
from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.csr import CSR

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def random_rows(num_rows: int, num_cols: int, seed: int) -> CSR:
    """Rows of lengths from 0 to num_cols (share of the columns drawn per row)."""
    g = torch.Generator().manual_seed(seed)
    share = torch.rand(num_rows, 1, generator=g) ** 2
    share[0] = 0.0  # an empty row
    share[-1] = 1.0  # a full row
    keep = torch.rand(num_rows, num_cols, generator=g) < share
    rows, cols = keep.nonzero(as_tuple=True)
    return CSR.from_pairs(rows, cols, num_rows, num_cols)


def queries(csr: CSR, batch: int, per_row: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with repeats, and columns from [-3, num_cols + 3) (some outside the range), each
    non-empty row's last member among them."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, csr.num_rows, (batch,), generator=g)
    columns = torch.randint(-3, csr.num_cols + 3, (batch, per_row), generator=g)
    columns[:, -1] = columns[:, 0]  # a column asked twice in a row
    lengths = csr.indptr[rows + 1] - csr.indptr[rows]
    last = csr.indices[(csr.indptr[rows + 1] - 1).clamp(min=0)] if csr.nnz else torch.zeros_like(rows)
    columns[:, per_row // 2] = torch.where(lengths > 0, last, columns[:, per_row // 2])  # a planted member
    return rows, columns


def by_definition(csr: CSR, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    sets = [set(csr.indices[csr.indptr[r]:csr.indptr[r + 1]].tolist()) for r in range(csr.num_rows)]
    return torch.tensor([[c in sets[int(r)] for c in row.tolist()] for r, row in zip(rows, columns)], dtype=torch.bool)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_rows,num_cols,batch,per_row", [(2, 1, 6, 3), (7, 5, 9, 4), (40, 300, 64, 20),
                                                             (300, 2000, 513, 37)])
def test_matches_the_definition_and_the_reference(device, num_rows, num_cols, batch, per_row):
    csr = random_rows(num_rows, num_cols, seed=num_cols)
    rows, columns = queries(csr, batch, per_row, seed=batch)
    got = ops.rows_contain(csr.to(device), rows.to(device), columns.to(device))
    want = by_definition(csr, rows, columns)
    assert got.dtype == torch.bool and got.shape == columns.shape
    assert torch.equal(got.cpu(), want)
    assert torch.equal(reference.rows_contain(csr, rows, columns), want)
    assert want.any() and not want.all()  # both answers are exercised


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_size", [1, 5, 300])
def test_a_list_shared_by_every_row_is_read_in_place(device, pool_size):
    """SL's pool: one list expanded to every row (stride 0), read where it lies; the same answer as
    the list copied into each row."""
    csr = random_rows(300, 2000, seed=3)
    rows, columns = queries(csr, 64, pool_size, seed=4)
    pool = columns[0].to(device)
    shared = pool.expand(rows.numel(), -1)
    assert shared.stride(0) == 0
    got = ops.rows_contain(csr.to(device), rows.to(device), shared)
    want = by_definition(csr, rows, shared.cpu().contiguous())
    assert torch.equal(got.cpu(), want)
    assert torch.equal(ops.rows_contain(csr.to(device), rows.to(device), shared.contiguous()).cpu(), want)
    if pool_size > 1:
        assert want.any() and not want.all()


@pytest.mark.parametrize("device", DEVICES)
def test_a_shared_pool_with_repeats_is_searched_from_either_side(device):
    """A pool of popular items drawn with repeats (the batch's positives beside uniform draws): rows
    with fewer known items than the pool search their items in it, the others search the pool in
    theirs (CPU); every repeat of a known item is found, as the definition says."""
    csr = random_rows(300, 2000, seed=5)
    g = torch.Generator().manual_seed(6)
    pool = torch.cat([(torch.rand(400, generator=g) ** 4 * 2000).long(), torch.randint(0, 2000, (200,), generator=g)])
    rows = torch.randint(0, csr.num_rows, (128,), generator=g)
    lengths = csr.indptr[rows + 1] - csr.indptr[rows]
    assert bool((lengths < pool.numel()).any()) and bool((lengths >= pool.numel()).any())
    shared = pool.to(device).expand(rows.numel(), -1)
    want = by_definition(csr, rows, shared.cpu().contiguous())
    assert torch.equal(ops.rows_contain(csr.to(device), rows.to(device), shared).cpu(), want)
    assert pool.unique().numel() < pool.numel() and want.any() and not want.all()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    csr = random_rows(5, 10, seed=1).to(device)
    no_columns = torch.zeros(3, 0, dtype=torch.int64, device=device)
    assert ops.rows_contain(csr, torch.tensor([0, 1, 4], device=device), no_columns).shape == (3, 0)
    no_rows = torch.zeros(0, 4, dtype=torch.int64, device=device)
    assert ops.rows_contain(csr, torch.zeros(0, dtype=torch.int64, device=device), no_rows).shape == (0, 4)
    nothing = CSR(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 5).to(device)
    columns = torch.tensor([[0, 4], [1, 2]], device=device)
    assert not ops.rows_contain(nothing, torch.tensor([0, 1], device=device), columns).any()
    assert not reference.rows_contain(nothing.to("cpu"), torch.tensor([0, 1]), columns.cpu()).any()


def test_bad_input_is_a_clear_error():
    csr = random_rows(4, 6, seed=2)
    rows = torch.tensor([0, 3])
    columns = torch.tensor([[1, 2], [3, 5]])
    with pytest.raises(RuntimeError, match=r"columns must be an int64 \[B, K\] tensor"):
        ops.rows_contain(csr, rows, columns[0])
    with pytest.raises(RuntimeError, match=r"rows must have shape \[2\]"):
        ops.rows_contain(csr, rows[:1], columns)
    # the values are deferred input errors (no read-back: SL's shared pool asks every step), and the
    # kernel stays inside its inputs meanwhile
    with deferred_error(r"^pnn_fast::rows_contain: rows has ids outside \[0, 4\)$"):
        ops.rows_contain(csr, torch.tensor([0, 4]), columns)
    # each way an indptr can fail to partition its indices: a first entry other than 0, a last
    # entry other than their length, a fall
    for indptr in ([1, 2, 2], [0, 1, 1], [0, 3, 2], [-5, 9, 2]):
        broken = CSR(torch.tensor(indptr), torch.tensor([1, 2]), 2, 6)
        with deferred_error(r"^pnn_fast::rows_contain: indptr must rise from 0 to the length of indices$"):
            found = ops.rows_contain(broken, torch.tensor([0, 1]), columns)
        assert found.shape == columns.shape
    with pytest.raises(ValueError, match="rows is on meta but columns is on cpu"):
        ops.rows_contain(csr, rows.to("meta"), columns)


def opcheck_cases(device: str) -> list:
    """(op, args) for the op's schema."""
    csr = random_rows(6, 30, seed=3).to(device)
    rows, columns = queries(csr.to("cpu"), 5, 7, seed=4)
    return [(torch.ops.pnn_fast.rows_contain.default, [csr.indptr, csr.indices, rows.to(device), columns.to(device)])]
