"""PNN as the authors' released code computes it (RecBole model ``PNN``, recbole/model/general_recommender/pnn.py
of github.com/Asa9aoTK/PNN-RecBole), which differs from the paper's equations in every row of the
difference table in docs/semantics.md.  For reproducing their numbers and for testing the reading
that their method reduces to DNS (studies/reproduction.md); the paper's PNN is the ``pnn`` objective.

Per batch of B (user, positive) pairs with K uniform unknown candidates per row (their
``sample_num`` 8), scores s = <u, e>:

* hard negative: the highest-scored candidate; ``bpr`` = RecBole's BPRLoss against it (DNS's term);
* negative "class": the single lowest-scored candidate; neutral "centroid": the mean score over all
  K candidates, negatives included: ``rank`` = BPR(s_pos, mean_k s_k) + BPR(mean_k s_k, s_low);
* ``constrain``: two clamp noises n1, n2 per row (uniform in [0, 1)^d, scaled to norm 0.1) added to
  every candidate embedding; the squared distance between the normalised noisy copies, summed over
  the K candidates and averaged over rows and dimensions (it involves no class at all);
* ``uniform``: log mean_{b<c} exp(-2 ||m_b - m_c||^2) over the rows' mean normalised candidate
  m_b, halved;
* lambda: one per batch, sigmoid(mean_b (w . a_b + b0)) with a_b = gamma u_b + (1 - gamma) M h_b,
  h_b the user's history under an unconstrained tanh attention; it weights the BPR term:
  ``loss = lambda bpr + (1 - lambda) (rank + alpha constrain + beta uniform)``.

Defaults are their yaml's: a = 0.8 and b = 0.1 as alpha and beta (the code reads ``alpha`` and
``beta``, which the yaml does not set, so it does not run as committed), gamma 0.1, history 20,
8 candidates.  Two things follow this library rather than their RecBole setup: the history is the
first ``history_len`` of the user's known items in ascending item id (RecBole's
``history_item_matrix`` fills it in the dataset's row order), and the L2 term is the trainer's (its
EmbLoss covers the K candidates, as theirs does, at the trainer's weight rather than their 1e-5).
Padding: theirs masks the history slots whose embedding sums to zero (item 0's row, zeroed at
init); here the mask comes from each user's count of known items.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_int, check_real
from ..backends.rows import gather_rows
from ..known import KnownPositives
from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register

#: RecBole's BPRLoss adds this inside the log (-log(gamma + sigmoid(pos - neg)))
BPR_GAMMA = 1e-10


class AuthorsTerms(NamedTuple):
    """The terms of one batch: ``bpr``, ``rank``, ``constrain``, ``uniform``, ``lam`` (0-dim each)."""
    bpr: torch.Tensor
    rank: torch.Tensor
    constrain: torch.Tensor
    uniform: torch.Tensor
    lam: torch.Tensor


def recbole_bpr(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """RecBole's BPRLoss: mean of -log(1e-10 + sigmoid(pos - neg)) over the rows [B]."""
    return -torch.log(BPR_GAMMA + torch.sigmoid(pos - neg)).mean()


class AuthorsAttention(nn.Module):
    """Their batch lambda: sigmoid of the batch mean of a linear map of
    gamma u + (1 - gamma) M (sum_j w_j h_j), w = the history's exp(<tanh(W h_j + c), u>), normalised
    over the valid positions (no max subtracted, as theirs)."""

    def __init__(self, dim: int, gamma: float):
        super().__init__()
        self.gamma = gamma
        self.key = nn.Linear(dim, dim)
        self.ui_map = nn.Linear(dim, dim, bias=False)
        self.to_lambda = nn.Linear(dim, 1)
        for layer in (self.key, self.ui_map, self.to_lambda):  # RecBole's xavier_normal_initialization
            nn.init.xavier_normal_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, user_emb: torch.Tensor, history_emb: torch.Tensor, history_mask: torch.Tensor) -> torch.Tensor:
        """user_emb float [B, d], history_emb float [B, L, d], history_mask bool [B, L] -> 0-dim lambda."""
        logits = (torch.tanh(self.key(history_emb)) * user_emb[:, None, :]).sum(-1)  # [B, L]
        weights = torch.exp(logits) * history_mask
        weights = weights / (weights.sum(dim=1, keepdim=True) + 1e-10)
        history = self.ui_map((weights[:, :, None] * history_emb).sum(1))  # [B, d]
        mixed = self.gamma * user_emb + (1 - self.gamma) * history
        return torch.sigmoid(self.to_lambda(mixed).mean())


def authors_terms(user_emb: torch.Tensor, pos_emb: torch.Tensor, cand_emb: torch.Tensor,
                  noise: tuple, lam: torch.Tensor) -> AuthorsTerms:
    """The terms of their loss for user_emb, pos_emb float [B, d], cand_emb float [B, K, d], the
    two noises float [B, 1, d] (each row's vector of norm 0.1) and the batch lambda (0-dim)."""
    pos = (user_emb * pos_emb).sum(-1)  # [B]
    cand = (user_emb[:, None, :] * cand_emb).sum(-1)  # [B, K]
    hardest = cand.gather(1, cand.argmax(dim=1, keepdim=True).detach()).squeeze(1)
    lowest = cand.gather(1, cand.argmin(dim=1, keepdim=True).detach()).squeeze(1)
    mean_score = cand.mean(dim=1)
    rank = recbole_bpr(pos, mean_score) + recbole_bpr(mean_score, lowest)
    noisy = [F.normalize(cand_emb + n, dim=-1) for n in noise]
    constrain = (noisy[0] - noisy[1]).pow(2).sum(dim=1).mean()
    row_means = F.normalize(cand_emb, dim=-1).mean(dim=1)  # [B, d]
    uniform = torch.pdist(row_means, p=2).pow(2).mul(-2).exp().mean().log() / 2
    return AuthorsTerms(recbole_bpr(pos, hardest), rank, constrain, uniform, lam)


def authors_loss(terms: AuthorsTerms, alpha: float, beta: float) -> torch.Tensor:
    """lambda bpr + (1 - lambda) (rank + alpha constrain + beta uniform): lambda weights the BPR term."""
    return terms.lam * terms.bpr + (1 - terms.lam) * (terms.rank + alpha * terms.constrain + beta * terms.uniform)


def first_known(known: KnownPositives, users: torch.Tensor, length: int) -> tuple:
    """(items int64 [B, L], valid bool [B, L]): the first ``length`` known items of each user, in
    the CSR's (ascending item) order; invalid positions hold item 0. ``L = min(length, num_items)``:
    no user knows more than the catalog (as :func:`pnn_fast.sampling.sample_history`)."""
    starts = known.indptr[users]
    counts = known.indptr[users + 1] - starts
    offsets = torch.arange(min(length, known.num_items), device=users.device)
    valid = offsets[None, :] < counts[:, None]
    positions = torch.where(valid, starts[:, None] + offsets[None, :], torch.zeros_like(valid, dtype=torch.long))
    return known.indices[positions].masked_fill(~valid, 0), valid


@register("pnn-authors")
class AuthorsPNNObjective(Objective):
    """PNN as the authors' code computes it (module docstring); ``candidates`` K uniform unknown
    items per row, ``alpha`` / ``beta`` their yaml's a / b, ``gamma`` and ``history_len`` theirs."""

    DEFAULTS = {"candidates": 8, "alpha": 0.8, "beta": 0.1, "gamma": 0.1, "history_len": 20}

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        self.candidates = check_int("pnn-authors: candidates", a["candidates"], 1)
        self.history_len = check_int("pnn-authors: history_len", a["history_len"], 1)
        self.alpha, self.beta = check_real("pnn-authors: alpha", a["alpha"]), check_real("pnn-authors: beta", a["beta"])
        self.attention = AuthorsAttention(model.dim, check_real("pnn-authors: gamma", a["gamma"], high=1.0))

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        user_table, item_table = model.embeddings()
        user_emb = gather_rows(user_table, users)
        candidates = sample_unknown(self.known, users, self.candidates, generator)
        history, valid = first_known(self.known, users, self.history_len)
        lam = self.attention(user_emb, item_table[history], valid)
        noise = tuple(F.normalize(torch.rand(users.numel(), 1, user_emb.shape[1], generator=generator,
                                             device=users.device, dtype=user_emb.dtype), dim=-1) * 0.1
                      for _ in range(2))
        terms = authors_terms(user_emb, item_table[pos_items], item_table[candidates], noise, lam)
        return BatchLoss(authors_loss(terms, self.alpha, self.beta), users, pos_items, candidates)
