"""Full-ranking top-K evaluation with RecBole v1.1.1's metric definitions.

For every user ``u`` with at least one ground-truth item, all items are scored
(``user_table[u] @ item_table.T``), the items in any ``exclude`` set (training
items; training and validation items for the test) are set to ``-inf`` and the
``K = max(ks)`` best remain as the ranked list ``L_u`` (positions 1..K).  With
``R_u`` the user's ground-truth items, ``rel_u(j) = 1`` when the item at
position ``j`` is in ``R_u`` (and not excluded), and ``hits_u(k)`` the number
of relevant items among the first ``k``:

* ``recall@k``    = hits_u(k) / |R_u|  -- over *all* of the user's ground-truth items,
  so it stays below 1 when |R_u| > k.
* ``precision@k`` = hits_u(k) / k  -- always divided by k, even if fewer items could be ranked.
* ``hit@k``       = 1 if hits_u(k) > 0 else 0.
* ``ndcg@k``      = DCG / IDCG with DCG = sum_{j<=k} rel_u(j) / log2(j + 1) and the ideal
  IDCG = sum_{j <= min(|R_u|, k)} 1 / log2(j + 1): a user with fewer than k test items can
  still reach 1.
* ``mrr@k``       = 1 / (position of the first relevant item) if it is within k, else 0.

Each metric is the plain mean over users with ``|R_u| >= 1``; users without
ground truth are skipped (not counted as zeros).  These are the formulas of
``recbole/evaluator/metrics.py`` (Recall, Precision, Hit, NDCG, MRR); RecBole
also counts ground-truth items that happen to be excluded in ``|R_u|``, and so
does this module.

Ties: RecBole takes ``torch.topk`` of the masked scores, whose order among
equal scores is unspecified (it may differ between devices and batch shapes).
Here equal scores are ordered by ascending item id, which is one of the orders
``torch.topk`` may return, made deterministic, so results do not depend on
``batch_size`` or device.  Excluded items never count as hits, even when a user
has fewer than K candidate items and ``-inf`` entries fill the list.

A NaN score at an item that is not excluded is an error (ValueError), not a silent rank.

Cost: users are processed ``batch_size`` at a time.  With the compiled CPU kernels a batch is
ranked in one pass of :func:`pnn_fast.ops.dot_topk`: products ``[batch, d] x [d, block]`` over
blocks of items sized to stay in cache, each user's K best kept from block to block in a small
buffer (a threshold sampled from the first block, raised by a quickselect), excluded items looked
up only for the few scores that could enter.  Elsewhere (a GPU, or the reference) the products
``[tile, d] x [d, chunk]`` (the whole batch on a GPU, :data:`CPU_SCORE_TILE` users on the CPU;
items :data:`ITEM_CHUNK` at a time) go through the backend's ``masked_topk`` and the chunks'
lists are merged into a running top K.  Then :func:`pnn_fast.ops.rows_contain` gives the ranked
items' relevance.  Without the kernels, the reference (a masked copy and ``torch.topk``; a
searchsorted).  Memory is bounded by the batch (or tile) times the block (or chunk) whatever the
catalog: nothing of size users x items is ever allocated.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
import torch

from . import backends
from ._checks import check_cutoffs, check_id_tensor, require_tensor
from .backends.rows import TopK
from .csr import CSR

METRICS = ("recall", "ndcg", "hit", "precision", "mrr")

# Users scored and ranked at a time on the CPU without the compiled kernels (the reference's
# masked_topk; the kernels rank the whole batch with dot_topk): a tile's [128, I] scores are still in
# cache when masked_topk reads them, where a 1,024-user batch's went out to memory and back.  At 1
# thread (bench/bench_eval.py) the products alone took 1.9 s a Gowalla pass in tiles of 128 against
# 4.2 s in batches of 1,024; on ML-1M, whose batch output is smaller, 26 ms against 25-30 ms.
CPU_SCORE_TILE = 128

# Items scored at a time by masked_topk (a GPU, or the reference): a catalog larger than this is
# ranked chunk by chunk, each chunk's top K merged into a running one, so that a CPU tile's scores
# ([128, 16,384] float32, 8 MB) stay in cache for masked_topk, and a GPU batch's ([1,024, 16,384],
# 64 MB) stay bounded at any catalog size.  A smaller catalog is ranked in one pass.
ITEM_CHUNK = 16384


def _is_pair(obj) -> bool:
    """Whether ``obj`` is a (users, items) pair of tensors (a CSR is checked before)."""
    return isinstance(obj, (tuple, list)) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj)


def _as_csr(name: str, obj, num_users: int, num_items: int, device: torch.device) -> CSR:
    """Validate a CSR-like object or a (users, items) pair and move it to ``device``."""
    if not hasattr(obj, "indptr") and _is_pair(obj):
        users, items = obj
        check_id_tensor(f"{name}[0] (users)", users, None)
        check_id_tensor(f"{name}[1] (items)", items, tuple(users.shape))
        if users.numel() and (int(users.min()) < 0 or int(users.max()) >= num_users):
            raise ValueError(f"{name}[0] (users) has ids outside [0, {num_users})")
        if items.numel() and int(items.min()) < 0:
            raise ValueError(f"{name}[1] (items) has negative ids")
        span = int(items.max()) + 1 if items.numel() else 1  # items beyond the table fail the check below
        obj = CSR.from_checked_pairs(users, items, num_users, span)
    if not (hasattr(obj, "indptr") and hasattr(obj, "indices")):
        raise TypeError(f"{name} must have .indptr and .indices (CSR) or be a (users, items) pair of tensors, "
                        f"got {type(obj).__name__}")
    require_tensor(f"{name}.indptr", obj.indptr)
    require_tensor(f"{name}.indices", obj.indices)
    if obj.indptr.dim() != 1 or obj.indptr.numel() != num_users + 1:
        raise ValueError(f"{name}.indptr must have shape [num_users + 1] = [{num_users + 1}], got {list(obj.indptr.shape)}")
    indices = obj.indices.to(device=device, dtype=torch.int64)
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_items):
        raise ValueError(f"{name}.indices must lie in [0, {num_items})")
    indptr = obj.indptr.to(device=device, dtype=torch.int64)
    if indptr[0] != 0 or bool((indptr[1:] < indptr[:-1]).any()) or int(indptr[-1]) != indices.numel():
        raise ValueError(f"{name}.indptr must rise from 0 to the number of indices ({indices.numel()})")
    # The kernels walk each row in ascending order: rows given unsorted (or with repeats) are sorted
    # (and deduplicated) here.
    ascending = indices[1:] > indices[:-1]
    row_starts = indptr[1:-1][indptr[1:-1] < indices.numel()]
    ascending[row_starts[row_starts > 0] - 1] = True
    if not bool(ascending.all()):
        rows = torch.repeat_interleave(torch.arange(num_users, device=device), indptr[1:] - indptr[:-1])
        return CSR.from_checked_pairs(rows, indices, num_users, num_items)
    return CSR(indptr, indices, num_users, num_items)


def ranked_items(ranking, user_rows: torch.Tensor, users: torch.Tensor, item_table: torch.Tensor,
                 exclude: Sequence[CSR], k: int) -> TopK:
    """Each user's k best items by dot product, an item in any ``exclude`` row of its user scoring -inf.

    The compiled CPU kernels rank in one pass (:func:`pnn_fast.ops.dot_topk`); otherwise the
    products are ranked by the backend's ``masked_topk`` in chunks (:func:`ranked_in_chunks`), on
    the CPU :data:`CPU_SCORE_TILE` users at a time (:func:`ranked_in_tiles`).

    Args:
        ranking: a backend module; user_rows: float [T, d]; users: int [T], their rows in
        ``exclude``; item_table: float [I, d]; exclude: CSRs over users; 1 <= k <= I.
    Returns:
        :class:`~pnn_fast.backends.rows.TopK` (values [T, k], indices int64 [T, k], the items): best
        first, equal scores by ascending item id (as one ``masked_topk`` over all I columns gives),
        ``-inf`` for excluded items.
    """
    if item_table.device.type != "cpu":
        return ranked_in_chunks(ranking, user_rows, users, item_table, exclude, k)
    if ranking is backends.fused:
        return ranking.dot_topk(user_rows, item_table, users, exclude, k)
    return ranked_in_tiles(ranking, user_rows, users, item_table, exclude, k)


def ranked_in_tiles(ranking, user_rows: torch.Tensor, users: torch.Tensor, item_table: torch.Tensor,
                    exclude: Sequence[CSR], k: int) -> TopK:
    """:func:`ranked_in_chunks` :data:`CPU_SCORE_TILE` users at a time, the lists concatenated."""
    tiles = [ranked_in_chunks(ranking, user_rows[at:at + CPU_SCORE_TILE], users[at:at + CPU_SCORE_TILE], item_table,
                              exclude, k) for at in range(0, users.numel(), CPU_SCORE_TILE)]
    if len(tiles) == 1:
        return tiles[0]
    return TopK(torch.cat([tile.values for tile in tiles]), torch.cat([tile.indices for tile in tiles]))


def ranked_in_chunks(ranking, user_rows: torch.Tensor, users: torch.Tensor, item_table: torch.Tensor,
                     exclude: Sequence[CSR], k: int) -> TopK:
    """:func:`ranked_items` by the backend's ``masked_topk`` over the products with
    :data:`ITEM_CHUNK` items at a time, each chunk's list merged into a running top k."""
    num_items = item_table.shape[0]
    if num_items <= ITEM_CHUNK:
        return ranking.masked_topk(user_rows @ item_table.T, users, exclude, k)
    # the tile's own exclusions, rows 0..T-1: shifted to a chunk's columns per chunk at little cost
    local = [mask.select_rows(users) for mask in exclude]
    rows = torch.arange(users.numel(), device=users.device)
    best_values = best_items = None
    for offset in range(0, num_items, ITEM_CHUNK):
        chunk = item_table[offset:offset + ITEM_CHUNK]
        # ids outside the chunk, negative or beyond it, match no column
        shifted = [CSR(mask.indptr, mask.indices - offset, mask.num_rows, chunk.shape[0]) for mask in local]
        top = ranking.masked_topk(user_rows @ chunk.T, rows, shifted, min(k, chunk.shape[0]))
        values, items = top.values, top.indices + offset
        if best_values is not None:
            # the earlier chunks' items first: a stable sort then orders equal scores by ascending id
            values, items = torch.cat([best_values, values], 1), torch.cat([best_items, items], 1)
            order = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
            values, items = values.gather(1, order), items.gather(1, order)
        best_values, best_items = values, items
    return TopK(best_values, best_items)


@torch.no_grad()
def evaluate(user_table: torch.Tensor, item_table: torch.Tensor, ground_truth, exclude=(), *,
             ks: Sequence[int] = (10, 20), metrics: Sequence[str] = METRICS, batch_size: int = 1024,
             backend: str = "auto") -> dict[str, float]:
    """Full-ranking top-K metrics of dot-product scores (definitions in the module docstring).

    Args:
        user_table: float [U, d]; item_table: float [I, d] on the same device (scores are computed there).
        ground_truth: held-out items per user, CSR-like (``.indptr`` int [U+1], ``.indices`` int, e.g.
            :class:`pnn_fast.KnownPositives`) or a ``(users, items)`` pair of id tensors.
        exclude: sets of items never ranked for their user (same forms as ``ground_truth``): an iterable
            of them, or a single one.
        ks: cut-offs, positive ints.
        metrics: names from ``("recall", "ndcg", "hit", "precision", "mrr")``.
        batch_size: users scored at a time; peak memory is a few ``batch_size x I`` tensors.
        backend: who ranks (as PNNLoss's ``backend``): "auto" (the compiled kernel where it was built
            for the device, else the reference), "reference", "cpu" or "cuda".
    Returns:
        ``{"recall@10": ..., "ndcg@20": ..., ...}`` (metric-major, then ks in the given order):
        means over users with >= 1 ground-truth item; NaN when there is no such user.
    """
    require_tensor("user_table", user_table)
    require_tensor("item_table", item_table)
    if user_table.dim() != 2 or item_table.dim() != 2 or user_table.shape[1] != item_table.shape[1]:
        raise ValueError(f"user_table [U, d] and item_table [I, d] must share d, got {list(user_table.shape)} "
                         f"and {list(item_table.shape)}")
    if user_table.device != item_table.device:
        raise ValueError(f"user_table is on {user_table.device} but item_table on {item_table.device}")
    ks = check_cutoffs("ks", ks)
    metrics = list(metrics)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {list(METRICS)}")
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    ranking = backends.select(backend, user_table.device)

    num_users, num_items = user_table.shape[0], item_table.shape[0]
    device = user_table.device
    truth = _as_csr("ground_truth", ground_truth, num_users, num_items, device)
    if hasattr(exclude, "indptr") or _is_pair(exclude):
        exclude = (exclude,)
    exclude = list(exclude)
    if len(exclude) > 8:
        raise ValueError(f"exclude: at most 8 sets, got {len(exclude)}")
    masks = [_as_csr(f"exclude[{n}]", e, num_users, num_items, device) for n, e in enumerate(exclude)]

    max_k = max(ks)
    ranked = min(max_k, num_items)  # a cut-off past the catalog ranks every item, and no more
    positions = torch.arange(1, ranked + 1, device=device, dtype=torch.float64)
    discount = 1.0 / torch.log2(positions + 1)
    ideal = torch.cumsum(discount, 0)  # ideal[j-1]: IDCG with j relevant items
    k_index = torch.tensor(ks, device=device) - 1
    at = k_index.clamp(max=ranked - 1)  # the last ranked position within each cut-off
    k_float = torch.tensor(ks, device=device, dtype=torch.float64)
    sums = {name: torch.zeros(len(ks), dtype=torch.float64, device=device) for name in metrics}

    counts_all = truth.indptr[1:] - truth.indptr[:-1]
    evaluated = (counts_all > 0).nonzero().squeeze(1)
    for begin in range(0, evaluated.numel(), batch_size):
        users = evaluated[begin:begin + batch_size]
        user_rows = user_table[users]  # [B, d]
        top = ranked_items(ranking, user_rows, users, item_table, masks, ranked)  # [B, K] each
        found = ranking.rows_contain(truth, users, top.indices)  # relevance of the ranked items
        hits = (found & (top.values > -math.inf)).double()  # [B, ranked]

        n_truth = counts_all[users].double()[:, None]  # [B, 1]
        found = torch.cumsum(hits, dim=1)[:, at]  # [B, len(ks)]: hits within each k
        if "recall" in sums:
            sums["recall"] += (found / n_truth).sum(0)
        if "precision" in sums:
            sums["precision"] += (found / k_float).sum(0)
        if "hit" in sums:
            sums["hit"] += (found > 0).double().sum(0)
        if "ndcg" in sums:
            dcg = torch.cumsum(hits * discount, dim=1)[:, at]
            best = torch.minimum(n_truth.long(), k_index[None, :] + 1)  # min(|R_u|, k)
            sums["ndcg"] += (dcg / ideal[best - 1]).sum(0)
        if "mrr" in sums:
            first = hits.argmax(dim=1, keepdim=True)  # first relevant position (0 when none)
            reciprocal = hits.gather(1, first) / (first + 1).double()  # 0 when no hit at all
            sums["mrr"] += (reciprocal * (first <= k_index[None, :])).sum(0)

    n_users = evaluated.numel()
    result = {}
    for name in metrics:
        means = (sums[name] / n_users).tolist() if n_users else [math.nan] * len(ks)
        for k, value in zip(ks, means):
            result[f"{name}@{k}"] = float(value)
    return result
