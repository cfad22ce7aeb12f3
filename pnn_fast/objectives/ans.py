"""ANS (Zhao et al., RecSys'23): augmented negative sampling, after the official ANS-Recbole code.

For a row (u, p) with M uniform unknown candidates n_1..n_M (embeddings e_u, e_p, e_k)::

    g_k      = sigmoid((W_i e_k + c_i) * (W_u e_u + c_u))                  (elementwise, in (0, 1)^d)
    hard_k   = g_k * e_k,      easy_k   = e_k - hard_k                 (negative's factors)
    phard_k  = g_k * e_p,      peasy_k  = e_p - phard_k                (positive, same gate)
    margin_k = sigmoid(1 / (w_m . (hard_k * phard_k) + c_m))
    easy'_k  = easy_k + sign(peasy_k - easy_k) * normalize(r_k) * margin_k * 0.1,  r_k ~ U[0,1)^d
    aug_k    = hard_k + easy'_k                                        (augmented negative)
    k*       = argmax_k [ s(u, aug_k) + eps * (s(u, aug_k) - s(u, e_k)) ]   (no gradient)

    loss = softplus(s(u, aug_k*) - s(u, e_p))                             BPR on the augmented negative
         + gamma * ( log(1 + sum_k exp(s(u, easy_k) - s(u, hard_k)))      contrastive (hard vs easy)
                   + mean_k ||hard_k - phard_k + 1e-6||                   hard factors close to the positive's
                   + mean_k ||peasy_k * easy_k|| )                        easy factors "orthogonal"

averaged over the batch, s(u, x) = e_u . x. Details, defaults and departures: docs/baselines/ans.md.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register

#: eps F.pairwise_distance adds to the difference (the official code calls it with the default)
PAIRWISE_EPS = 1e-6


def ans_terms(user: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, gate: torch.Tensor,
              margin_model: nn.Module, noise: torch.Tensor, eps: float, noise_scale: float):
    """The ANS quantities of a batch, given its gates and uniform noise.

    Args:
        user [B, d], pos [B, d], neg [B, M, d]: embeddings of the rows and their candidates.
        gate [B, M, d]: the hard-factor gate in (0, 1).
        margin_model: maps [..., d] -> [..., 1] (a Linear(d, 1)).
        noise [B, M, d]: U[0, 1) draws.
    Returns:
        dict with ``bpr`` (scalar), ``sns`` (scalar), ``distance`` (scalar), ``orth`` (scalar),
        ``choice`` (int64 [B]) and ``augmented`` ([B, M, d]).
    """
    n_hard = neg * gate
    n_easy = neg - n_hard
    p_hard = pos[:, None, :] * gate
    p_easy = pos[:, None, :] - p_hard
    distance = (n_hard - p_hard + PAIRWISE_EPS).norm(dim=-1).mean()
    orth = (p_easy * n_easy).norm(dim=-1).mean()
    margin = torch.sigmoid(1.0 / margin_model(n_hard * p_hard))                 # [B, M, 1]
    magnitude = F.normalize(noise, dim=-1) * margin * noise_scale
    augmented = n_hard + n_easy + torch.sign(p_easy - n_easy) * magnitude
    u = user[:, None, :]
    hard_scores, easy_scores = (u * n_hard).sum(-1), (u * n_easy).sum(-1)     # [B, M]
    aug_scores, raw_scores = (u * augmented).sum(-1), (u * neg).sum(-1)
    # log(1 + sum_k exp(x_k)) as a logsumexp with a zero logit (stable, same value)
    diff = easy_scores - hard_scores
    sns = torch.logsumexp(torch.cat([diff.new_zeros(diff.shape[0], 1), diff], dim=1), dim=1).mean()
    choice = (aug_scores + eps * (aug_scores - raw_scores)).argmax(dim=1).detach()
    chosen = augmented[torch.arange(augmented.shape[0], device=augmented.device), choice]
    bpr = F.softplus((user * chosen).sum(-1) - (user * pos).sum(-1)).mean()
    return {"bpr": bpr, "sns": sns, "distance": distance, "orth": orth, "choice": choice, "augmented": augmented}


@register("ans")
class ANSObjective(Objective):
    """ANS over ``candidates`` uniform unknown items per row.

    The official repository (Asa9aoTK/ANS-Recbole) ships the model but no configuration file;
    see docs/baselines/ans.md for where each default comes from.
    """

    DEFAULTS: ClassVar[dict] = {
        "candidates": 8,       # train_neg_sample_args.sample_num of the same authors' PNN-RecBole PNN.yaml
        "eps": 0.1,            # weight of the augmentation gain in the selection: no published value (ours)
        "gamma": 0.1,          # weight of sns + disentanglement losses: no published value (ours)
        "noise_scale": 0.1,    # the constant 0.1 in magnitude = normalize(noise) * margin * 0.1 (ans.py)
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        if int(self.args["candidates"]) <= 0:
            raise ValueError("ans: candidates must be positive")
        dim = model.dim
        # created after the model's xavier init in the official code, so torch's default init
        self.user_gate = nn.Linear(dim, dim)
        self.item_gate = nn.Linear(dim, dim)
        self.margin_model = nn.Linear(dim, 1)

    def gate(self, user: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        """sigmoid(item_gate(e_k) * user_gate(e_u)): [B, M, d]."""
        return torch.sigmoid(self.item_gate(neg) * self.user_gate(user)[:, None, :])

    def batch_terms(self, user_table, item_table, users, pos_items, neg_items, noise):
        user, pos, neg = user_table[users], item_table[pos_items], item_table[neg_items]
        return ans_terms(user, pos, neg, self.gate(user, neg), self.margin_model, noise,
                         float(self.args["eps"]), float(self.args["noise_scale"]))

    def combine(self, terms) -> torch.Tensor:
        return terms["bpr"] + float(self.args["gamma"]) * (terms["sns"] + terms["distance"] + terms["orth"])

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        neg = sample_unknown(self.known, users, int(self.args["candidates"]), generator)
        noise = torch.rand(*neg.shape, item_table.shape[1], generator=generator, device=item_table.device,
                           dtype=item_table.dtype)
        loss = self.combine(self.batch_terms(user_table, item_table, users, pos_items, neg, noise))
        # the official L2 covers the user, the positive and all M candidates
        return BatchLoss(loss, users, pos_items, neg)
