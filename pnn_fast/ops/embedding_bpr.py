"""pnn_fast::embedding_bpr_fwd / _bwd: BPR (with RecBole's EmbLoss) straight from the embedding tables.

Its autograd is in C++ (csrc/autograd.cpp): it runs on every BPR step, where a Python autograd
node would cost about a tenth of the step."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ._common import OPS, opmath_dtype


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
    return OPS.embedding_bpr_fwd.default(user_table, item_table, users.long(), pos_items.long(), neg_items.long(),
                                          float(reg_weight))[0]


@torch.library.register_fake("pnn_fast::embedding_bpr_fwd")
def _(user_table, item_table, users, pos_items, neg_items, reg_weight):
    acc = opmath_dtype(user_table.dtype)
    return user_table.new_empty(()), user_table.new_empty(neg_items.shape, dtype=acc), user_table.new_empty(3, dtype=acc)


@torch.library.register_fake("pnn_fast::embedding_bpr_bwd")
def _(grad, coef, norms, user_table, item_table, users, pos_items, neg_items, reg_weight):
    return user_table.new_empty(user_table.shape), item_table.new_empty(item_table.shape)
