"""SimpleX (Mao et al., CIKM'21): cosine contrastive loss and the history-aware user tower.

User tower (official ``BehaviorAggregator``), for user ``u`` with training history ``H_u``
(in training without the row's own positive, as in the official data files)::

    h_u   = V . agg({e_i : i in H_u})            V: d x d, no bias
    t_u   = g * e_u + (1 - g) * h_u              g = ``gamma``

``agg`` is the masked mean (``aggregator="mean"``) or an attention pooling
(``"user_attention"``: a_i ~ exp(e_u . tanh(W_k e_i + b_k)); ``"self_attention"``:
a_i ~ exp(q . tanh(W_k e_i + b_k))), softmax over the history. Scores are cosines::

    loss = mean_rows[ relu(1 - cos(t_u, e_p)) + w / N * sum_{j=1..N} relu(cos(t_u, e_j) - m) ]

with N = ``num_negatives`` uniform unknown items per row, margin m and negative weight w.
Dropout (``dropout``, the official ``net_dropout``) acts on the normalised user vector in
training. Full derivation, defaults and departures: docs/baselines/simplex.md.

Scoring: SimpleX ranks items by cos(t_u, e_i), not by ``user_table @ item_table.T``;
:meth:`SimpleXObjective.scoring_tables` returns the two L2-normalised tables whose inner
products are those cosines, for a trainer that lets the objective score.
"""
from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .. import backends
from .._checks import check_int, check_real
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register

AGGREGATORS = ("mean", "user_attention", "self_attention")


def padded_history(known, history_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Every user's known items as a padded table, built once and loop-free on ``known``'s device.

    Users with more than ``history_len`` items keep a uniform random subset of that size (the
    CSR holds no timestamps, so "the latest" is not available). The subset is a fixed function
    of the data (keys drawn on the CPU from a generator seeded with ``seed``), the same on every
    device and in every run, so the table need not be saved with a checkpoint.

    Returns:
        ``(items int64 [U, L], mask bool [U, L])`` with ``L = min(history_len, max_u N_u)``
        (at least 1); a row's items ascend, then padded slots hold item 0 and mask False.
    """
    counts = known.indptr[1:] - known.indptr[:-1]
    width = max(1, min(int(history_len), int(counts.max()) if counts.numel() else 0))
    owner = torch.repeat_interleave(torch.arange(known.num_users, device=known.device), counts)
    nnz = owner.numel()
    items = torch.zeros(known.num_users, width, dtype=torch.int64, device=known.device)
    if nnz == 0:
        return items, torch.zeros_like(items, dtype=torch.bool)
    # a random rank within each user: order by random keys, then stable-sort that order by owner
    keys = torch.rand(nnz, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    perm = torch.argsort(keys).to(known.device)
    perm = perm[torch.sort(owner[perm], stable=True).indices]
    slot = torch.arange(nnz, device=known.device) - known.indptr[owner]
    keep = slot < width
    items.fill_(known.num_items)  # padding sorts last
    items[owner[keep], slot[keep]] = known.indices[perm[keep]]
    items = torch.sort(items, dim=1).values  # ascending within a row: COO-ready (rows, then columns)
    mask = items < known.num_items
    return items.masked_fill(~mask, 0), mask


def generator_dropout(x: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout whose mask comes from ``generator`` (so a resumed run repeats it)."""
    if p <= 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


def gathered_cosines(user_unit: torch.Tensor, item_table: torch.Tensor, items: torch.Tensor,
                     impl: ModuleType) -> torch.Tensor:
    """cos(user row b, item items[b, j]) for unit user rows ``[B, d]``, the item table ``[I, d]`` and
    ids ``[B, N]``: ``[B, N]``, by the backend ``impl``.

    The backend's ``gathered_dots`` with ``unit_table``: each gathered item row is scaled to unit
    length inside the product, so nothing of size [B, N, d] or [B, I] is built and the table is not
    normalised as a whole (a table-sized pass forward and backward, and a second [I, d] buffer, every
    step; SimpleX's hinge leaves nearly all of the backward's entries zero, which the kernel skips).
    The reference backend gathers [B, N, d] rows, so it takes one [B, I] product of the unit table
    instead where that is smaller (``I < N * d``).
    """
    if impl is backends.reference and item_table.shape[0] < items.shape[1] * item_table.shape[1]:
        return (user_unit @ impl.unit_rows(item_table).T).gather(1, items)
    return impl.gathered_dots(user_unit, item_table, items, unit_table=True)


def cosine_contrastive_loss(pos_cos: torch.Tensor, neg_cos: torch.Tensor, margin: float,
                            negative_weight: float) -> torch.Tensor:
    """CCL: mean_b [relu(1 - pos_b) + w * mean_j relu(neg_bj - m)]; ``w = 0`` sums instead
    (the official ``negative_weight=None`` case)."""
    neg = torch.relu(neg_cos - margin)
    neg = neg.mean(dim=1) * negative_weight if negative_weight else neg.sum(dim=1)
    return (torch.relu(1.0 - pos_cos) + neg).mean()


@register("simplex")
class SimpleXObjective(Objective):
    """SimpleX: CCL over ``num_negatives`` uniform unknown items with the history-aware user tower.

    Defaults are the authors' MovieLens-1M configuration (reczoo/RecZoo,
    ``matching/cf/SimpleX/config/SimpleX_movielens1m_m1``); other datasets' values are listed in
    docs/baselines/simplex.md.
    """

    DEFAULTS: ClassVar[dict] = {
        "num_negatives": 1500,   # num_negs (SimpleX_movielens1m_m1/model_config.yaml)
        "margin": 0.9,           # margin, same file
        "negative_weight": 10.0, # negative_weight, same file
        "gamma": 0.8,            # gamma: weight of the user's own embedding, same file
        "aggregator": "mean",    # aggregator, same file
        "history_len": 500,      # user_history max_len (SimpleX_movielens1m_m1/dataset_config.yaml)
        "dropout": 0.4,          # net_dropout on the user vector, same model_config.yaml
        "backend": "auto",       # pnn_fast: whose gathered_dots makes the cosines
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        with self.naming_the_loss():
            backends.check_name(a["backend"])
            if a["aggregator"] not in AGGREGATORS:
                raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {a['aggregator']!r}")
            check_int("num_negatives", a["num_negatives"], 1)
            check_int("history_len", a["history_len"], 1)
            # cosines lie in [-1, 1]: a margin outside makes the negatives' term constant
            check_real("margin", a["margin"], low=-1.0, high=1.0)
            check_real("negative_weight", a["negative_weight"])
            check_real("gamma", a["gamma"], high=1.0)
            if check_real("dropout", a["dropout"], high=1.0) == 1.0:
                raise ValueError(f"dropout must lie in [0, 1), got {a['dropout']!r}")
        dim = model.dim
        self.W_v = nn.Linear(dim, dim, bias=False)
        nn.init.xavier_normal_(self.W_v.weight)
        if a["aggregator"] != "mean":
            self.W_k = nn.Linear(dim, dim)
            nn.init.xavier_normal_(self.W_k.weight)
            nn.init.zeros_(self.W_k.bias)
            if a["aggregator"] == "self_attention":
                self.W_q = nn.Parameter(nn.init.xavier_normal_(torch.empty(dim, 1)))
        items, mask = padded_history(known, int(a["history_len"]))
        # rebuilt identically from the data on every construction: not part of the state dict
        self.register_buffer("history", items, persistent=False)
        self.register_buffer("history_mask", mask, persistent=False)

    # ---- the user tower ------------------------------------------------------------
    def _mean_operator(self, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """Row-normalised history matrix A [U, I] (sparse COO) and its nnz, cached until the
        history buffers change (moved, reloaded) or another dtype is asked for."""
        mask = self.history_mask
        key = (mask.data_ptr(), mask._version, self.history._version, dtype)
        cache = getattr(self, "_mean_cache", None)
        if cache is None or cache[0] != key:
            rows, slots = mask.nonzero(as_tuple=True)          # row-major, items ascending per row
            counts = mask.sum(dim=1)
            values = (1.0 / counts[rows].to(dtype))
            indices = torch.stack([rows, self.history[rows, slots]])
            matrix = torch.sparse_coo_tensor(indices, values, (mask.shape[0], self.known.num_items),
                                             is_coalesced=True, check_invariants=False)
            cache = self._mean_cache = (key, matrix, rows.numel())
        return cache[1], cache[2]

    def batch_history(self, users: torch.Tensor, exclude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded histories of ``users [B]``: (items int64 [B, L], mask bool [B, L]) whose mask
        leaves out the padding and the item ``exclude[b]`` of each row. Row gathers by index_select
        (several times cheaper than advanced indexing of an [U, L] table)."""
        items = self.history.index_select(0, users)
        mask = self.history_mask.index_select(0, users)
        if exclude is not None:
            mask = mask & (items != exclude[:, None])
        return items, mask

    def mean_history(self, item_table: torch.Tensor, users: torch.Tensor, exclude: torch.Tensor | None = None,
                     path: str = "auto") -> torch.Tensor:
        """mean_{i in H_u, i != exclude_b} e_i for the rows ``users [B]``: [B, d], zero when empty.

        Two equal computations: one sparse product A @ item_table over all users, corrected for
        the excluded item ("sparse", cheaper while the whole history has fewer entries than the
        batch's padded [B, L]), or a weighted embedding bag over the batch's padded histories ("bag").
        """
        matrix, nnz = self._mean_operator(item_table.dtype)
        if path == "auto":
            path = "sparse" if nnz <= users.numel() * self.history.shape[1] else "bag"
        if path == "sparse" and exclude is None:  # scoring: no [B, L] history gathered
            return torch.sparse.mm(matrix, item_table)[users]
        items, mask = self.batch_history(users, exclude)
        mask = mask.to(item_table.dtype)
        count = mask.sum(dim=1, keepdim=True)
        if path == "sparse":
            pooled = torch.sparse.mm(matrix, item_table)[users]
            full = self.history_mask.index_select(0, users).sum(dim=1, keepdim=True).to(item_table.dtype)
            dropped = (full - count) * item_table[exclude]   # 1 where the excluded item was in H_u
            return (pooled * full - dropped) / count.clamp_min(1.0)
        weights = mask / count.clamp_min(1.0)
        return F.embedding_bag(items, item_table, mode="sum", per_sample_weights=weights)

    def aggregate(self, user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                  exclude: torch.Tensor | None = None) -> torch.Tensor:
        """V . agg(H_u minus exclude_b) for the rows ``users [B]`` with embeddings ``user_emb [B, d]``."""
        aggregator = self.args["aggregator"]
        if aggregator == "mean":
            pooled = self.mean_history(item_table, users, exclude)
        else:
            items, mask = self.batch_history(users, exclude)           # [B, L] each
            # the keys (d x d per item) only for the valid slots: a padded [B, L, d] would cost
            # max_u |H_u| per row where the mean row needs |H_u| (Gowalla: about 30x more)
            row, slot = mask.nonzero(as_tuple=True)                     # [n] each, row-major like mask
            # the history's rows gathered once, for the keys and the pooling: one dense item gradient
            # (the product of a [n] gather), not one for each use
            history_rows = item_table.index_select(0, items[row, slot])  # [n, d]
            keys = torch.tanh(self.W_k(history_rows))                  # [n, d]
            if aggregator == "user_attention":
                valid_logits = (keys * user_emb[row]).sum(-1)
            else:
                valid_logits = (keys @ self.W_q.to(keys.dtype)).squeeze(-1)
            # softmax over the valid slots; a row with none gets all-zero weights (finite gradients)
            logits = torch.full(mask.shape, torch.finfo(keys.dtype).min, dtype=keys.dtype, device=keys.device)
            logits = logits.masked_scatter(mask, valid_logits)
            attention = torch.softmax(logits, dim=1).masked_fill(~mask, 0.0)
            weighted = history_rows * attention[row, slot][:, None]
            pooled = torch.zeros_like(user_emb).index_add(0, row, weighted)  # an empty row pools to 0
        return self.W_v(pooled)

    def user_vectors(self, user_table: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                     exclude: torch.Tensor | None = None) -> torch.Tensor:
        """t_u = g e_u + (1 - g) V agg(H_u minus exclude) for ``users [B]``; [B, d], not normalised.

        Training passes the rows' positives as ``exclude`` (the official data leaves the target
        item out of its row's history); scoring uses the whole history.
        """
        g = float(self.args["gamma"])
        user_emb = user_table[users]
        if g == 1.0:
            return user_emb
        return g * user_emb + (1.0 - g) * self.aggregate(user_emb, item_table, users, exclude)

    @torch.no_grad()
    def scoring_tables(self, model, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit user towers [U, d], unit item rows [I, d]): inner products are SimpleX's cosines."""
        user_table, item_table = model.embeddings()
        users = torch.arange(user_table.shape[0], device=user_table.device)
        if self.args["aggregator"] == "mean":
            chunk = users.numel()  # [U, d] at once: one sparse product for every user
        towers = torch.cat([self.user_vectors(user_table, item_table, users[s:s + chunk])
                            for s in range(0, users.numel(), chunk)])
        return F.normalize(towers, dim=-1), F.normalize(item_table, dim=-1)

    # ---- the loss ------------------------------------------------------------------
    def batch_loss(self, user_table, item_table, users, pos_items, neg_items, generator=None) -> torch.Tensor:
        """CCL of the rows (users, pos_items) against ``neg_items [B, N]``; dropout when training."""
        user_unit = F.normalize(self.user_vectors(user_table, item_table, users, exclude=pos_items), dim=-1)
        if self.training:
            user_unit = generator_dropout(user_unit, float(self.args["dropout"]), generator)
        impl = backends.select(self.args["backend"], item_table.device)
        # the positive as the first column of the negatives' product: one dense item gradient
        cosines = gathered_cosines(user_unit, item_table, torch.cat([pos_items[:, None], neg_items], 1), impl)
        pos_cos, neg_cos = cosines[:, 0], cosines[:, 1:]
        return cosine_contrastive_loss(pos_cos, neg_cos, float(self.args["margin"]),
                                       float(self.args["negative_weight"]))

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = sample_unknown(self.known, users, int(self.args["num_negatives"]), generator)
        loss = self.batch_loss(user_table, item_table, users, pos_items, neg, generator)
        # L2 over the batch's users and positives only: the official regulariser's share of N
        # negatives would gather B x N rows per batch (see docs/baselines/simplex.md)
        return BatchLoss(loss, users, pos_items)
