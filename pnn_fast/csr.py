"""CSR: the one compressed-sparse-row type of the package.

Each user's training items (:class:`~pnn_fast.known.KnownPositives`), the held-out items the
evaluator ranks against, and the graph models' normalised adjacency are all rows of sorted,
distinct column ids; building them in one place keeps their invariants (sorted within a row,
no duplicates, ids in range) checked once.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._checks import check_ids, require_tensor


def check_pair_ids(rows: tuple, cols: tuple) -> None:
    """Check ``(name, ids, size_name, size)`` of the row and column ids of entries: positive int
    sizes, int ids of one shape, each in ``[0, size)``; errors name the caller's arguments."""
    for _, _, size_name, size in (rows, cols):
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"{size_name} must be a positive int, got {size!r}")
        # ids index int32 positions in the kernels, and below 2^31 x 2^31 the int64 keys
        # row x num_cols + col cannot overflow (2^40 x 2^40 tried to allocate 8.8 TB)
        if size >= 2**31:
            raise ValueError(f"{size_name} must be below 2^31, got {size:,}")
    check_ids(rows[0], rows[1], rows[3], shape=None)
    check_ids(cols[0], cols[1], cols[3], shape=tuple(rows[1].shape))


class CSR:
    """Sorted, distinct column ids per row, with an optional value per entry.

    Attributes:
        indptr: int64 [num_rows + 1]; row ``r`` owns entries ``indptr[r]:indptr[r + 1]``.
        indices: int64 [nnz]; column ids, strictly increasing within a row, in ``[0, num_cols)``.
        values: float [nnz] or None.
        num_rows, num_cols: sizes of the two id spaces.
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, num_rows: int, num_cols: int,
                 values: Optional[torch.Tensor] = None):
        require_tensor("indptr", indptr)
        require_tensor("indices", indices)
        if indptr.dim() != 1 or indptr.numel() != num_rows + 1:
            raise ValueError(f"indptr must have shape [num_rows + 1] = [{num_rows + 1}], got {list(indptr.shape)}")
        if indices.dim() != 1:
            raise ValueError(f"indices must be 1-D, got shape {list(indices.shape)}")
        if indptr.device != indices.device:
            raise ValueError(f"indptr ({indptr.device}) and indices ({indices.device}) must be on one device")
        if values is not None and (values.shape != indices.shape or values.device != indices.device):
            raise ValueError(f"values must have the shape and device of indices, got {list(values.shape)} on "
                             f"{values.device}")
        self.indptr = indptr.to(torch.int64).contiguous()
        self.indices = indices.to(torch.int64).contiguous()
        self.values = values
        self.num_rows = int(num_rows)
        self.num_cols = int(num_cols)

    @staticmethod
    def from_pairs(rows: torch.Tensor, cols: torch.Tensor, num_rows: int, num_cols: int,
                   values: Optional[torch.Tensor] = None) -> "CSR":
        """Build from (row, column) entries in any order.

        Args:
            rows, cols: int tensors of one shape [n], ids in ``[0, num_rows)`` and ``[0, num_cols)``.
            values: float [n] or None. Without values, repeated entries are kept once; with values,
                the entries must be distinct (their values are permuted into row order).
        """
        check_pair_ids(("rows", rows, "num_rows", num_rows), ("cols", cols, "num_cols", num_cols))
        return CSR.from_checked_pairs(rows, cols, num_rows, num_cols, values)

    @staticmethod
    def from_checked_pairs(rows: torch.Tensor, cols: torch.Tensor, num_rows: int, num_cols: int,
                           values: Optional[torch.Tensor] = None) -> "CSR":
        """:meth:`from_pairs` for ids already checked by the caller (under its own argument names)."""
        keys = rows.reshape(-1).long() * num_cols + cols.reshape(-1).long()
        if values is None:
            keys = torch.unique(keys)  # sorted by row, then column
        else:
            order = torch.argsort(keys)
            keys, values = keys[order], values.reshape(-1)[order]
        indptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=keys.device)
        indptr[1:] = torch.cumsum(torch.bincount(keys // num_cols, minlength=num_rows), 0)
        return CSR(indptr, keys % num_cols, num_rows, num_cols, values)

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    def row_lengths(self, rows: torch.Tensor) -> torch.Tensor:
        """Entries in each of ``rows``: int64 tensor shaped like ``rows``."""
        rows = rows.long()
        return self.indptr[rows + 1] - self.indptr[rows]

    def entries_of(self, rows: torch.Tensor, total: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The entries of ``rows`` (int [n]), in order: (position of the row in ``rows``, column id),
        both int64 [entries]; row-major, so ascending columns within a row. ``total``: the number
        of entries, when the caller knows it (else it is read back from the device)."""
        rows = rows.long()
        start = self.indptr[rows]
        counts = self.indptr[rows + 1] - start
        total = int(counts.sum()) if total is None else total
        local = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), counts, output_size=total)
        # Entry t of the result is entry (t - first entry of its row) of that row in the CSR.
        row_first = torch.cumsum(counts, 0) - counts
        position = start[local] + torch.arange(total, device=rows.device) - row_first[local]
        return local, self.indices[position]

    def select_rows(self, rows: torch.Tensor) -> "CSR":
        """The CSR of ``rows`` (int [n]) alone: row r of the result is row ``rows[r]`` of this one."""
        counts = self.row_lengths(rows)
        indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=self.indptr.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        _, indices = self.entries_of(rows)
        return CSR(indptr, indices, rows.numel(), self.num_cols)

    def to(self, device):
        """A copy on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        values = None if self.values is None else self.values.to(device)
        return CSR(self.indptr.to(device), self.indices.to(device), self.num_rows, self.num_cols, values)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_rows={self.num_rows}, num_cols={self.num_cols}, nnz={self.nnz}, "
                f"device={self.device})")
