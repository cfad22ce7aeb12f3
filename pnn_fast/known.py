"""Each user's known positives (training interactions): a :class:`~pnn_fast.csr.CSR` of users × items.

PNN never uses an item a user has interacted with as a negative or neutral candidate, so every
backend needs a fast "is item i known for user u" test. The kernels binary-search the user's own
row; the reference backend does one global ``searchsorted`` over the ``user * num_items + item``
keys (globally sorted because users are in order and items are sorted within a user), and
samples unknown items with a second sorted key array, :attr:`KnownPositives.gap_keys`.
Sampling itself lives in :mod:`pnn_fast.sampling`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .csr import CSR, check_pair_ids


class KnownPositives(CSR):
    """Per-user sorted item lists in CSR form (rows are users, columns items).

    Attributes (besides :class:`CSR`'s):
        num_users, num_items: the id-space sizes (``num_rows``, ``num_cols``).
        keys: int64 [nnz], ``user * num_items + item`` of every entry, strictly increasing.
        gap_keys: int64 [nnz], ``user * (num_items + 1) + (k_m - m)`` for the m-th known item
            ``k_m`` of a user: how many unknown items precede it, offset per user; non-decreasing,
            so one searchsorted maps a rank among a user's unknown items to the item.
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, num_users: int, num_items: int, *,
                 check: bool = True):
        super().__init__(indptr, indices, num_users, num_items)
        counts = self.indptr[1:] - self.indptr[:-1]
        # a checked CSR may be malformed, so only a trusted one gives the size (which saves a host read)
        owner = torch.repeat_interleave(torch.arange(self.num_users, device=self.indptr.device), counts,
                                        output_size=None if check else self.indices.numel())
        self.keys = owner * self.num_items + self.indices
        local = torch.arange(self.indices.numel(), device=self.indptr.device) - self.indptr[owner]
        self.gap_keys = owner * (self.num_items + 1) + (self.indices - local)
        if check:
            self._check_values()

    @classmethod
    def from_sorted_rows(cls, indptr: torch.Tensor, indices: torch.Tensor, num_users: int,
                         num_items: int) -> "KnownPositives":
        """Build from a CSR whose rows the caller guarantees to be sorted and in range: no check
        reads the values back to the host. A row may repeat its last id
        (:func:`pnn_fast.compact.compact_lookup` pads with one): the membership searches find an
        id all the same."""
        return cls(indptr, indices, num_users, num_items, check=False)

    def _check_values(self) -> None:
        """Ids in range and strictly increasing within each user (two reads on the host)."""
        if self.indices.numel() and bool((self.indices < 0).any() | (self.indices >= self.num_items).any()):
            raise ValueError(f"indices must lie in [0, num_items={self.num_items})")
        if bool((self.keys[1:] <= self.keys[:-1]).any()):
            raise ValueError("indices must be strictly increasing within each user (sorted, no duplicates)")

    @classmethod
    def from_pairs(cls, user_ids: torch.Tensor, item_ids: torch.Tensor, num_users: int,
                   num_items: int) -> "KnownPositives":
        """Build from interaction pairs (int tensors of one shape [n]); duplicates are dropped.

        ``num_users``, ``num_items``: id-space sizes; every id must lie in ``[0, size)``.
        """
        check_pair_ids(("user_ids", user_ids, "num_users", num_users), ("item_ids", item_ids, "num_items", num_items))
        csr = CSR.from_checked_pairs(user_ids, item_ids, num_users, num_items)
        return cls(csr.indptr, csr.indices, num_users, num_items)

    @property
    def num_users(self) -> int:
        return self.num_rows

    @property
    def num_items(self) -> int:
        return self.num_cols

    def to(self, device) -> "KnownPositives":
        """A copy on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return KnownPositives(self.indptr.to(device), self.indices.to(device), self.num_users, self.num_items)

    @property
    def without_items(self) -> "KnownPositives":
        """The same users and items with nothing known: for candidates already drawn from each user's
        unknown items (:func:`pnn_fast.sampling.sample_unknown`), whose known-item lookups would all
        come back negative, so an op given this instead skips them. Built once per object (cached by
        hand: functools.cached_property takes a lock, which torch.compile cannot trace)."""
        cached = self.__dict__.get("_without_items")
        if cached is None:
            cached = KnownPositives.from_sorted_rows(torch.zeros_like(self.indptr), self.indices[:0], self.num_users,
                                                     self.num_items)
            self.__dict__["_without_items"] = cached
        return cached

    def count(self, users: torch.Tensor) -> torch.Tensor:
        """N_u for each user: int64 tensor shaped like ``users``."""
        return self.row_lengths(users)

    def contains(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Whether ``items`` is a known positive of ``users`` (broadcast shapes); bool tensor."""
        users, items = torch.broadcast_tensors(users.long(), items.long())
        query = (users * self.num_items + items).reshape(-1)
        if self.keys.numel() == 0:
            return torch.zeros(users.shape, dtype=torch.bool, device=users.device)
        pos = torch.searchsorted(self.keys, query).clamp_max(self.keys.numel() - 1)
        return (self.keys[pos] == query).reshape(users.shape)

    def __repr__(self) -> str:
        return (f"KnownPositives(num_users={self.num_users}, num_items={self.num_items}, nnz={self.nnz}, "
                f"device={self.device})")


class RowLookup(NamedTuple):
    """Known-item membership for a batch, in whatever ids its candidates are written in.

    Row ``rows[b]`` of ``known`` holds batch row b's known items; a backend asks it in place of
    the user's own row of the :class:`KnownPositives` it still uses for the class sizes
    (:func:`pnn_fast.compact.compact_lookup` builds one in a compact table's ids).
    """
    known: KnownPositives
    rows: torch.Tensor
