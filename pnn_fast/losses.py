"""Drop-in loss modules: PNNLoss (the paper's method), the classic BPR / DNS losses, and sampled
softmax (SL), the loss with the lift PNN's own loss did not give (docs/why-pnn.md).

Every loss takes the model's own embeddings, ``user_emb [B, d]`` for the batch's users and
the full ``item_table [I, d]`` the model scores with, so any PyTorch recommender whose
score is an inner product can swap its loss for these.
"""
from __future__ import annotations

import inspect
import math
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import backends
from ._checks import (check_bool, check_embedding, check_id_tensor, check_int, check_kernel_inputs, check_neg_size,
                      check_real, check_same, check_validate, check_values, ids_in_range, require_tensor,
                      validate_batch)
from .attention import UserAwareAttention
from .compact import compact_items, sorted_runs
from .distributed import gather_ids
from .backends.rows import NORM_EPS, negative_class_size
from .known import KnownPositives, RowLookup
from .sampling import sample_unknown


#: Named configurations for :meth:`PNNLoss.from_preset`. ``paper``: the equations as the paper
#: writes them (the defaults). ``dns-anchored``: L_BPR against DNS's hardest of 8 uniform items,
#: the classes over 8 sampled candidates, no L_uniform and a fixed, small lambda: the best PNN of
#: the screening in docs/why-pnn.md, where it ties DNS rather than beating it.
PRESETS: dict = {
    "paper": {},
    "dns-anchored": {"num_candidates": 8, "beta": 0.0, "lambda_mode": "fixed", "fixed_lambda": 0.1},
}


def loss_defaults(loss) -> dict:
    """The defaults of a loss module's (or a loss function's) arguments, read from its signature: the
    one place they are written (the trainer's objectives and the RecBole models take theirs from here)."""
    signature = inspect.signature(loss.__init__ if isinstance(loss, type) else loss)
    return {name: p.default for name, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}


class _ChecksInputs:
    """The ``check()`` of every loss module."""

    def check(self) -> None:
        """Raise the first bad input recorded since the last check, and clear it (one host read a device).

        With ``validate="deferred"`` (the default) a call tests its ids on the device and never reads
        the answer back; a bad id is clamped into range, so that call's loss is wrong until this
        raises. Call it once an epoch, or after a step while debugging (or use ``validate="eager"``).
        """
        check_kernel_inputs()


class PNNLoss(_ChecksInputs, nn.Module):
    """Positive-neutral-negative loss (RecSys'24), semantics in docs/semantics.md.

    Args:
        known: each user's training items (:class:`KnownPositives`); never used as negatives.
        dim: embedding size d (for the attention's parameters).
        alpha, beta: weights of L_constrain and L_uniform inside L_PNN (finite, >= 0).
        noise_max: clamp noise magnitude is drawn U(0, noise_max) per coordinate (finite, >= 0).
        neg_size: size of each row's negative class: "proportional", "count" or an int (below
            ``num_candidates`` when that is set: the neutral class keeps at least one candidate).
        history_len: at most this many known items feed the user-aware attention (>= 1).
        uniform_t: the temperature t of L_uniform (the paper's 2; finite, > 0).
        uniform_normalize: L2-normalise the embeddings inside L_uniform.
        uniform_over: "items" (the paper: the batch's distinct candidate items) or "users_and_items"
            (DirectAU's: the mean of that and the same term over the batch's distinct users).
        lambda_mode: "attention" (learned per user) or "fixed" (``fixed_lambda`` everywhere).
        fixed_lambda: lambda of ``lambda_mode="fixed"``, in [0, 1].
        lambda_range: with ``lambda_mode="attention"``, a pair (low, high), 0 <= low < high <= 1:
            lambda = low + (high - low) * attention, so it cannot saturate at 0 or 1 (the paper's
            attention runs to an end in every run we know of); None: the attention's own [0, 1].
        lambda_temperature: with ``lambda_mode="attention"``, the temperature T of its sigmoid,
            lambda = sigmoid(logit / T) (finite, > 0; the paper's 1): a larger T slows the
            attention's run to 0 or 1.
        use_rank: keep L_rank (False gives the paper's "w/o rank" ablation).
        rank_weight: the weight of L_rank inside L_PNN (the paper's 1; finite, >= 0).
        num_candidates: when set, a call without ``neg_items`` draws this many uniform unknown items
            per row as the candidates (:func:`pnn_fast.sampling.sample_unknown`); None: in-batch.
        num_hard_candidates: when set, a call without ``hard_candidates`` draws this many per row
            for L_BPR's hard negative (DNS's choice); None: the hardest of the candidates.
        candidates_across_ranks: under ``torch.distributed``, in-batch candidates are every rank's
            positives (:func:`pnn_fast.distributed.gather_ids`), as contrastive losses gather theirs;
            each rank scores them on its own replica of ``item_table``, so with DDP's gradient
            averaging the result equals one process training on the whole global batch.
        backend: "auto", "reference", "cpu" or "cuda" (same semantics everywhere).
        validate: how a call checks its values (shapes, dtypes and devices are always checked):
            ``"deferred"`` tests the ids on the device with no host read, and :meth:`check` raises
            what it found; ``"eager"`` checks ids and finiteness, the whole item table included,
            with one host read a call, before any kernel runs (for debugging; True means this);
            False checks nothing in Python. Modes: :mod:`pnn_fast._checks`.
        sparse: gather the rows the step reads into a compact table first (:mod:`pnn_fast.compact`),
            so that ``item_table``'s gradient is a sparse COO tensor of those rows, as
            ``nn.Embedding(sparse=True)`` gives, for ``torch.optim.SparseAdam``; no tensor of the
            step then has a dimension of the catalog's size. Costs a sort of the step's ids and one
            read on the host. A table the model computes (LightGCN's) gets a dense gradient.

    Forward shapes: ``user_emb`` float [B, d]; ``item_table`` float [I, d];
    ``users``, ``pos_items`` int [B]; ``neg_items`` int [B, K] or None (in-batch candidates);
    ``noise`` a pair of float [B, d] or None; ``hard_candidates`` int [B, M] or None: when given,
    L_BPR takes its hard negative as the hardest unlabeled of these (DNS's choice, e.g. M uniform
    samples) while the classes still come from the candidates; ``generator`` the random stream of
    the draws that ``num_candidates`` / ``num_hard_candidates`` ask for. Returns the scalar loss, or
    ``(loss, components)`` with per-row ``bpr``, ``rank``, ``constrain``, ``lambda``,
    ``hard_negative``, ``num_negative``, ``num_neutral``, ``valid`` [B] and scalar ``uniform``.
    """

    def __init__(self, known: KnownPositives, dim: int, *, alpha: float = 0.8, beta: float = 0.6,
                 noise_max: float = 0.1, neg_size: Union[str, int] = "proportional", history_len: int = 50,
                 uniform_t: float = 2.0, uniform_normalize: bool = True, uniform_over: str = "items",
                 lambda_mode: str = "attention", fixed_lambda: float = 0.5,
                 lambda_range: Optional[Tuple[float, float]] = None, lambda_temperature: float = 1.0,
                 use_rank: bool = True, rank_weight: float = 1.0,
                 num_candidates: Optional[int] = None, num_hard_candidates: Optional[int] = None,
                 candidates_across_ranks: bool = False, backend: str = "auto",
                 validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__()
        if not isinstance(known, KnownPositives):
            raise TypeError(f"known must be a KnownPositives, got {type(known).__name__}")
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if lambda_mode not in ("attention", "fixed"):
            raise ValueError(f"lambda_mode must be 'attention' or 'fixed', got {lambda_mode!r}")
        if uniform_over not in ("items", "users_and_items"):
            raise ValueError(f"uniform_over must be 'items' or 'users_and_items', got {uniform_over!r}")
        if lambda_range is not None:
            if lambda_mode != "attention":
                raise ValueError(f"lambda_range bounds the attention's lambda; lambda_mode={lambda_mode!r} has none")
            if not isinstance(lambda_range, (tuple, list)) or len(lambda_range) != 2:
                raise ValueError(f"lambda_range must be a pair (low, high), got {lambda_range!r}")
            low = check_real("lambda_range low", lambda_range[0], high=1.0)
            high = check_real("lambda_range high", lambda_range[1], high=1.0)
            if not low < high:
                raise ValueError(f"lambda_range must have low < high, got {lambda_range!r}")
            lambda_range = (low, high)
        lambda_temperature = check_real("lambda_temperature", lambda_temperature, low_open=True)
        if lambda_temperature != 1.0 and lambda_mode != "attention":
            raise ValueError(f"lambda_temperature belongs to the attention's lambda; lambda_mode={lambda_mode!r} has none")
        check_int("history_len", history_len, 1)
        for name, count in (("num_candidates", num_candidates), ("num_hard_candidates", num_hard_candidates)):
            if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {count!r}")
        neg_size = check_neg_size(neg_size, num_candidates)
        self.known = known
        self.dim = dim
        # a negative weight makes its term a reward with no lower bound, and NaN poisons every step
        self.alpha, self.beta = check_real("alpha", alpha), check_real("beta", beta)
        self.noise_max = check_real("noise_max", noise_max)
        self.neg_size = neg_size
        self.uniform_t = check_real("uniform_t", uniform_t, low_open=True)
        self.uniform_normalize = check_bool("uniform_normalize", uniform_normalize)
        self.uniform_over = uniform_over
        self.lambda_mode = lambda_mode
        self.fixed_lambda = check_real("fixed_lambda", fixed_lambda, high=1.0)
        self.lambda_range = lambda_range
        self.use_rank = check_bool("use_rank", use_rank)
        self.rank_weight = check_real("rank_weight", rank_weight)
        self.num_candidates, self.num_hard_candidates = num_candidates, num_hard_candidates
        self.candidates_across_ranks = check_bool("candidates_across_ranks", candidates_across_ranks)
        self.backend = backends.check_name(backend)
        self.validate = check_validate(validate)
        self.sparse = check_bool("sparse", sparse)
        self.attention = UserAwareAttention(dim, history_len, lambda_temperature) if lambda_mode == "attention" else None

    def forward(self, user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                pos_items: torch.Tensor, neg_items: Optional[torch.Tensor] = None,
                noise: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, return_components: bool = False,
                hard_candidates: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None):
        users, pos_items, neg_items, hard_candidates = validate_batch(
            self.known, self.dim, user_emb, item_table, users, pos_items, neg_items, noise, self.validate,
            hard_candidates=hard_candidates, whole_table=not self.sparse, op="PNNLoss")
        known = self.known = self.known.to(user_emb.device)  # moved once, then cached
        # candidates (and hard candidates) drawn here are unknown items by construction
        drawn_here = neg_items is None and self.num_candidates is not None and hard_candidates is None
        if neg_items is None and self.num_candidates is not None:
            neg_items = sample_unknown(known, users, self.num_candidates, generator, self.backend)
        if hard_candidates is None and self.num_hard_candidates is not None:
            hard_candidates = sample_unknown(known, users, self.num_hard_candidates, generator, self.backend)
        impl = backends.select(self.backend, user_emb.device)
        candidates = pos_items if neg_items is None else neg_items
        if neg_items is None and self.candidates_across_ranks:
            candidates = gather_ids(pos_items)
        if noise is None:
            noise = (torch.rand_like(user_emb) * self.noise_max, torch.rand_like(user_emb) * self.noise_max)
        # the attention's histories are drawn here, after the noise as before, so that they join the
        # step's other rows in one gather: one item gradient rather than two
        history = None if self.attention is None else self.attention.sample(known, users, self.backend)
        table, lookup = item_table, None
        ids = [pos_items, candidates] + ([] if hard_candidates is None else [hard_candidates])
        ids += [] if history is None else [history.items]
        # the lookup of known items reads each row's known items: about B x the mean count
        lookup_reads = 0 if drawn_here else users.numel() * known.nnz / max(known.num_users, 1)
        # the lookup of known items in a compact table is sized by a count read back: a dense step
        # gathers first with it only where a read costs nothing (the CPU); on a GPU, where it is a
        # synchronisation, the step runs on the whole table (its passes at memory bandwidth) instead
        gather_first = _catalog_outweighs(item_table, ids, lookup_reads) and (
            drawn_here or _reads_are_free(item_table.device))
        if self.sparse or gather_first:
            # drawn unknown items need no lookup: nothing is known (the fused kernels skip it then too)
            # a dense gradient without a lookup is sized by the ids, with no host read
            size = sum(t.numel() for t in ids) if drawn_here and not self.sparse else None
            table, renamed, lookup = _compact(item_table, ids, self.validate == "eager", None if drawn_here else known, users,
                                              sparse=self.sparse, size=size)
            lookup = RowLookup(known.without_items, users) if drawn_here else lookup
            pos_items, candidates = renamed[0], renamed[1]
            hard_candidates = None if hard_candidates is None else renamed[2]
            history = None if history is None else history._replace(items=renamed[-1])
        terms = impl.pnn_row_terms(user_emb, table, users, pos_items, candidates, known,
                                   self.neg_size, noise[0], noise[1], hard_candidates=hard_candidates,
                                   candidates_unknown=drawn_here, lookup=lookup)

        # L_uniform over the batch's distinct candidate items (and users); O(n^2 d), so skipped when its weight is 0
        if self.beta == 0 and not return_components:
            uniform = item_table.new_zeros(())
        else:
            items = sorted_runs(candidates)
            uniform = self._uniformity(impl, table[items.values], items.first)
            if self.uniform_over == "users_and_items":
                rows = sorted_runs(users)
                uniform = (uniform + self._uniformity(impl, user_emb[rows.order], rows.first)) / 2

        if self.attention is not None:
            lam = self.attention.weights(user_emb, table, history, self.backend)
            if self.lambda_range is not None:
                low, high = self.lambda_range
                lam = low + (high - low) * lam
        else:
            lam = torch.full_like(terms["bpr"], self.fixed_lambda)

        rank = self.rank_weight * terms["rank"] if self.use_rank else torch.zeros_like(terms["rank"])
        pnn = self.alpha * terms["constrain"] + self.beta * uniform + rank
        valid = terms["valid"]
        per_row = torch.where(valid, (1 - lam) * terms["bpr"] + lam * pnn, torch.zeros_like(pnn))
        loss = per_row.sum() / valid.sum().clamp_min(1)
        if not return_components:
            return loss
        components = dict(terms, rank=rank, uniform=uniform)
        components["lambda"] = lam
        return loss, components

    def _uniformity(self, impl, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """L_uniform of the kept rows of x [n, d] (keep: bool [n]; normalised first when
        ``uniform_normalize``): 0-dim."""
        if self.uniform_normalize:
            x = F.normalize(x, dim=1, eps=NORM_EPS)
        return impl.pairwise_uniformity(x, self.uniform_t, keep)

    @classmethod
    def from_preset(cls, name: str, known: KnownPositives, dim: int, **overrides) -> "PNNLoss":
        """A PNNLoss configured by the named preset of :data:`PRESETS` (``overrides`` win, e.g. ``backend``).

        With a preset that samples its candidates, call it without ``neg_items``
        (``loss_fn(user_emb, item_table, users, pos_items)``): it draws them itself.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown PNN preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(known, dim, **{**PRESETS[name], **overrides})

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, alpha={self.alpha}, beta={self.beta}, neg_size={self.neg_size!r}, "
                f"lambda_mode={self.lambda_mode!r}, backend={self.backend!r}, sparse={self.sparse}")


def _compact(table: torch.Tensor, ids, eager: bool, known: Optional[KnownPositives] = None,
             users: Optional[torch.Tensor] = None, sparse: bool = True, size: Optional[int] = None):
    """(the compact table, the renamed ids, the lookup or None), from
    :func:`pnn_fast.compact.compact_items`; with ``sparse`` and ``eager`` (validate="eager"), the rows
    read must be finite (the check ``validate_batch`` makes of the whole table on the dense path)."""
    compact = compact_items(table, ids, sparse=sparse, known=known, users=users, size=size)
    if eager and sparse:
        check_values([], [("item_table", compact.table)])
    return compact.table, compact.ids, compact.lookup


def _catalog_outweighs(item_table: torch.Tensor, ids, lookup_reads: float) -> bool:
    """Whether the dense path should gather the step's rows first, too: when the table has more rows
    than the gather reads (the step's ids, sorted once, and the known items its lookup renames),
    the table-sized passes it saves (each op's own [I, d] gradient, and their sum; it leaves one,
    the ``index_select``'s) cost more than it does. On ML-1M it never gathers; at 2M items it does."""
    return item_table.shape[0] > sum(t.numel() for t in ids) + lookup_reads


def _reads_are_free(device: torch.device) -> bool:
    """Whether reading a value back to the host costs a step nothing: on the CPU it does not wait on a
    device (a GPU's read is a synchronisation, which a dense loss step never makes)."""
    return device.type == "cpu"


def _check_bpr_ids(ref_name: str, ref: torch.Tensor, item_table: torch.Tensor, batch: int, pos_items: torch.Tensor,
                   neg_items: torch.Tensor, validate, op: str, extra=()) -> list:
    """Checks of a BPR call against ``ref`` (the user rows or table), by ``validate`` as
    :func:`pnn_fast._checks.validate_batch`: [pos_items, neg_items as [B, K] ([B] is K = 1), *extra's ids]."""
    check_embedding("item_table", item_table, rows=None, dim=ref.shape[1])
    check_same(ref_name, ref, [("item_table", item_table)], dtype=True)
    if batch == 0:
        raise ValueError(f"the batch is empty (0 rows of {ref_name})")
    check_id_tensor("pos_items", pos_items, (batch,))
    check_id_tensor("neg_items", neg_items, None)
    if neg_items.shape[0] != batch or neg_items.dim() not in (1, 2) or neg_items.numel() == 0:
        raise ValueError(f"neg_items must have shape [B={batch}] or [B, K] with K >= 1, got {list(neg_items.shape)}")
    check_same(ref_name, ref, [("pos_items", pos_items), ("neg_items", neg_items)], dtype=False)
    ids = [("pos_items", pos_items, item_table.shape[0]), ("neg_items", neg_items.reshape(batch, -1),
                                                           item_table.shape[0]), *extra]
    if validate == "eager":
        check_values(ids, [])
    elif validate == "deferred":
        return [ids_in_range(x, size, op, name) for name, x, size in ids]
    return [x for _, x, _ in ids]


def embedding_bpr(user_table: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                  neg_items: torch.Tensor, *, reg_weight: float = 0.0, backend: str = "auto",
                  validate: Union[str, bool] = "deferred", sparse: bool = False) -> torch.Tensor:
    """BPR straight from the embedding tables: mean over (b, k) of
    ``softplus(<U[users_b], I[neg_bk]> - <U[users_b], I[pos_b]>)``, plus, when ``reg_weight`` is not
    0, RecBole's EmbLoss of the gathered rows:
    ``reg_weight * (||U[users]||_F + ||I[pos_items]||_F + ||I[neg_items]||_F) / B``.

    The fused backends gather, score and scatter the gradients in one op each way, the L2 term
    included, which is what makes a BPR training step cheap; with ``reg_weight`` 0 the result
    equals :class:`BPRLoss` on ``user_table[users]``.

    Args:
        user_table: float [U, d]; item_table: float [I, d]; users, pos_items: int [B];
        neg_items: int [B] or [B, K]; reg_weight: a finite float >= 0;
        backend, validate: as :class:`PNNLoss` (``pnn_fast.check_kernel_inputs()`` raises what
            ``"deferred"`` found); sparse: as :class:`PNNLoss`, for both tables.
    Returns: 0-dim tensor.
    """
    reg_weight = check_real("reg_weight", reg_weight)
    require_tensor("user_table", user_table)
    check_embedding("user_table", user_table, rows=None, dim=user_table.shape[-1] if user_table.dim() == 2 else -1)
    check_id_tensor("users", users, None)
    if users.dim() != 1:
        raise ValueError(f"users must have shape [B], got {list(users.shape)}")
    check_same("user_table", user_table, [("users", users)], dtype=False)
    pos_items, neg, users = _check_bpr_ids("user_table", user_table, item_table, users.numel(), pos_items, neg_items,
                                           check_validate(validate), "embedding_bpr",
                                           extra=[("users", users, user_table.shape[0])])
    impl = backends.select(backends.check_name(backend), user_table.device)
    if sparse:
        user_table, (users,), _ = _compact(user_table, [users], False)
        item_table, (pos_items, neg), _ = _compact(item_table, [pos_items, neg], False)
    return impl.embedding_bpr(user_table, item_table, users, pos_items, neg, reg_weight)


class BPRLoss(_ChecksInputs, nn.Module):
    """Bayesian personalised ranking with given (sampled) negatives.

    forward(user_emb [B, d], item_table [I, d], pos_items int [B], neg_items int [B] or [B, K])
    -> mean over all (row, negative) pairs of softplus(s_neg - s_pos).
    ``backend``, ``validate`` and ``sparse`` as :class:`PNNLoss`.
    """

    def __init__(self, *, backend: str = "auto", validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__()
        self.backend = backends.check_name(backend)
        self.validate = check_validate(validate)
        self.sparse = check_bool("sparse", sparse)

    def forward(self, user_emb: torch.Tensor, item_table: torch.Tensor, pos_items: torch.Tensor,
                neg_items: torch.Tensor) -> torch.Tensor:
        require_tensor("user_emb", user_emb)
        check_embedding("user_emb", user_emb, rows=None, dim=user_emb.shape[-1] if user_emb.dim() == 2 else -1)
        rows = torch.arange(user_emb.shape[0], device=user_emb.device)
        pos_items, neg = _check_bpr_ids("user_emb", user_emb, item_table, user_emb.shape[0], pos_items, neg_items,
                                        self.validate, "BPRLoss")
        impl = backends.select(self.backend, user_emb.device)
        if self.sparse:
            item_table, (pos_items, neg), _ = _compact(item_table, [pos_items, neg], False)
        return impl.embedding_bpr(user_emb, item_table, rows, pos_items, neg)


class DNSLoss(_ChecksInputs, nn.Module):
    """BPR against the hardest unlabeled candidate of each row (dynamic negative sampling).

    Candidates are ``neg_items [B, M]`` (e.g. M uniform samples, the authors' M=8) or, when
    None, the batch's positive items (the paper's in-batch DNS). A row's known positives and
    its own positive are never taken; rows without a candidate are left out of the mean.
    Same semantics as PNNLoss's ``bpr`` component, on the same backends; ``validate`` and
    ``sparse`` as PNNLoss. ``forward(..., candidates_unknown=True)`` is the caller's promise that
    ``neg_items`` were drawn from each row's unknown items (:func:`pnn_fast.sample_unknown`): the
    known-item lookups are then skipped, which with ``sparse=True`` on a catalog whose users hold
    many items is most of the step (ML-1M: a lookup of 2048 x 165 known items a step).
    """

    def __init__(self, known: KnownPositives, *, backend: str = "auto", validate: Union[str, bool] = "deferred",
                 sparse: bool = False):
        super().__init__()
        if not isinstance(known, KnownPositives):
            raise TypeError(f"known must be a KnownPositives, got {type(known).__name__}")
        self.known = known
        self.backend = backends.check_name(backend)
        self.validate = check_validate(validate)
        self.sparse = check_bool("sparse", sparse)

    def forward(self, user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                pos_items: torch.Tensor, neg_items: Optional[torch.Tensor] = None, *,
                candidates_unknown: bool = False) -> torch.Tensor:
        require_tensor("user_emb", user_emb)
        if candidates_unknown and neg_items is None:
            raise ValueError("candidates_unknown promises that neg_items were drawn from unknown items; in-batch "
                             "candidates (neg_items None) are other rows' positives")
        dim = user_emb.shape[-1] if user_emb.dim() == 2 else -1
        users, pos_items, neg_items, _ = validate_batch(self.known, dim, user_emb, item_table, users, pos_items, neg_items,
                                                        None, self.validate, whole_table=not self.sparse, op="DNSLoss")
        self.known = self.known.to(user_emb.device)  # no copy when already there
        impl = backends.select(self.backend, user_emb.device)
        candidates = pos_items if neg_items is None else neg_items
        lookup = None
        if self.sparse:
            item_table, (pos_items, candidates), lookup = _compact(item_table, [pos_items, candidates],
                                                                  self.validate == "eager",
                                                                  None if candidates_unknown else self.known, users)
        if candidates_unknown:  # nothing is known: every lookup would miss
            lookup = RowLookup(self.known.without_items, users)
        dns = impl.hard_negative_bpr(user_emb, item_table, users, pos_items, candidates, self.known, lookup)
        return dns.bpr.sum() / (dns.hard >= 0).sum().clamp_min(1)


class CosineScores(NamedTuple):
    """The cosines a sampled loss is computed from (:func:`cosine_scores`).

    positive: float [B], cos(u_b, p_b); negative: float [B, K] (each row's own draws) or [B, M] (one
    pool shared by the rows); excluded: None for each row's own draws, or bool [B, M] for a pool:
    draw j is a known item of row b's user and drops out of that row's loss. log_expected: None, or
    float [M], the log of how many times each pool entry is expected among the draws (the logQ
    correction, :meth:`logsumexp_over_negatives`); log_expected_positive: float [B], the same of
    each row's positive, for a loss whose positive sits in its own denominator; backend: whose
    ``masked_logsumexp`` reduces the negatives.
    """

    positive: torch.Tensor
    negative: torch.Tensor
    excluded: Optional[torch.Tensor] = None
    log_expected: Optional[torch.Tensor] = None
    log_expected_positive: Optional[torch.Tensor] = None
    backend: str = "auto"

    def logsumexp_over_negatives(self, logits: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """float [B]: log sum_j exp(scale logits[b, j] - log_expected[j]) over row b's negatives (the
        entries not excluded); -inf for a row with none. ``logits``: float [B, K or M], a loss's
        function of ``negative`` (``scale`` multiplies it inside the one pass of the backend's
        ``masked_logsumexp``: a temperature's division costs no pass of its own)."""
        impl = backends.select(self.backend, logits.device)
        return impl.masked_logsumexp(logits, scale, self.log_expected, self.excluded)


#: Up to this many item-table rows per draw, :func:`cosine_scores` normalises the whole table once
#: (``unit_rows``: a pass over its rows each way, and a second [I, d] gradient); above, it normalises
#: each gathered row inside the product (``gathered_dots(unit_table=True)``: a squared norm and a
#: backward share per draw). One CPU thread, B = 8192, K = 800 (bench/README.md, "Catalog scale"):
#: in the product, 100k items took 1.16x as long and 2M items 0.72x; from those two, the costs cross
#: near one row per 29 draws (an estimate, not measured there).
TABLE_ROWS_PER_DRAW_TO_NORMALISE_ONCE = 1 / 32


def cosine_scores(user_rows: torch.Tensor, item_table: torch.Tensor, pos_items: torch.Tensor,
                  neg_items: torch.Tensor, known_in_pool: Optional[torch.Tensor] = None,
                  backend: str = "auto") -> CosineScores:
    """The cosines of each row's user with its positive and its negatives.

    Args:
        user_rows: float [B, d]; item_table: float [I, d], same dtype and device (neither normalised).
        pos_items: int [B]. neg_items: int [B, K], each row's own draws, scored by ``gathered_dots``
            (nothing of size [B, K, d] is built) against the unit table or, on a catalog large for
            the draws (:data:`TABLE_ROWS_PER_DRAW_TO_NORMALISE_ONCE`), with the positive in one call
            that normalises each row it reads; or int [M], one pool shared by the batch, scored as
            one product [B, d] x [d, M] of the B + M unit rows it reads.
        known_in_pool: bool [B, M], with a pool only: which draws are known items of the row's user.
        backend: whose ``unit_rows`` and ``gathered_dots`` compute.
    """
    impl = backends.select(backend, user_rows.device)
    user_unit = impl.unit_rows(user_rows)
    if neg_items.dim() == 1:
        # one gather of the positives and the pool, one normalisation: each gather of a dense table
        # costs a dense [I, d] gradient to allocate and fill, which a second would double
        rows = impl.unit_rows(item_table.index_select(0, torch.cat([pos_items, neg_items])))
        pos_unit, pool_unit = rows[:pos_items.numel()], rows[pos_items.numel():]
        return CosineScores((user_unit * pos_unit).sum(dim=-1), user_unit @ pool_unit.T, known_in_pool, backend=backend)
    if item_table.shape[0] <= neg_items.numel() * TABLE_ROWS_PER_DRAW_TO_NORMALISE_ONCE:
        item_unit = impl.unit_rows(item_table)
        positive = (user_unit * item_unit.index_select(0, pos_items)).sum(dim=-1)
        return CosineScores(positive, impl.gathered_dots(user_unit, item_unit, neg_items), backend=backend)
    # one call for the positive and the draws: a second would add a second dense [I, d] gradient
    cosines = impl.gathered_dots(user_unit, item_table, torch.cat([pos_items[:, None], neg_items], 1), unit_table=True)
    return CosineScores(cosines[:, 0], cosines[:, 1:], backend=backend)


def softmax_row_losses(scores: CosineScores, temperature: float) -> torch.Tensor:
    """float [B]: SL's term of each row, ``-log( exp s_p / (exp s_p + sum_j exp s_j) )`` with
    s = cos / temperature: the positive sits in its own denominator (with the logQ correction, every
    logit there less the log of its expected count)."""
    return _softmax_terms(scores, scores.negative, 1 / temperature, temperature)


def _softmax_terms(scores: CosineScores, neg_values: torch.Tensor, neg_scale: float, temperature: float) -> torch.Tensor:
    """SL's row terms with the negatives' logits ``neg_scale * neg_values`` (float [B, K or M])."""
    pos_logit = scores.positive / temperature
    if scores.log_expected_positive is not None:
        pos_logit = pos_logit - scores.log_expected_positive
    # log of the denominator without forming [B, K + 1]: the positive joins the negatives' logsumexp
    return torch.logaddexp(pos_logit, scores.logsumexp_over_negatives(neg_values, neg_scale)) - pos_logit


def shared_pool_softmax_loss(user_rows: torch.Tensor, item_table: torch.Tensor, pos_items: torch.Tensor,
                             pool: torch.Tensor, known_in_pool: torch.Tensor, temperature: float,
                             backend: str = "auto") -> torch.Tensor:
    """The mean SL of the rows against one pool of negatives shared by the batch, from cosine scores:
    ``-log( exp s(u, p) / (exp s(u, p) + sum_{j in pool, not known to u} exp s(u, j)) )``.

    One product scores the pool, [B, d] x [d, M], and only the B + M rows the step reads are
    normalised, never the whole table.

    Args:
        user_rows: float [B, d]; item_table: float [I, d] (not normalised); pos_items: int [B];
        pool: int [M], the shared draws; known_in_pool: bool [B, M], whether draw j is a known item
            of row b's user (masked out of the row's denominator); temperature: tau > 0;
        backend: whose ``unit_rows`` normalises.
    Returns:
        0-dim tensor of ``user_rows``' dtype.
    """
    scores = cosine_scores(user_rows, item_table, pos_items, pool, known_in_pool, backend)
    return softmax_row_losses(scores, temperature).mean()


def sampled_softmax_loss(user_rows: torch.Tensor, item_table: torch.Tensor, pos_items: torch.Tensor,
                         neg_items: torch.Tensor, temperature: float, backend: str = "auto",
                         neutral_weight: float = 1.0, num_negative=None, neutral_top: int = 0) -> torch.Tensor:
    """The mean SL of the rows against their negatives, from cosine scores.

    With ``neutral_weight`` below 1, PNN's classes inside the softmax: each row's ``num_negative``
    lowest-scored negatives (the reliable negatives) keep weight 1 in the denominator, the others
    (the neutral class) weigh ``neutral_weight``: ``sum_j w_j exp s(u, n_j)``.  With ``neutral_top``
    above 0 the neutral class is instead each row's ``neutral_top`` highest-scored negatives, where
    the false negatives are (docs/why-pnn.md), and every other negative keeps weight 1.

    Args:
        user_rows: float [B, d], the batch's user embeddings (not normalised).
        item_table: float [I, d], same dtype and device, the model's item embeddings (not normalised).
        pos_items: int [B], each row's positive.
        neg_items: int [B, K], each row's sampled negatives.
        temperature: tau > 0, divides every cosine.
        backend: "auto", "reference", "cpu" or "cuda": whose ``unit_rows`` and ``gathered_dots`` make the cosines.
        neutral_weight: in (0, 1]; num_negative: int64 [B], the negative class sizes (needed when
            neutral_weight < 1 and neutral_top is 0); neutral_top: in [0, K), 0 for PNN's classes.
    Returns:
        0-dim tensor of ``user_rows``' dtype, differentiable w.r.t. both embeddings.
    """
    scores = cosine_scores(user_rows, item_table, pos_items, neg_items, backend=backend)
    return _neutral_weighted(scores, backends.select(backend, user_rows.device), temperature, neutral_weight,
                             num_negative, neutral_top).mean()


def _neutral_weighted(scores: CosineScores, impl, temperature: float, neutral_weight: float, num_negative,
                      neutral_top: int) -> torch.Tensor:
    """float [B]: SL's row terms, with PNN's neutral class down-weighted (:func:`sampled_softmax_loss`)."""
    if neutral_weight == 1.0:
        return softmax_row_losses(scores, temperature)
    neg_logits = scores.negative / temperature
    if neutral_top:  # the neutral_top highest of a row (equal scores: the first by position)
        sizes = torch.full((neg_logits.shape[0],), neutral_top, dtype=torch.int64, device=neg_logits.device)
        neutral = impl.lowest_k_mask(-neg_logits.detach(), sizes)
    else:  # the num_negative lowest of a row (equal scores: the first by position) are the negative class
        neutral = ~impl.lowest_k_mask(neg_logits.detach(), num_negative)
    # a weight w in the denominator is log w added to the logit
    neg_logits = neg_logits + neutral.to(neg_logits.dtype) * math.log(neutral_weight)
    return _softmax_terms(scores, neg_logits, 1.0, temperature)


class SampledCosineLoss(_ChecksInputs, nn.Module):
    """What the sampled losses over cosines share (SL and its successors, :mod:`pnn_fast.softmax_losses`):
    the checks, the draws (each row's own ``num_negatives`` uniform unknown items, or one pool of
    ``num_negatives`` catalog items shared by the batch), the sparse gather and the cosines. A
    subclass writes :meth:`row_losses`, the loss of each row from its :class:`CosineScores`.

    Mixed negatives (Yang et al., "Mixed Negative Sampling for Learning Two-tower Neural Networks in
    Recommendations", WWW 2020): with ``in_batch_negatives`` the batch's positives (every rank's under
    torchrun) join the shared pool as negatives of every row, each row's known items (its own
    positive among them) left out. With ``logq`` every logit of the softmax, the positive's and the
    negatives', is less the log of that item's expected count among the draws, ``B p_j + M / I``
    (p_j its share of the training pairs, M the pool, I the catalog): the sampling-probability
    correction of TensorFlow's sampled softmax and of TFRS, for the mixture.

    forward(user_emb [B, d], item_table [I, d], users int [B], pos_items int [B], neg_items=None,
    generator=None) -> 0-dim tensor of user_emb's dtype, the mean of :meth:`row_losses`.  ``neg_items``
    int [B, K]: the draws, unknown items of their rows; or int [M], one pool shared by every row (its
    known items masked per row); None draws them (:meth:`sample_negatives`) from ``generator``.
    """

    def __init__(self, known: KnownPositives, num_negatives: int, shared_negatives: bool, in_batch_negatives: bool,
                 logq: bool, backend: str, validate: Union[str, bool], sparse: bool):
        super().__init__()
        if not isinstance(known, KnownPositives):
            raise TypeError(f"known must be a KnownPositives, got {type(known).__name__}")
        self.known = known
        self.num_negatives = check_int("num_negatives", num_negatives, 1)
        for name, value in (("shared_negatives", shared_negatives), ("in_batch_negatives", in_batch_negatives),
                            ("logq", logq)):
            check_bool(name, value)
        if in_batch_negatives and not shared_negatives:
            raise ValueError("in_batch_negatives mixes the batch's positives with one uniform pool shared by the "
                             "batch: it needs shared_negatives=True")
        if logq and not in_batch_negatives:
            raise ValueError("logq corrects for the in-batch negatives' popularity: it needs in_batch_negatives=True")
        self.shared_negatives, self.in_batch_negatives, self.logq = shared_negatives, in_batch_negatives, logq
        # logQ: how often each item is a training positive, a one-off [I] count moved to the device once
        self._item_counts = torch.bincount(known.indices, minlength=known.num_items).double() if logq else None
        self.backend = backends.check_name(backend)
        self.validate = check_validate(validate)
        self.sparse = check_bool("sparse", sparse)

    def sample_negatives(self, users: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """int64 [B, num_negatives]: uniform draws, with replacement, from each user's unknown items; with
        ``shared_negatives``, int64 [num_negatives]: one pool drawn uniformly from the whole catalog."""
        self.known = self.known.to(users.device)  # no copy when already there
        if self.shared_negatives:
            return torch.randint(0, self.known.num_items, (self.num_negatives,), generator=generator,
                                 device=users.device)
        return sample_unknown(self.known, users, self.num_negatives, generator, backend=self.backend)

    #: the subclass's own arguments, shown first by :meth:`extra_repr`
    OWN_ARGUMENTS: Tuple[str, ...] = ()

    def extra_repr(self) -> str:
        names = ("num_negatives", *self.OWN_ARGUMENTS, "shared_negatives", "in_batch_negatives", "logq", "backend",
                 "sparse")
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in names)

    def row_losses(self, users: torch.Tensor, scores: CosineScores) -> torch.Tensor:
        """float [B]: each row's loss from its cosines."""
        raise NotImplementedError

    def forward(self, user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                pos_items: torch.Tensor, neg_items: Optional[torch.Tensor] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
        require_tensor("user_emb", user_emb)
        dim = user_emb.shape[-1] if user_emb.dim() == 2 else -1
        op = type(self).__name__
        users, pos_items, neg_items, _ = validate_batch(self.known, dim, user_emb, item_table, users, pos_items, neg_items,
                                                        None, self.validate, whole_table=not self.sparse,
                                                        op=op, shared_pool=True)
        self.known = self.known.to(user_emb.device)  # no copy when already there
        if neg_items is None:
            neg_items = self.sample_negatives(users, generator)
        self.check_draws(neg_items)
        known_in_pool = log_expected = None
        if self.in_batch_negatives:
            if neg_items.dim() != 1:
                raise ValueError(f"in_batch_negatives adds the batch's positives to one pool shared by the rows: "
                                 f"neg_items must be a pool [M], got shape {list(neg_items.shape)}")
            in_batch = gather_ids(pos_items)  # every rank's positives under torchrun
            if self.logq:
                log_expected = self._log_expected_counts(in_batch.numel(), neg_items.numel(), item_table.dtype)
            neg_items = torch.cat([in_batch, neg_items])
        if neg_items.dim() == 1:
            # each row's binary search in its user's known items (a global search of B x M keys was
            # three quarters of the step at B = 8192)
            impl = backends.select(self.backend, user_emb.device)
            known_in_pool = impl.rows_contain(self.known, users, neg_items.expand(users.numel(), -1))
        # the corrections are read by the original ids, before sparse=True renames them
        corrections = (log_expected(neg_items), log_expected(pos_items)) if log_expected else (None, None)
        if self.sparse:
            item_table, (pos_items, neg_items), _ = _compact(item_table, [pos_items, neg_items], self.validate == "eager")
        scores = cosine_scores(user_emb, item_table, pos_items, neg_items, known_in_pool, self.backend)
        scores = scores._replace(log_expected=corrections[0], log_expected_positive=corrections[1])
        return self.row_losses(users, scores).mean()

    def _log_expected_counts(self, in_batch: int, pool: int, dtype: torch.dtype):
        """ids -> log of each item's expected count among the draws: ``in_batch`` positives drawn as
        the training pairs are (an item in proportion to its pairs) and ``pool`` uniform items."""
        counts = self._item_counts = self._item_counts.to(self.known.indices.device)
        per_pair, uniform = in_batch / self.known.indices.numel(), pool / self.known.num_items
        # the rates of the step's ids only: a rate for every item would be a catalog-sized pass a step
        return lambda ids: (counts.index_select(0, ids) * per_pair + uniform).log().to(dtype)

    def check_draws(self, neg_items: torch.Tensor) -> None:
        """Refuse draws this loss cannot use (a subclass's rule); the base takes any."""


class SampledSoftmaxLoss(SampledCosineLoss):
    """Sampled softmax, SL (Wu et al., ACM TOIS 2024): each row's positive against ``num_negatives``
    items drawn uniformly, with replacement, from the user's unknown items, over cosine scores
    divided by ``temperature`` (semantics: :func:`sampled_softmax_loss`, docs/baselines/sl.md).
    Rank with cosines too: score with the L2-normalised user and item tables.

    Args:
        known: each user's training items (:class:`KnownPositives`); the draws come from the others.
        num_negatives: K, the draws per row (>= 1; the published runs' 800).
        temperature: tau (finite, > 0; the published 0.1). It decides SL's standing: choose it on
            valid (docs/why-pnn.md: 0.2 on ML-1M, 0.1 on Gowalla).
        neutral_weight: in (0, 1]; below 1, PNN's classes inside the softmax (ours, not published):
            each row's lowest-scored draws keep weight 1 in the denominator, the others weigh this.
        neg_size: how many draws keep weight 1, by PNN's rule ("proportional", the default, "count"
            or an int below K); only with ``neutral_weight`` below 1 and ``neutral_top`` 0.
        neutral_top: m in [0, K); above 0 the neutral class is instead each row's m highest-scored
            draws (needs ``neutral_weight`` below 1).
        shared_negatives: a call without ``neg_items`` draws one pool of ``num_negatives`` items,
            uniformly with replacement from the whole catalog, shared by the batch's rows
            (:func:`shared_pool_softmax_loss`: one matrix product, each row's known items masked
            out), in place of each row's own draws from its unknown items. Not with PNN's classes.
        in_batch_negatives: the batch's positives join the shared pool (mixed negatives, with
            ``shared_negatives``); logq: the sampling-probability correction of that mix
            (:class:`SampledCosineLoss`).
        backend, validate, sparse: as :class:`PNNLoss`.

    forward(user_emb [B, d], item_table [I, d], users int [B], pos_items int [B], neg_items=None,
    generator=None) -> 0-dim tensor of user_emb's dtype, the mean over rows.  ``neg_items`` int [B, K]:
    the draws, unknown items of their rows (PNN's class sizes count them all as unlabeled); or int [M],
    one pool shared by every row (its known items masked per row); None draws them
    (:meth:`sample_negatives`) from ``generator`` (the global one when None).
    """

    OWN_ARGUMENTS = ("temperature", "neutral_weight", "neg_size", "neutral_top")

    def __init__(self, known: KnownPositives, *, num_negatives: int = 800, temperature: float = 0.1,
                 neutral_weight: float = 1.0, neg_size: Union[str, int, None] = None, neutral_top: int = 0,
                 shared_negatives: bool = False, in_batch_negatives: bool = False, logq: bool = False,
                 backend: str = "auto", validate: Union[str, bool] = "deferred", sparse: bool = False):
        super().__init__(known, num_negatives, shared_negatives, in_batch_negatives, logq, backend, validate, sparse)
        self.temperature = check_real("temperature", temperature, low_open=True)
        self.neutral_weight = check_real("neutral_weight", neutral_weight, high=1.0, low_open=True)
        # at least one draw of a row stays outside the neutral class, at full weight
        self.neutral_top = check_int("neutral_top", neutral_top, 0)
        if self.neutral_top >= num_negatives:
            raise ValueError(f"neutral_top must be below num_negatives={num_negatives}, got {neutral_top!r}")
        if self.neutral_top and self.neutral_weight == 1:  # a neutral class of weight 1 is no class
            raise ValueError(f"neutral_top={neutral_top} needs a neutral_weight below 1, got {neutral_weight!r}")
        if neg_size is not None:
            neg_size = check_neg_size(neg_size, self.num_negatives, "num_negatives")
        # PNN's size rule places PNN's classes only: given where they are off, it would do nothing
        self.pnn_classes = self.neutral_weight != 1 and not self.neutral_top
        if neg_size is not None and not self.pnn_classes:
            raise ValueError(f"neg_size={neg_size!r} sizes PNN's negative class, which needs a neutral_weight "
                             f"below 1 and neutral_top 0; got neutral_weight={neutral_weight!r}, neutral_top={neutral_top!r}")
        self.neg_size = "proportional" if neg_size is None else neg_size
        if shared_negatives and self.neutral_weight != 1:
            raise ValueError("shared_negatives draws one pool for the batch; PNN's classes (neutral_weight below 1) "
                             "are sized per row from each row's own draws")


    def negative_class_sizes(self, users: torch.Tensor, num_draws: Optional[int] = None) -> torch.Tensor:
        """int64 [B]: k_b, each row's count of lowest-scored draws that keep weight 1 under PNN's rule
        (``neg_size``), of ``num_draws`` (``num_negatives`` when None), every one unlabeled."""
        unlabeled = torch.full_like(users, self.num_negatives if num_draws is None else num_draws, dtype=torch.int64)
        return negative_class_size(unlabeled, self.known.count(users), self.known.num_items, self.neg_size)

    def check_draws(self, neg_items: torch.Tensor) -> None:
        if neg_items.dim() == 1 and self.neutral_weight != 1:
            raise ValueError("neg_items [M] is a shared pool; PNN's classes (neutral_weight below 1) need each "
                             "row's own draws [B, K]")
        if neg_items.dim() == 2 and self.neutral_top >= neg_items.shape[1]:  # one draw a row stays outside the neutral class
            raise ValueError(f"neutral_top={self.neutral_top} needs more draws a row than neg_items' "
                             f"{neg_items.shape[1]}")

    def row_losses(self, users: torch.Tensor, scores: CosineScores) -> torch.Tensor:
        """float [B]: SL's term of each row (:func:`sampled_softmax_loss`)."""
        num_negative = self.negative_class_sizes(users, scores.negative.shape[1]) if self.pnn_classes else None
        return _neutral_weighted(scores, backends.select(self.backend, scores.positive.device), self.temperature,
                                 self.neutral_weight, num_negative, self.neutral_top)
