"""Pure-PyTorch reference backend: the semantics every fused kernel must match.

Written for clarity, not speed: it materialises the [B, C] score and class
masks (C = number of candidates per row).  docs/semantics.md states the
equations; the names below follow it.

Candidates are given either as one shared list ``candidates [C]`` (the
paper's in-batch scheme: every row sees the batch's positive items) or per row
``candidates [B, C]`` (sampled unlabeled items).  In the shared case nothing
of size [B, C, d] is ever built: scores and centroids are matrix products.
"""
from __future__ import annotations

import math
from typing import Optional
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..csr import CSR
from ..known import KnownPositives, RowLookup
from .rows import NORM_EPS, ClassTerms, HardNegativeBPR, NegSize, TopK, dot, gather_rows, negative_class_size


def candidate_embeddings(item_table: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[C, d] (shared) or [B, C, d] (per row) embeddings of the candidates."""
    return item_table[candidates]


def row_scores(user_emb: torch.Tensor, item_table: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """s[b, j] = <user_emb[b], item_table[c_j]>: [B, C].

    Each distinct item is scored once per row and indexed back, so repeated candidates get
    bit-identical scores and the smallest-j tie rule is decided by the rule, not by rounding
    (a matmul may round the same dot product differently at different column positions).
    """
    if candidates.dim() == 1:
        items, position = torch.unique(candidates, return_inverse=True)
        return (user_emb @ item_table[items].T)[:, position]
    return (user_emb[:, None, :] * item_table[candidates]).sum(dim=-1)


def class_sum(weights: torch.Tensor, cand_emb: torch.Tensor) -> torch.Tensor:
    """sum_j weights[b, j] * cand_emb[(b,) j]: [B, d]."""
    if cand_emb.dim() == 2:
        return weights @ cand_emb
    return torch.einsum("bc,bcd->bd", weights, cand_emb)


def unlabeled_mask(known: KnownPositives, users: torch.Tensor, pos_items: torch.Tensor,
                   candidates: torch.Tensor) -> torch.Tensor:
    """U[b, j]: candidate j is neither a known positive of users[b] nor pos_items[b]. Bool [B, C]."""
    cand = candidates.long().expand(users.numel(), -1) if candidates.dim() == 1 else candidates.long()
    users = users.long()[:, None]
    return ~known.contains(users, cand) & (cand != pos_items.long()[:, None])


def hard_negative(scores: torch.Tensor, unlabeled: torch.Tensor) -> torch.Tensor:
    """argmax over the row's unlabeled candidates (smallest j on ties), -1 when none. int64 [B]."""
    masked = scores.detach().masked_fill(~unlabeled, float("-inf"))
    index = masked.argmax(dim=1)  # torch.argmax returns the first maximal index
    return torch.where(unlabeled.any(dim=1), index, torch.full_like(index, -1))


def bottom_k_mask(scores: torch.Tensor, unlabeled: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k[b] lowest-scored unlabeled candidates of each row (smallest j on ties). Bool [B, C]."""
    key = scores.detach().masked_fill(~unlabeled, float("inf"))
    order = torch.sort(key, dim=1, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order).contiguous())
    return unlabeled & (rank < k[:, None])


def _scored_rows(user_emb, item_table, pos_items, candidates, lookup: RowLookup):
    """What BPR and PNN share: scores [B, C], the unlabeled mask, the hard negative and L_BPR."""
    scores = row_scores(user_emb, item_table, candidates)
    unlabeled = unlabeled_mask(lookup.known, lookup.rows, pos_items, candidates)
    hard = hard_negative(scores, unlabeled)
    pos_emb = item_table[pos_items]
    pos_score = dot(user_emb, pos_emb)
    hard_score = scores.gather(1, hard.clamp_min(0)[:, None]).squeeze(1)
    bpr = torch.where(hard >= 0, F.softplus(hard_score - pos_score), torch.zeros_like(pos_score))
    return scores, unlabeled, hard, pos_emb, bpr


def hard_negative_bpr(user_emb, item_table, users, pos_items, candidates, known,
                      lookup: RowLookup | None = None) -> HardNegativeBPR:
    """BPR against the in-row hardest unlabeled candidate (the paper's batch DNS).

    ``lookup``: where the rows' known items are looked up, when not ``known``'s rows ``users``
    (a compact table's ids, :mod:`pnn_fast.compact`).
    Returns :class:`~pnn_fast.backends.rows.HardNegativeBPR` ``(bpr [B], hard int64 [B],
    num_unlabeled int64 [B])``; bpr is 0 where the row has no unlabeled candidate (hard -1).
    """
    lookup = RowLookup(known, users) if lookup is None else lookup
    _, unlabeled, hard, _, bpr = _scored_rows(user_emb, item_table, pos_items, candidates, lookup)
    return HardNegativeBPR(bpr, hard, unlabeled.sum(dim=1))


def class_terms(user_emb: torch.Tensor, pos_emb: torch.Tensor, neutral: torch.Tensor, negative: torch.Tensor,
                noise_pos: torch.Tensor, noise_neg: torch.Tensor, valid: torch.Tensor,
                num_negative: torch.Tensor) -> ClassTerms:
    """L_rank and L_constrain of each row from its class centroids; see :func:`pnn_fast.ops.class_terms`.

    Args: float [B, d] ``user_emb``, ``pos_emb``, ``neutral`` (c_neu), ``negative`` (c_neg),
    ``noise_pos``, ``noise_neg``; bool [B] ``valid``; int64 [B] ``num_negative``.
    Returns: :class:`~pnn_fast.backends.rows.ClassTerms` ``(rank, constrain)``, float [B], 0 on rows
    that are not ``valid``.
    """
    zero = torch.zeros_like(user_emb[:, 0])
    has_negative = num_negative > 0

    # L_rank: positive > neutral centroid > negative centroid
    s_pos, s_neu, s_neg = dot(user_emb, pos_emb), dot(user_emb, neutral), dot(user_emb, negative)
    rank = F.softplus(s_neu - s_pos) + torch.where(has_negative, F.softplus(s_neg - s_neu), zero)
    rank = torch.where(valid, rank, zero)

    # L_constrain: the two clamp embeddings e_neu + noise_pos*dir(e_+) and e_neu + noise_neg*dir(c_neg);
    # e_neu cancels in their difference, so it is evaluated in the simplified form.
    gap = noise_pos * F.normalize(pos_emb, dim=1, eps=NORM_EPS) - noise_neg * F.normalize(negative, dim=1, eps=NORM_EPS)
    constrain = torch.where(valid & has_negative, gap.pow(2).sum(dim=1), zero)
    return ClassTerms(rank, constrain)


def pnn_row_terms(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                  pos_items: torch.Tensor, candidates: torch.Tensor, known: KnownPositives,
                  neg_size: NegSize, noise_pos: torch.Tensor, noise_neg: torch.Tensor,
                  hard_candidates: torch.Tensor | None = None, candidates_unknown: bool = False,
                  lookup: RowLookup | None = None) -> dict:
    """Per-row PNN terms (docs/semantics.md).

    Args:
        user_emb: float [B, d]; item_table: float [I, d]; users, pos_items: int [B];
        candidates: int [C] shared or [B, C] per row; noise_pos, noise_neg: float [B, d];
        hard_candidates: int [B, M] or None: when given, L_BPR's hard negative is the hardest of
        these (DNS's), while the classes stay the candidates'; candidates_unknown: the caller's
        promise that no candidate (or hard candidate) is a known item of its row's user (they were
        drawn by :func:`pnn_fast.sampling.sample_unknown`), which lets the fused backend skip the
        known-item lookups; the reference looks them up anyway, so the parity tests check the promise;
        lookup: where the rows' known items are looked up, when not ``known``'s rows ``users`` (a
        compact table's ids, :mod:`pnn_fast.compact`); ``known`` still gives the class sizes.
    Returns:
        dict of [B] tensors: ``bpr``, ``rank``, ``constrain`` (float, 0 on rows without
        unlabeled candidates), ``hard_negative`` (int64 index into the candidates, or into
        ``hard_candidates`` when given; -1 for none), ``num_negative``, ``num_neutral`` (int64),
        ``valid`` (bool).
    """
    cand_emb = candidate_embeddings(item_table, candidates)
    lookup = RowLookup(known, users) if lookup is None else lookup
    # L_BPR with the in-batch dynamic hard negative, or DNS's
    scores, unlabeled, hard, pos_emb, bpr = _scored_rows(user_emb, item_table, pos_items, candidates, lookup)
    if hard_candidates is not None:
        dns = hard_negative_bpr(user_emb, item_table, users, pos_items, hard_candidates, known, lookup)
        bpr, hard = dns.bpr, dns.hard
    num_unlabeled = unlabeled.sum(dim=1)
    valid = num_unlabeled > 0

    # classification: bottom-k_b are negative, the rest of U_b neutral
    k = negative_class_size(num_unlabeled, known.count(users), known.num_items, neg_size)
    negative = bottom_k_mask(scores, unlabeled, k)
    neutral = unlabeled & ~negative
    num_negative, num_neutral = negative.sum(dim=1), neutral.sum(dim=1)

    # centroids of the two classes
    def centroid(mask, count):
        return class_sum(mask.to(user_emb.dtype), cand_emb) / count.clamp_min(1)[:, None].to(user_emb.dtype)

    c_neu = centroid(neutral, num_neutral)
    c_neg = centroid(negative, num_negative)
    terms = class_terms(user_emb, pos_emb, c_neu, c_neg, noise_pos, noise_neg, valid, num_negative)
    return {"bpr": bpr, "rank": terms.rank, "constrain": terms.constrain, "hard_negative": hard, "num_negative": num_negative,
            "num_neutral": num_neutral, "valid": valid}


def embedding_bpr(user_table: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                  neg_items: torch.Tensor, reg_weight: float = 0.0) -> torch.Tensor:
    """BPR over table rows: mean over (b, k) of softplus(<U[u_b], I[n_bk]> - <U[u_b], I[p_b]>), plus
    reg_weight * (||U[users]||_F + ||I[pos_items]||_F + ||I[neg_items]||_F) / B (RecBole's EmbLoss).

    user_table: float [U, d]; item_table: float [I, d]; users, pos_items: int [B]; neg_items: int [B, K].
    Returns a 0-dim tensor (NaN when B * K = 0).
    """
    user_emb = user_table[users]
    pos_score = dot(user_emb, item_table[pos_items])
    neg_score = (user_emb[:, None, :] * item_table[neg_items]).sum(dim=-1)
    loss = F.softplus(neg_score - pos_score[:, None]).mean()
    if reg_weight == 0:
        return loss
    norms = gathered_norm(user_table, users) + gathered_norm(item_table, pos_items) + gathered_norm(item_table, neg_items)
    return loss + reg_weight * norms / users.numel()


def unknown_items(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The ``r``-th (0-based) unknown item of ``users[b]``, ``r = floor(u * (I - N_u))`` for each
    ``u = uniform[b, k]`` (float32 arithmetic); the r-th unknown item is ``r + #{m : k_m - m <= r}``
    for the user's sorted items ``k_m``, found by one global searchsorted over ``known.gap_keys``.

    users: int [B]; uniform: float32 [B, K] in [0, 1). Returns int64 [B, K].
    """
    users = users.long()
    free = (known.num_items - known.count(users))[:, None]
    rank = torch.minimum((uniform * free).long(), free - 1)  # the clamp guards float rounding up to free
    if known.gap_keys.numel() == 0:
        return rank
    query = users[:, None] * (known.num_items + 1) + rank
    return rank + torch.searchsorted(known.gap_keys, query, right=True) - known.indptr[users][:, None]


def history_sample(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A uniform random subset of min(N_u, L) known items of each user, by Floyd's algorithm.

    users: int [B]; uniform: float32 [B, L] in [0, 1). Returns int64 [B, L]: the subset, then -1.
    Step i considers j = N_u - L + i and takes position t = floor(u_i (j + 1)) (float32, as
    :func:`unknown_items`), or j itself when t was taken at an earlier step;
    a user with N_u <= L gets all its items, in order.
    """
    users = users.long()
    rows, size = uniform.shape
    count = known.count(users)
    slots = torch.arange(size, device=users.device)
    pos = torch.zeros(rows, size, dtype=torch.int64, device=users.device)
    for i in range(size):
        j = count - size + i
        free = (j + 1).clamp_min(1)
        t = torch.minimum((uniform[:, i] * free).long(), free - 1)
        taken = (pos[:, :i] == t[:, None]).any(dim=1)
        pos[:, i] = torch.where(taken, j, t)
    pos = torch.where((count <= size)[:, None], slots, pos)
    valid = slots[None, :] < count.clamp(max=size)[:, None]
    where = (known.indptr[users][:, None] + pos).clamp(0, max(known.indices.numel() - 1, 0))
    items = known.indices[where] if known.indices.numel() else torch.zeros_like(pos)
    return torch.where(valid, items, torch.full_like(items, -1))


def gathered_dots(rows: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, unit_table: bool = False) -> torch.Tensor:
    """out[b, k] = <rows[b], table[ids[b, k]]>, or with ``unit_table`` <rows[b], unit_rows(table[ids[b, k]])>:
    rows float [B, d], table float [n, d], ids int [B, K] -> [B, K].

    Products and a sum rather than einsum: on the CPU, einsum's bmm of B tiny [K, d] x [d, 1]
    matrices costs several times the memory traffic of the gather itself.
    """
    gathered = gather_rows(table, ids)
    return ((unit_rows(gathered) if unit_table else gathered) * rows[:, None, :]).sum(dim=-1)


def lowest_k_mask(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Whether ``scores[b, j]`` is among the ``k[b]`` lowest of its row (as :func:`pnn_fast.ops.lowest_k_mask`):
    the rank of a stable ascending argsort below ``k[b]``.

    scores: float [B, K]; k: int [B] within [0, K].  Returns bool [B, K].
    """
    if k.numel() and not bool(((k >= 0) & (k <= scores.shape[1])).all()):
        raise ValueError(f"k must lie in [0, K] = [0, {scores.shape[1]}], got values in "
                         f"[{int(k.min())}, {int(k.max())}]")
    order = torch.argsort(scores, dim=1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(scores.shape[1], device=scores.device)
                                            .expand_as(order).contiguous())
    return rank < k[:, None]


def csr_spmm(adj: torch.Tensor, x: torch.Tensor, addend: torch.Tensor | None = None, divisor: float = 1.0) -> torch.Tensor:
    """``(addend + adj @ x) / divisor``, torch's product: sparse CSR adj [n, m], x float [m, d], addend [n, d] or None -> [n, d]."""
    product = adj @ x
    if addend is not None:
        product = addend + product
    return product / divisor if divisor != 1 else product


def gathered_norm(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """||table[ids]||_F, the Frobenius norm of the gathered rows: a 0-dim tensor."""
    return table[ids.reshape(-1)].norm()


def masked_logsumexp(x: torch.Tensor, scale: float = 1.0, shift: Optional[torch.Tensor] = None,
                     excluded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float [B]: log sum_j exp(scale x[b, j] - shift[j]) over the entries not ``excluded`` (bool
    [B, M] or None); x float [B, M], shift [M] or None. -inf for a row with nothing left, with a
    zero gradient there (never NaN)."""
    logits = x * scale if scale != 1.0 else x
    if shift is not None:
        logits = logits - shift
    if excluded is None:
        return torch.logsumexp(logits, dim=1)
    # a row with nothing left sums over zeros instead, then is set to -inf: the gradient stays finite
    empty = excluded.all(dim=1, keepdim=True)
    lse = torch.logsumexp(logits.masked_fill(excluded & ~empty, float("-inf")).masked_fill(empty, 0.0), dim=1)
    return lse.masked_fill(empty.squeeze(1), float("-inf"))


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """x / max(||x||, eps) row by row: x float [n, d] -> [n, d] (F.normalize, eps NORM_EPS)."""
    return F.normalize(x, dim=-1, eps=NORM_EPS)


def pairwise_uniformity(x: torch.Tensor, t: float, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log( mean over ordered pairs i != j of exp(-t ||x_i - x_j||^2) ); 0 for fewer than two rows.

    x: float [n, d]; keep: bool [n] or None, the rows that count (``x[keep]``). Computed as
    logsumexp over the off-diagonal pairs minus log(n (n-1)).
    """
    if keep is not None:
        x = x[keep]
    n = x.shape[0]
    if n < 2:
        return x.sum() * 0
    sq_norm = x.pow(2).sum(dim=1)
    dist2 = (sq_norm[:, None] + sq_norm[None, :] - 2 * (x @ x.T)).clamp_min(0)
    logits = (-t * dist2).masked_fill(torch.eye(n, dtype=torch.bool, device=x.device), float("-inf"))
    return torch.logsumexp(logits.reshape(-1), dim=0) - torch.log(torch.tensor(float(n * (n - 1)), dtype=x.dtype, device=x.device))


def _topk_lowest_column_on_ties(scores: torch.Tensor, k: int) -> TopK:
    """The k best entries per row, best first, equal scores ordered by ascending column.

    scores: float [B, n], k <= n.  Returns :class:`~pnn_fast.backends.rows.TopK` (values [B, k],
    columns int64 [B, k]).
    """
    # One extra entry tells whether the k-th score also occurs outside the top k: only in such
    # rows did torch.topk choose freely among tied columns, and there the lowest-numbered
    # tied columns are taken instead.
    values, columns = torch.topk(scores, min(k + 1, scores.shape[1]), dim=1)
    if values.shape[1] > k:
        rows = (values[:, k] == values[:, k - 1]).nonzero().squeeze(1)
        values, columns = values[:, :k], columns[:, :k]
        if rows.numel():
            kth = values[rows, k - 1 :]
            need = (values[rows] == kth).sum(dim=1)  # tied slots inside the top k: its last `need`
            tied = scores[rows] == kth
            chosen = tied & (torch.cumsum(tied, dim=1) <= need[:, None])
            which, column = chosen.nonzero(as_tuple=True)  # row-major: ascending columns within a row
            first = torch.cumsum(need, 0) - need
            slot = k - need[which] + torch.arange(which.numel(), device=scores.device) - first[which]
            columns[rows[which], slot] = column
    # Order equal scores by column: sort by column, then stably by descending score.
    by_column = torch.argsort(columns, dim=1)
    columns, values = columns.gather(1, by_column), values.gather(1, by_column)
    by_score = torch.sort(values, dim=1, descending=True, stable=True).indices
    return TopK(values.gather(1, by_score), columns.gather(1, by_score))


def masked_topk(scores: torch.Tensor, users: torch.Tensor, exclude: Sequence[CSR], k: int) -> TopK:
    """Each row's k best columns, an excluded column scoring -inf (as :func:`pnn_fast.ops.masked_topk`).

    scores: float [B, I]; users: int [B]; exclude: CSR over users; 1 <= k <= I.
    Returns :class:`~pnn_fast.backends.rows.TopK` (values [B, k], columns int64 [B, k]), best first,
    equal scores by ascending column.
    """
    if not 1 <= k <= scores.shape[1]:
        raise ValueError(f"k must lie in [1, I] = [1, {scores.shape[1]}], got {k}")
    scores = scores.clone()
    for mask in exclude:
        rows, items = mask.entries_of(users)
        inside = (items >= 0) & (items < scores.shape[1])  # an id outside the columns matches none
        scores[rows[inside], items[inside]] = -math.inf
    nan_rows = torch.isnan(scores).any(dim=1).nonzero()
    if nan_rows.numel():
        raise ValueError(f"scores row {int(nan_rows[0])} has a NaN at a column that is not excluded")
    return _topk_lowest_column_on_ties(scores, k)


def rows_contain(csr: CSR, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``columns[b, k] in csr's row rows[b]`` (as :func:`pnn_fast.ops.rows_contain`): each
    (row, column) pair looked up among the rows' pairs, as keys ``position * num_cols + column``.

    csr: rows sorted ascending; rows: int [B]; columns: int [B, K].  Returns bool [B, K].
    """
    positions, items = csr.entries_of(rows)
    keys = positions * csr.num_cols + items  # ascending: positions in order, items sorted within a row
    if keys.numel() == 0:
        return torch.zeros(columns.shape, dtype=torch.bool, device=columns.device)
    inside = (columns >= 0) & (columns < csr.num_cols)  # outside columns would alias a neighbour's key
    wanted = torch.arange(rows.numel(), device=columns.device)[:, None] * csr.num_cols + columns.long()
    return (keys[torch.searchsorted(keys, wanted).clamp_(max=keys.numel() - 1)] == wanted) & inside
