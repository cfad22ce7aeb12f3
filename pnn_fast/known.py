"""Each user's known positives (training interactions) as a CSR structure.

PNN never uses an item a user has interacted with as a negative or neutral
candidate, so every backend needs a fast "is item i known for user u" test.
The CSR layout (``indptr``, ``indices`` sorted within each user) supports a
binary search per query, which the C++/CUDA kernels do in place and the
reference backend does with one global ``searchsorted`` over the
``user * num_items + item`` keys (globally sorted because users are in order
and items are sorted within a user).
"""
from __future__ import annotations

import torch

from ._checks import check_ids, require_tensor


class KnownPositives:
    """Per-user sorted item lists in CSR form.

    Attributes:
        indptr:  int64 [num_users + 1]; user ``u`` owns ``indices[indptr[u]:indptr[u+1]]``.
        indices: int64 [nnz]; item ids, strictly increasing within a user.
        num_users, num_items: sizes of the id spaces (ids are ``0 <= id < size``).
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, num_users: int, num_items: int):
        require_tensor("indptr", indptr)
        require_tensor("indices", indices)
        if indptr.dim() != 1 or indptr.numel() != num_users + 1:
            raise ValueError(f"indptr must have shape [num_users + 1] = [{num_users + 1}], got {tuple(indptr.shape)}")
        if indices.dim() != 1:
            raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
        if indptr.device != indices.device:
            raise ValueError(f"indptr ({indptr.device}) and indices ({indices.device}) must be on one device")
        self.indptr = indptr.to(torch.int64).contiguous()
        self.indices = indices.to(torch.int64).contiguous()
        self.num_users = int(num_users)
        self.num_items = int(num_items)
        counts = self.indptr[1:] - self.indptr[:-1]
        self._owner = torch.repeat_interleave(torch.arange(self.num_users, device=self.indptr.device), counts)
        self._keys = self._owner * self.num_items + self.indices
        # key of the m-th known item of u: u * (I + 1) + (k_m - m), the number of unknown items
        # before it; non-decreasing, so one searchsorted maps a rank among unknown items to an item
        local = torch.arange(self.indices.numel(), device=self.indptr.device) - self.indptr[self._owner]
        self._gap_keys = self._owner * (self.num_items + 1) + (self.indices - local)
        if self.indices.numel() and bool((self.indices < 0).any() | (self.indices >= self.num_items).any()):
            raise ValueError(f"indices must lie in [0, num_items={self.num_items})")
        if bool((self._keys[1:] <= self._keys[:-1]).any()):
            raise ValueError("indices must be strictly increasing within each user (sorted, no duplicates)")

    @classmethod
    def from_pairs(cls, user_ids: torch.Tensor, item_ids: torch.Tensor, num_users: int, num_items: int) -> "KnownPositives":
        """Build from interaction pairs; duplicates are dropped.

        Args:
            user_ids, item_ids: integer tensors of the same shape [n].
            num_users, num_items: id-space sizes; every id must lie in ``[0, size)``.
        """
        if not isinstance(num_users, int) or num_users <= 0:
            raise ValueError(f"num_users must be a positive int, got {num_users!r}")
        if not isinstance(num_items, int) or num_items <= 0:
            raise ValueError(f"num_items must be a positive int, got {num_items!r}")
        check_ids("user_ids", user_ids, num_users, shape=None)
        check_ids("item_ids", item_ids, num_items, shape=tuple(user_ids.shape))
        keys = torch.unique(user_ids.reshape(-1).long() * num_items + item_ids.reshape(-1).long())  # sorted
        users = keys // num_items
        indptr = torch.zeros(num_users + 1, dtype=torch.int64, device=keys.device)
        indptr[1:] = torch.cumsum(torch.bincount(users, minlength=num_users), 0)
        return cls(indptr, keys % num_items, num_users, num_items)

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    def to(self, device) -> "KnownPositives":
        """A copy on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return KnownPositives(self.indptr.to(device), self.indices.to(device), self.num_users, self.num_items)

    def count(self, users: torch.Tensor) -> torch.Tensor:
        """N_u for each user: int64 tensor shaped like ``users``."""
        users = users.long()
        return self.indptr[users + 1] - self.indptr[users]

    def contains(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Whether ``items`` is a known positive of ``users`` (broadcast shapes); bool tensor."""
        users, items = torch.broadcast_tensors(users.long(), items.long())
        query = (users * self.num_items + items).reshape(-1)
        if self._keys.numel() == 0:
            return torch.zeros(users.shape, dtype=torch.bool, device=users.device)
        pos = torch.searchsorted(self._keys, query).clamp_max(self._keys.numel() - 1)
        return (self._keys[pos] == query).reshape(users.shape)

    def sample_unknown(self, users: torch.Tensor, num: int, generator: torch.Generator | None = None,
                       backend: str = "auto") -> torch.Tensor:
        """Items drawn uniformly (with replacement) from each user's unknown items.

        Exact and loop-free: one uniform draw per entry, mapped to an unknown item by
        :meth:`unknown_from_uniform`; no rejection rounds, no host sync.

        Args:
            users: int [B]; every user must have at least one unknown item.
            num: candidates per row.
            backend: as :meth:`unknown_from_uniform`.
        Returns:
            int64 [B, num].
        """
        uniform = torch.rand(users.numel(), num, generator=generator, device=users.device, dtype=torch.float32)
        return self.unknown_from_uniform(users, uniform, backend)

    def unknown_from_uniform(self, users: torch.Tensor, uniform: torch.Tensor, backend: str = "auto") -> torch.Tensor:
        """The ``r``-th (0-based) unknown item of ``users[b]``, ``r = floor(u * (I - N_u))`` for each
        ``u = uniform[b, k]`` (float32 arithmetic); the r-th unknown item is ``r + #{m : k_m - m <= r}``
        for the user's sorted items ``k_m``.

        Args:
            users: int [B]; uniform: float32 [B, K] in ``[0, 1)``.
            backend: "reference" (one global searchsorted over all users' keys), "auto" (the
                compiled kernel where built: one binary search within the user's own row, which
                stays in cache) or "cpu"/"cuda" (the kernel, required).
        Returns:
            int64 [B, K].
        """
        from . import reference
        from .losses import _check_backend, resolve_backend

        if resolve_backend(_check_backend(backend), users.device) is not reference:
            from . import ops

            return ops.unknown_items(self, users, uniform)
        users = users.long()
        free = (self.num_items - self.count(users))[:, None]
        rank = torch.minimum((uniform * free).long(), free - 1)  # the clamp guards float rounding up to free
        if self._gap_keys.numel() == 0:
            return rank
        query = users[:, None] * (self.num_items + 1) + rank
        return rank + torch.searchsorted(self._gap_keys, query, right=True) - self.indptr[users][:, None]

    def __repr__(self) -> str:
        return f"KnownPositives(num_users={self.num_users}, num_items={self.num_items}, nnz={self.nnz}, device={self.device})"
