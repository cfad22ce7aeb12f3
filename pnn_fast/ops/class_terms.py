"""pnn_fast::class_terms_fwd / _bwd: L_rank and L_constrain of each row from its class centroids,
differentiable w.r.t. the four embeddings."""
from __future__ import annotations

import torch

from .. import _extension
from .._checks import check_same
from ..backends.rows import ClassTerms
from ._common import OPS


def class_terms(user_emb: torch.Tensor, pos_emb: torch.Tensor, neutral: torch.Tensor, negative: torch.Tensor,
                noise_pos: torch.Tensor, noise_neg: torch.Tensor, valid: torch.Tensor,
                num_negative: torch.Tensor) -> ClassTerms:
    """L_rank and L_constrain per row, as :func:`pnn_fast.backends.reference.class_terms` computes them.

    ``rank = softplus(<u, c_neu> - <u, p>) + [n_neg > 0] softplus(<u, c_neg> - <u, c_neu>)`` and
    ``constrain = || z_pos * normalize(p) - z_neg * normalize(c_neg) ||^2`` (F.normalize, eps 1e-12),
    the latter only where the row has a negative class; both 0 where the row is not ``valid``.

    Args:
        user_emb, pos_emb, neutral, negative: float [B, d] (u, p, c_neu, c_neg), one dtype;
        noise_pos, noise_neg: float [B, d] (z_pos, z_neg), same dtype, not differentiated;
        valid: bool [B] (|U_b| > 0); num_negative: int [B] (the negative class's size).
    Returns:
        :class:`~pnn_fast.backends.rows.ClassTerms` ``(rank, constrain)``: [B] in user_emb's dtype,
        differentiable w.r.t. ``user_emb``, ``pos_emb``, ``neutral`` and ``negative``; rows are
        independent, so every result is the same for any thread count.
    """
    _extension.require_kernels(user_emb.device)
    check_same("user_emb", user_emb, [("pos_emb", pos_emb), ("neutral", neutral), ("negative", negative),
                                      ("noise_pos", noise_pos), ("noise_neg", noise_neg)], dtype=True)
    check_same("user_emb", user_emb, [("valid", valid), ("num_negative", num_negative)], dtype=False)
    return ClassTerms(*OPS.class_terms_fwd.default(user_emb, pos_emb, neutral, negative, noise_pos, noise_neg,
                                                   valid.bool(), num_negative.long()))


@torch.library.register_fake("pnn_fast::class_terms_fwd")
def _(user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative):
    rows = user_emb.shape[0]
    return user_emb.new_empty(rows), user_emb.new_empty(rows)


@torch.library.register_fake("pnn_fast::class_terms_bwd")
def _(grad_rank, grad_constrain, user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative):
    return tuple(user_emb.new_empty(user_emb.shape) for _ in range(4))


def _terms_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _terms_backward(ctx, grad_rank, grad_constrain):
    grads = OPS.class_terms_bwd.default(grad_rank, grad_constrain, *ctx.saved_tensors)
    return tuple(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad[:4])) + (None,) * 4


torch.library.register_autograd("pnn_fast::class_terms_fwd", _terms_backward, setup_context=_terms_setup_context)
