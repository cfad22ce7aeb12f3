"""A slow, loop-over-rows PNN written straight from docs/semantics.md.

Independent of pnn_fast.reference: plain Python sets and sorts per row, the clamp
term in its literal (unsimplified) form, the uniformity term as an explicit double
loop. Built from differentiable torch scalar ops so gradients can be compared too.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F


def known_sets(user_ids, item_ids):
    sets = {}
    for u, i in zip(user_ids.tolist(), item_ids.tolist()):
        sets.setdefault(u, set()).add(i)
    return sets


def negative_count(num_unlabeled, n_known, num_items, neg_size):
    if neg_size == "proportional":
        k = max(1, math.floor(Fraction(num_unlabeled * n_known, num_items - n_known) + Fraction(1, 2)))
    elif neg_size == "count":
        k = n_known
    else:
        k = neg_size
    return min(k, num_unlabeled - 1)


def unit(x, eps=1e-12):
    return x / torch.clamp(x.norm(), min=eps)


def slow_rows(user_emb, item_table, users, pos_items, candidates, sets, num_items, neg_size, noise_pos, noise_neg):
    """Per-row components as Python lists of torch scalars / ints."""
    out = {k: [] for k in ("bpr", "rank", "constrain", "hard_negative", "num_negative", "num_neutral", "valid")}
    batch = users.numel()
    zero = user_emb.sum() * 0
    for b in range(batch):
        u, i = int(users[b]), int(pos_items[b])
        cands = candidates.tolist() if candidates.dim() == 1 else candidates[b].tolist()
        known = sets.get(u, set())
        unl = [j for j, c in enumerate(cands) if c not in known and c != i]
        e_u, e_pos = user_emb[b], item_table[i]
        s_pos = e_u @ e_pos
        if not unl:
            for k, v in (("bpr", zero), ("rank", zero), ("constrain", zero), ("hard_negative", -1),
                         ("num_negative", 0), ("num_neutral", 0), ("valid", False)):
                out[k].append(v)
            continue
        s = {j: e_u @ item_table[cands[j]] for j in unl}
        h = min(unl, key=lambda j: (-s[j].item(), j))
        k = negative_count(len(unl), len(known), num_items, neg_size)
        by_score = sorted(unl, key=lambda j: (s[j].item(), j))
        neg, neu = by_score[:k], by_score[k:]
        c_neu = torch.stack([item_table[cands[j]] for j in neu]).mean(0)
        rank = F.softplus(e_u @ c_neu - s_pos)
        constrain = zero
        if neg:
            c_neg = torch.stack([item_table[cands[j]] for j in neg]).mean(0)
            rank = rank + F.softplus(e_u @ c_neg - e_u @ c_neu)
            clamp_pos = c_neu + noise_pos[b] * unit(e_pos)
            clamp_neg = c_neu + noise_neg[b] * unit(c_neg)
            constrain = (clamp_pos - clamp_neg).pow(2).sum()
        for key, v in (("bpr", F.softplus(s[h] - s_pos)), ("rank", rank), ("constrain", constrain),
                       ("hard_negative", h), ("num_negative", len(neg)), ("num_neutral", len(neu)), ("valid", True)):
            out[key].append(v)
    return out


def slow_uniform(item_table, candidates, t, normalize):
    items = sorted(set(candidates.reshape(-1).tolist()))
    if len(items) < 2:
        return item_table.sum() * 0
    xs = [unit(item_table[i]) if normalize else item_table[i] for i in items]
    terms = [torch.exp(-t * (xs[a] - xs[b]).pow(2).sum()) for a in range(len(xs)) for b in range(len(xs)) if a != b]
    return torch.log(torch.stack(terms).mean())


def slow_lambda(attention, user_emb, item_table, users, sets):
    """Attention over all of each user's known items (history_len must cover them)."""
    w1, w2, bias = attention.w1.to(user_emb.dtype), attention.w2.to(user_emb.dtype), attention.bias.to(user_emb.dtype)
    lams = []
    for b in range(users.numel()):
        hist = sorted(sets.get(int(users[b]), set()))
        if not hist:
            lams.append(torch.sigmoid(user_emb.sum() * 0))
            continue
        e_h = item_table[hist]
        beta = torch.stack([user_emb[b] @ torch.tanh(w2 @ e + bias) for e in e_h])
        alpha = torch.softmax(beta, 0)
        lams.append(torch.sigmoid(w1 @ (alpha[:, None] * e_h).sum(0)))
    return lams


def slow_loss(rows, uniform, lams, alpha, beta, use_rank=True, rank_weight=1.0):
    """The mean over valid rows of (1 - lambda) L_BPR + lambda L_PNN; ``use_rank=False`` drops L_rank
    (the paper's "w/o rank"), ``rank_weight`` scales it."""
    rank_scale = rank_weight if use_rank else 0.0
    per_row = [(1 - lam) * bpr + lam * (alpha * con + beta * uniform + rank_scale * rank)
               for bpr, rank, con, lam, ok in zip(rows["bpr"], rows["rank"], rows["constrain"], lams, rows["valid"]) if ok]
    if not per_row:
        return uniform * 0
    return torch.stack(per_row).mean()
