"""Typed wrappers over the fused kernels ``torch.ops.pnn_fast.*``, their fake (meta)
implementations and their autograd.

Shapes: ``B`` rows, ``C`` candidates, ``d`` embedding size, ``I`` items.  Candidates are int
``[C]`` shared by every row (in-batch mode) or ``[B, C]`` per row (sampled mode); ids may be
int32 or int64.  Embeddings are float16, bfloat16, float32 or float64 (the kernels accumulate
float16/bfloat16 in float32).  Non-contiguous inputs are accepted.

Per row ``b`` with user ``u`` and positive ``i``, ``U_b`` is the set of candidate indices ``j``
whose item is neither ``i`` nor a known positive of ``u``; ``s_j`` is ``<user_emb[b], item_table[c_j]>``.
No op allocates anything of size ``[B, C]``.

The table-lookup ops of a training step (:func:`unknown_items`, :func:`history_sample`, :func:`embedding_bpr`,
:func:`gathered_norm`, :func:`gathered_dots`) take whole embedding tables and ids, and return dense
table gradients.
"""
from __future__ import annotations

import torch

from . import _extension
from ._checks import check_same
from .known import KnownPositives

if not _extension.build_info()["compiled"]:
    raise ImportError(f"pnn_fast.ops needs the compiled kernels: {_extension.build_info()['reason']}")

_OPS = torch.ops.pnn_fast


def _opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_args(user_emb, item_table, users, pos_items, candidates, known: KnownPositives) -> tuple:
    """Device/dtype checks; the positional arguments every per-row op starts with."""
    _extension.require_kernels(user_emb.device)
    check_same("user_emb", user_emb, [("item_table", item_table)], dtype=True)
    check_same("user_emb", user_emb, [("users", users), ("pos_items", pos_items), ("candidates", candidates),
                                      ("known", known.indptr)], dtype=False)
    return (user_emb, item_table, users.long(), pos_items.long(), candidates.long(), known.indptr, known.indices)


def hard_negative_argmax(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor,
                         pos_items: torch.Tensor, candidates: torch.Tensor,
                         known: KnownPositives) -> tuple[torch.Tensor, torch.Tensor]:
    """The hardest unlabeled candidate of each row: ``argmax_{j in U_b} s_j``.

    Args:
        user_emb: float [B, d]; item_table: float [I, d], same dtype; users, pos_items: int [B];
        candidates: int [C] or [B, C]; known: the users' known positives (same device).
    Returns:
        ``(hard, num_unlabeled)``, both int64 [B]: the candidate index (smallest on ties, -1
        when ``U_b`` is empty) and ``|U_b|``.  Not differentiable.
    """
    args = _row_args(user_emb.detach(), item_table.detach(), users, pos_items, candidates, known)
    return _OPS.hard_negative_argmax.default(*args)


def count_unlabeled(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                    candidates: torch.Tensor, known: KnownPositives) -> torch.Tensor:
    """``|U_b|`` of each row, without scoring (much cheaper than :func:`hard_negative_argmax`).

    Args: as :func:`hard_negative_argmax` (the embeddings only fix the device and the checks).
    Returns: int64 [B].
    """
    args = _row_args(user_emb.detach(), item_table.detach(), users, pos_items, candidates, known)
    return _OPS.count_unlabeled.default(*args)


def bottom_k_select(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                    candidates: torch.Tensor, known: KnownPositives,
                    k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k[b]`` lowest-scored members of ``U_b`` (ties: smallest ``j``), as per-row state.

    Args: as :func:`hard_negative_argmax`, plus ``k``: int64 [B], clamped to ``[0, |U_b|]``.
    Returns:
        ``(threshold, cutoff)``: float [B] (float64 for float64 inputs, float32 otherwise) and
        int64 [B].  Candidate ``j`` of ``U_b`` is selected iff ``(s_j, j) <= (threshold, cutoff)``
        lexicographically, in torch.sort's order of scores (NaN above +inf, -0.0 == 0.0);
        ``cutoff`` is -1 and ``threshold`` -inf when nothing is selected.  Not differentiable.
    """
    args = _row_args(user_emb.detach(), item_table.detach(), users, pos_items, candidates, known)
    return _OPS.bottom_k_select.default(*args, k.long())


def class_centroids(user_emb: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                    candidates: torch.Tensor, known: KnownPositives, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Mean item embedding of each row's neutral and negative class.

    The negative class is the :func:`bottom_k_select` selection of ``k[b]`` members of ``U_b``
    (made in the same pass), the neutral class the rest of ``U_b``.

    Args: as :func:`hard_negative_argmax`, plus ``k``: int64 [B].
    Returns:
        ``(neutral, negative, num_neutral, num_negative, threshold, cutoff, hard)``: float [B, d]
        in user_emb's dtype (zero rows for empty classes), int64 [B] class sizes, the selection
        state of :func:`bottom_k_select` and, from the same scores, the hard negative of
        :func:`hard_negative_argmax` (so that PNN scores each row once in its forward pass).
        Differentiable w.r.t. ``item_table``; class membership is piecewise constant, so there
        is no gradient w.r.t. ``user_emb``.  The backward recomputes membership from
        ``(threshold, cutoff)``, never from a stored mask.
    """
    args = _row_args(user_emb.detach(), item_table, users, pos_items, candidates, known)
    return _OPS.class_centroids_fwd.default(*args, k.long())


def pairwise_uniformity(x: torch.Tensor, t: float) -> torch.Tensor:
    """``log( mean_{i != j} exp(-t ||x_i - x_j||^2) )`` over ordered pairs of rows; 0 when n < 2.

    Args:
        x: float [n, d]; t: the temperature.
    Returns:
        0-dim tensor of x's dtype, differentiable w.r.t. ``x``.  Forward and backward use O(n d)
        memory and a log-sum-exp, so any scale of ``x`` is safe.
    """
    _extension.require_kernels(x.device)
    return _OPS.pairwise_uniformity_fwd.default(x, float(t))


def unknown_items(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Uniform draws mapped to unknown items: the ``floor(u * (I - N_u))``-th (0-based) item that is
    not a known positive of ``users[b]``, for each ``u = uniform[b, k]``.

    Args:
        known: the users' known positives (same device); users: int [B];
        uniform: float32 [B, K] in ``[0, 1)`` (checked; each user needs an unknown item).
    Returns:
        int64 [B, K].  One binary search in the user's CSR row per entry; not differentiable.
    """
    _extension.require_kernels(users.device)
    check_same("users", users, [("uniform", uniform), ("known", known.indptr)], dtype=False)
    return _OPS.unknown_items.default(known.indptr, known.indices, users.long(), uniform, known.num_items)


def history_sample(known: KnownPositives, users: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A uniform random subset of min(N_u, L) known items of each ``users[b]``, by Floyd's algorithm
    on the draws ``uniform[b]`` (the same subsets as :func:`pnn_fast.reference.history_sample`).

    Args:
        known: the users' known positives (same device); users: int [B];
        uniform: float32 [B, L] in ``[0, 1)`` (checked).
    Returns:
        int64 [B, L]: the subset's items, then -1.  O(L^2) per row, whatever N_u; not differentiable.
    """
    _extension.require_kernels(users.device)
    check_same("users", users, [("uniform", uniform), ("known", known.indptr)], dtype=False)
    return _OPS.history_sample.default(known.indptr, known.indices, users.long(), uniform)


def embedding_bpr(user_table: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, pos_items: torch.Tensor,
                  neg_items: torch.Tensor, reg_weight: float = 0.0) -> torch.Tensor:
    """BPR over table rows: ``mean_{b,k} softplus(<U[u_b], I[n_bk]> - <U[u_b], I[p_b]>)``, plus
    ``reg_weight * (||U[users]||_F + ||I[pos_items]||_F + ||I[neg_items]||_F) / B``.

    Gathers, scores and scatters in one op each way: nothing of size [B, K, d] is built, and the
    L2 term (RecBole's EmbLoss of the three gathered matrices) costs no extra pass over the tables.

    Args:
        user_table: float [U, d]; item_table: float [I, d], same dtype; users, pos_items: int [B];
        neg_items: int [B, K]; reg_weight: finite, >= 0.
    Returns:
        0-dim tensor of the tables' dtype (NaN when B * K = 0, as ``torch.mean``), differentiable
        w.r.t. both tables.  The backward returns dense [U, d] and [I, d] gradients; on the CPU
        they are bit-identical for any thread count.
    """
    _extension.require_kernels(user_table.device)
    check_same("user_table", user_table, [("item_table", item_table)], dtype=True)
    check_same("user_table", user_table, [("users", users), ("pos_items", pos_items), ("neg_items", neg_items)],
               dtype=False)
    return _OPS.embedding_bpr_fwd.default(user_table, item_table, users.long(), pos_items.long(), neg_items.long(),
                                          float(reg_weight))[0]


def gathered_norm(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``||table[ids]||_F``: the Frobenius norm of the gathered rows (RecBole's EmbLoss term).

    Args: table: float [n, d]; ids: int [m].
    Returns: 0-dim tensor of table's dtype, differentiable w.r.t. ``table`` (gradient 0 at the origin).
    """
    _extension.require_kernels(table.device)
    check_same("table", table, [("ids", ids)], dtype=False)
    return _OPS.gathered_norm_fwd.default(table, ids.long().reshape(-1))


def gathered_dots(rows: torch.Tensor, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``out[b, k] = <rows[b], table[ids[b, k]]>`` without a [B, K, d] copy of the gathered rows.

    Args: rows: float [B, d]; table: float [n, d], same dtype; ids: int [B, K].
    Returns: [B, K] in rows' dtype, differentiable w.r.t. ``rows`` and ``table`` (dense [n, d] gradient).
    """
    _extension.require_kernels(rows.device)
    check_same("rows", rows, [("table", table)], dtype=True)
    check_same("rows", rows, [("ids", ids)], dtype=False)
    return _OPS.gathered_dots_fwd.default(rows, table, ids.long())


# ---- fake implementations (shapes and dtypes for torch.compile / meta tensors)

@torch.library.register_fake("pnn_fast::hard_negative_argmax")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices):
    rows = user_emb.shape[0]
    return users.new_empty(rows, dtype=torch.int64), users.new_empty(rows, dtype=torch.int64)


@torch.library.register_fake("pnn_fast::count_unlabeled")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices):
    return users.new_empty(user_emb.shape[0], dtype=torch.int64)


@torch.library.register_fake("pnn_fast::bottom_k_select")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices, k):
    rows = user_emb.shape[0]
    return user_emb.new_empty(rows, dtype=_opmath_dtype(user_emb.dtype)), users.new_empty(rows, dtype=torch.int64)


@torch.library.register_fake("pnn_fast::class_centroids_fwd")
def _(user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices, k):
    rows = user_emb.shape[0]
    counts = [users.new_empty(rows, dtype=torch.int64) for _ in range(4)]
    threshold = user_emb.new_empty(rows, dtype=_opmath_dtype(user_emb.dtype))
    return (torch.empty_like(user_emb), torch.empty_like(user_emb), counts[0], counts[1], threshold, counts[2],
            counts[3])


@torch.library.register_fake("pnn_fast::class_centroids_bwd")
def _(grad_neutral, grad_negative, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices,
      threshold, cutoff, num_neutral, num_negative):
    return item_table.new_empty(item_table.shape)


@torch.library.register_fake("pnn_fast::pairwise_uniformity_fwd")
def _(x, t):
    return x.new_empty(())


@torch.library.register_fake("pnn_fast::pairwise_uniformity_bwd")
def _(grad, x, t, output):
    return x.new_empty(x.shape)


@torch.library.register_fake("pnn_fast::unknown_items")
def _(known_indptr, known_indices, users, uniform, num_items):
    return uniform.new_empty(uniform.shape, dtype=torch.int64)


@torch.library.register_fake("pnn_fast::history_sample")
def _(known_indptr, known_indices, users, uniform):
    return uniform.new_empty(uniform.shape, dtype=torch.int64)


@torch.library.register_fake("pnn_fast::embedding_bpr_fwd")
def _(user_table, item_table, users, pos_items, neg_items, reg_weight):
    acc = _opmath_dtype(user_table.dtype)
    return user_table.new_empty(()), user_table.new_empty(neg_items.shape, dtype=acc), user_table.new_empty(3, dtype=acc)


@torch.library.register_fake("pnn_fast::embedding_bpr_bwd")
def _(grad, coef, norms, user_table, item_table, users, pos_items, neg_items, reg_weight):
    return user_table.new_empty(user_table.shape), item_table.new_empty(item_table.shape)


@torch.library.register_fake("pnn_fast::gathered_norm_fwd")
def _(table, ids):
    return table.new_empty(())


@torch.library.register_fake("pnn_fast::gathered_norm_bwd")
def _(grad, table, ids, output):
    return table.new_empty(table.shape)


@torch.library.register_fake("pnn_fast::gathered_dots_fwd")
def _(rows, table, ids):
    return rows.new_empty(rows.shape[0], ids.shape[1])


@torch.library.register_fake("pnn_fast::gathered_dots_bwd")
def _(grad, rows, table, ids):
    return rows.new_empty(rows.shape), table.new_empty(table.shape)


# ---- autograd: the backward ops are the only math; these functions just route tensors

def _centroids_setup_context(ctx, inputs, output):
    _, _, num_neutral, num_negative, threshold, cutoff, _ = output
    ctx.mark_non_differentiable(threshold)
    ctx.save_for_backward(*inputs[:7], threshold, cutoff, num_neutral, num_negative)


def _centroids_backward(ctx, grad_neutral, grad_negative, *_):
    grad_table = None
    if ctx.needs_input_grad[1]:
        grad_table = _OPS.class_centroids_bwd.default(grad_neutral, grad_negative, *ctx.saved_tensors)
    return (None, grad_table) + (None,) * 6


def _uniformity_setup_context(ctx, inputs, output):
    ctx.t = inputs[1]
    ctx.save_for_backward(inputs[0], output)


def _uniformity_backward(ctx, grad):
    x, output = ctx.saved_tensors
    return _OPS.pairwise_uniformity_bwd.default(grad, x, ctx.t, output), None


torch.library.register_autograd("pnn_fast::class_centroids_fwd", _centroids_backward,
                                setup_context=_centroids_setup_context)
torch.library.register_autograd("pnn_fast::pairwise_uniformity_fwd", _uniformity_backward,
                                setup_context=_uniformity_setup_context)


# embedding_bpr_fwd and gathered_norm_fwd: autograd in C++ (csrc/autograd.cpp), as they run on every
# BPR step, where the Python route would cost about a tenth of the step


def _dots_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _dots_backward(ctx, grad):
    grad_rows, grad_table = _OPS.gathered_dots_bwd.default(grad, *ctx.saved_tensors)
    return (grad_rows if ctx.needs_input_grad[0] else None, grad_table if ctx.needs_input_grad[1] else None, None)


torch.library.register_autograd("pnn_fast::gathered_dots_fwd", _dots_backward, setup_context=_dots_setup_context)
