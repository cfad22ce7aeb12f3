"""A step's item rows, gathered once: what lets a loss cost the batch, not the catalog.

A loss over a catalog of I items reads only the rows its batch names: the positives, the
candidates, the hard candidates, the attention's history. With ``sparse=True`` each loss gathers
those rows into a compact table ``[n, d]`` (n distinct items) with ``F.embedding(sparse=True)``,
renames every id to its row of that table, and runs its usual backend on the compact table. The
item table's gradient is then a sparse COO tensor of n rows, as ``nn.Embedding(sparse=True)``
gives, and no tensor of the step has a dimension of size I.

The kernels also ask "is candidate j a known item of row b's user?". In compact ids that
question needs the user's known items in compact ids too: :func:`compact_lookup` builds them,
one row per batch row. A known item that the compact table does not hold is never a candidate;
it becomes row n, one extra row of the table that no id names (the kernels index per-item
scratch by known ids, so every known id must be a row of the table).

Cost: one sort of the step's ids and one read of two counts on the host (the number of distinct
items and of the batch's known items), which size the compact tensors. A caller that needs no
lookup and takes a dense gradient may size the table by the number of ids instead, with no read
(``size``): the rows past the distinct items then repeat item 0's, and no id names them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F

from .known import KnownPositives, RowLookup


class SortedRuns(NamedTuple):
    """Ids flattened and sorted, each run of equal ids marked at its first entry, in fixed shapes
    (``torch.unique`` would read its size on the host): ``values[first]`` is ``torch.unique(ids)``.

    Attributes: values, order: [n] (the ids ascending, and their positions in ``ids.reshape(-1)``);
    first: bool [n], whether values[i] starts its run.
    """
    values: torch.Tensor
    order: torch.Tensor
    first: torch.Tensor


def sorted_runs(ids: torch.Tensor, stable: bool = True) -> SortedRuns:
    """:class:`SortedRuns` of ``ids`` (any shape); ``stable`` keeps equal ids in position order, so that
    ``order[first]`` is each id's first position."""
    values, order = ids.reshape(-1).sort(stable=stable)
    first = torch.ones_like(values, dtype=torch.bool)
    first[1:] = values[1:] != values[:-1]
    return SortedRuns(values, order, first)


class CompactItems(NamedTuple):
    """The rows a step reads, and its ids renamed to them.

    Attributes:
        table: float [n, d], ``item_table[items]``; its gradient reaches ``item_table`` as a
            sparse COO tensor of n rows (when built with ``sparse=True``). With a lookup, one
            more row, n, that no renamed id names (a copy of ``items[0]``'s, which it gets no
            gradient from): the stand-in for the known items the table does not hold.
        items: int64 [n], the distinct item ids, ascending (with ``size``, zeros after them).
        ids: the input id tensors, each of its own shape, as int64 rows of ``table``.
        lookup: the batch's known items in rows of ``table`` (:func:`compact_lookup`), or None
            when no ``known`` was given.
    """
    table: torch.Tensor
    items: torch.Tensor
    ids: tuple
    lookup: Optional["RowLookup"]


def compact_items(item_table: torch.Tensor, ids: Sequence[torch.Tensor], *, sparse: bool,
                  known: Optional[KnownPositives] = None, users: Optional[torch.Tensor] = None,
                  size: Optional[int] = None) -> CompactItems:
    """Gather the distinct items of ``ids`` from ``item_table`` and rename ``ids`` to their rows.

    Args:
        item_table: float [I, d].
        ids: int tensors of any shapes, every entry in [0, I).
        sparse: gather with ``F.embedding(sparse=True)``, so that ``item_table``'s gradient is a
            sparse COO tensor; False, or a table that is not a leaf of the graph, gathers with
            ``index_select`` (a dense gradient).
        known, users: when given (``users`` int [B]), also build the lookup of batch row b's
            known items (of user ``users[b]``) in rows of the compact table.
        size: the compact table's rows, known in advance (at least the distinct items; the number
            of ids always is): no host read. Not with ``known`` or ``sparse`` (a sparse gradient
            must name each row once, and the padding rows would be rows of it).
    Returns:
        :class:`CompactItems`.
    """
    flat = torch.cat([t.reshape(-1) for t in ids]).long()
    # int32 keys sort in about 60% of the time of int64 ones (6.5M ids: 256 against 433 ms, 1 thread)
    keys = flat.int() if item_table.shape[0] < 2**31 else flat
    sorted_keys, order, first = sorted_runs(keys, stable=False)
    slot = torch.cumsum(first, 0) - 1  # each sorted id's row of the compact table
    if size is not None:
        if known is not None or sparse:
            raise ValueError("compact_items: a size given in advance is for a dense gradient without a lookup")
        sizes = [size]
    else:
        sizes = [slot[-1] + 1] + ([] if known is None else [known.row_lengths(users).sum()])
        # the one host read: the size of the compact table (and the number of the batch's known items)
        sizes = torch.stack(sizes).tolist()
    items = torch.zeros(sizes[0], dtype=torch.int64, device=flat.device).scatter_(0, slot, sorted_keys.long())
    renamed = torch.empty_like(slot).scatter_(0, order, slot)
    out, offset = [], 0
    for t in ids:
        out.append(renamed[offset:offset + t.numel()].reshape(t.shape))
        offset += t.numel()
    # a sparse gradient is for a leaf table's optimiser: one the model computes (LightGCN's
    # propagation) passes its gradient on to ops that take dense ones
    rows = items if known is None else torch.cat([items, items[:1]])
    if sparse and item_table.is_leaf:
        table = F.embedding(rows, item_table, sparse=True)
    else:
        table = item_table.index_select(0, rows)
    lookup = None if known is None else compact_lookup(known, users, items, sizes[1])
    return CompactItems(table, items, tuple(out), lookup)


def compact_lookup(known: KnownPositives, users: torch.Tensor, items: torch.Tensor, total: int) -> RowLookup:
    """Batch row b's known items, as rows of the compact table of ``items``.

    Args:
        known: every user's known items; users: int [B]; items: int64 [n], ascending, distinct;
        total: the sum of the users' known-item counts (read on the host by the caller).
    Returns:
        :class:`RowLookup` over B rows (``rows = arange(B)``): row b lists, ascending, the
        positions in ``items`` of ``users[b]``'s known items that ``items`` holds. The slots
        left over by the items it does not hold sit at the end of the last row and hold n, which
        no compact id is; its ``num_items`` is n + 1.
    """
    users = users.long()
    batch, n = users.numel(), items.numel()
    device = users.device
    row, item = known.entries_of(users, total)
    where = torch.searchsorted(items, item).clamp_max(max(n - 1, 0))
    hit = items[where] == item
    # the hits, kept in row order: a hit's place is the number of hits up to it
    place = torch.cumsum(hit, 0) - 1
    indices = torch.full((total + 1,), n, dtype=torch.int64, device=device)  # last slot: the misses' bin
    indices.scatter_(0, torch.where(hit, place, total), torch.where(hit, where, n))
    hits_per_row = torch.zeros(batch, dtype=torch.int64, device=device).scatter_add_(0, row, hit.long())
    indptr = torch.empty(batch + 1, dtype=torch.int64, device=device)
    indptr[0] = 0
    indptr[1:] = torch.cumsum(hits_per_row, 0)
    indptr[-1] = total  # the unused slots join the last row, past its hits
    lookup = KnownPositives.from_sorted_rows(indptr, indices[:total], batch, n + 1)
    return RowLookup(lookup, torch.arange(batch, device=device))
