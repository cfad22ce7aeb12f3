"""MixGCF (Huang et al., "MixGCF: An Improved Training Method for Graph Neural Network-based
Recommender Systems", KDD 2021) as a training objective; see docs/baselines/mixgcf.md.

For a training pair ``(u, i)`` and each of ``K`` negatives, ``n_negs`` candidate items are
drawn uniformly among the user's unknown items. On every layer ``l`` of the model:

* positive mixing: ``e'_m(l) = a_l * e_i(l) + (1 - a_l) * e_m(l)``, ``a_l ~ U(0, 1)`` drawn
  per row, negative and layer (shared by the candidates, as the official code);
* hop mixing: keep the candidate with the largest ``q_u(l) . e'_m(l)``, where the query
  ``q_u(l)`` is the user's pooled embedding for mean pooling and the user's layer-l
  embedding for concat pooling;

the kept layers are pooled as the model pools (LightGCN/SGL: mean; NGCF: concat) into the
synthetic negative ``e_n``; the loss is ``mean_b log(1 + sum_k exp(e_u . e_n_k - e_u . e_i))``
(BPR for the default K = 1). Gradients reach the positive and the chosen candidates through
the mixture, not the argmax.

Models: LightGCN and SGL through :meth:`LightGCN.layer_embeddings`; NGCF by splitting its
concatenated table back into layers; any other model (MF) as one layer ``[E_0]``, where hop
mixing reduces to picking the best positive-mixed candidate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models import NGCF
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register


def model_layers(model) -> tuple[list[torch.Tensor], list[torch.Tensor], str]:
    """(user layers, item layers, pooling): the per-layer tables ``[U, d_l]`` / ``[I, d_l]``
    whose pooling (``"mean"`` or ``"concat"``) gives ``model.embeddings()``."""
    if hasattr(model, "layer_embeddings"):
        layers = model.layer_embeddings()
        return [x[: model.num_users] for x in layers], [x[model.num_users:] for x in layers], "mean"
    user_table, item_table = model.embeddings()
    if isinstance(model, NGCF):
        widths = [model.embedding_size] + list(model.hidden_size_list)
        return list(user_table.split(widths, dim=1)), list(item_table.split(widths, dim=1)), "concat"
    return [user_table], [item_table], "mean"


def pool_layers(layers: list[torch.Tensor], pool: str) -> torch.Tensor:
    """Mean (summed in layer order, then divided, as LightGCN) or concatenation along the last dim."""
    if pool == "concat":
        return torch.cat(layers, dim=-1)
    total = layers[0]
    for layer in layers[1:]:
        total = total + layer
    return total / len(layers)


def synthesize_negatives(user_layers: list[torch.Tensor], item_layers: list[torch.Tensor], pool: str,
                         users: torch.Tensor, pos_items: torch.Tensor, candidates: torch.Tensor,
                         alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MixGCF's synthetic negatives.

    Args:
        user_layers, item_layers: L+1 tables each, [U, d_l] and [I, d_l]; pool: "mean" | "concat".
        users, pos_items: int64 [B]; candidates: int64 [B, K, M]; alpha: [B, K, L+1] in [0, 1).
    Returns:
        (negatives [B, K, D] pooled like the model's tables, layer-0 choices int64 [B, K]).
    """
    pooled_user = pool_layers([layer[users] for layer in user_layers], pool) if pool == "mean" else None
    chosen, first_choice = [], None
    for depth, (user_layer, item_layer) in enumerate(zip(user_layers, item_layers)):
        query = pooled_user if pool == "mean" else user_layer[users]  # [B, d_l]
        weight = alpha[..., depth:depth + 1]  # [B, K, 1]
        positive = item_layer[pos_items]  # [B, d_l]
        with torch.no_grad():
            pos_score = (query * positive).sum(-1)[:, None, None]
            cand_score = torch.einsum("bd,bkmd->bkm", query, item_layer[candidates])
            best = (weight * pos_score + (1 - weight) * cand_score).argmax(dim=-1)  # [B, K]
            picked = candidates.gather(-1, best[..., None]).squeeze(-1)
        if first_choice is None:
            first_choice = picked
        chosen.append(weight * positive[:, None, :] + (1 - weight) * item_layer[picked])
    return pool_layers(chosen, pool), first_choice


def mixgcf_loss(user_rows: torch.Tensor, pos_rows: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """``mean_b log(1 + sum_k exp(s_neg_bk - s_pos_b))``: user_rows, pos_rows [B, D], negatives [B, K, D]."""
    pos = (user_rows * pos_rows).sum(-1)
    neg = torch.einsum("bd,bkd->bk", user_rows, negatives)
    return F.softplus(torch.logsumexp(neg - pos[:, None], dim=1)).mean()


@register("mixgcf")
class MixGCFObjective(Objective):
    """BPR (K-pair for K > 1) against MixGCF's synthetic hard negatives."""

    DEFAULTS = {
        "n_negs": 64,  # candidates per negative: utils/parser.py default; README yelp2018 command
                       # (the README uses 32 for Alibaba, 16 for Amazon with LightGCN)
        "K": 1,        # negatives per pair in the K-pair loss: parser.py default and every README command
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        for name in ("n_negs", "K"):
            value = self.args[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"mixgcf: {name} must be an int >= 1, got {value!r}")

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        users, pos_items = users.long(), pos_items.long()
        k, m = self.args["K"], self.args["n_negs"]
        user_layers, item_layers, pool = model_layers(model)
        candidates = sample_unknown(self.known, users, k * m, generator).view(-1, k, m)
        alpha = torch.rand(users.numel(), k, len(user_layers), generator=generator, device=users.device,
                           dtype=user_layers[0].dtype)
        negatives, first_choice = synthesize_negatives(user_layers, item_layers, pool, users, pos_items,
                                                       candidates, alpha)
        user_rows = pool_layers([layer[users] for layer in user_layers], pool)
        pos_rows = pool_layers([layer[pos_items] for layer in item_layers], pool)
        loss = mixgcf_loss(user_rows, pos_rows, negatives)
        return BatchLoss(loss, users, pos_items, first_choice)
