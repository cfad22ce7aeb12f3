"""The pnn-authors objective (PNN as the authors' released code computes it): its terms against a
loop written from their equations one row at a time, its training through the CLI, bad arguments."""
from __future__ import annotations

import math

import pytest
import torch

from pnn_fast.objectives.pnn_authors import AuthorsAttention, authors_loss, authors_terms, first_known
from pnn_fast import KnownPositives


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def loop_loss(u, p, c, n1, n2, lam, alpha, beta):
    """Their loss, one row and one scalar at a time (u, p [B][d], c [B][K][d], n1, n2 [B][d])."""
    B, K, d = len(u), len(c[0]), len(u[0])
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    unit = lambda a: [x / max(math.sqrt(dot(a, a)), 1e-12) for x in a]  # noqa: E731
    bpr_terms, rank_terms, class_sum, means = [], [], 0.0, []
    for b in range(B):
        pos = dot(u[b], p[b])
        scores = [dot(u[b], c[b][k]) for k in range(K)]
        hard, low = max(scores), min(scores)
        mean = sum(scores) / K
        bpr_terms.append(-math.log(1e-10 + sigmoid(pos - hard)))
        rank_terms.append((-math.log(1e-10 + sigmoid(pos - mean)), -math.log(1e-10 + sigmoid(mean - low))))
        for k in range(K):
            x = unit([c[b][k][i] + n1[b][i] for i in range(d)])
            y = unit([c[b][k][i] + n2[b][i] for i in range(d)])
            class_sum += sum((xi - yi) ** 2 for xi, yi in zip(x, y))
        units = [unit(c[b][k]) for k in range(K)]
        means.append([sum(units[k][i] for k in range(K)) / K for i in range(d)])
    bpr = sum(bpr_terms) / B
    rank = sum(t[0] for t in rank_terms) / B + sum(t[1] for t in rank_terms) / B
    constrain = class_sum / (B * d)
    pairs = [math.exp(-2 * sum((means[a][i] - means[b][i]) ** 2 for i in range(d)))
             for a in range(B) for b in range(a + 1, B)]
    uniform = math.log(sum(pairs) / len(pairs)) / 2
    return lam * bpr + (1 - lam) * (rank + alpha * constrain + beta * uniform)


def test_terms_match_a_loop_over_their_equations():
    g = torch.Generator().manual_seed(0)
    B, K, d = 6, 4, 5
    u, p = torch.randn(B, d, generator=g, dtype=torch.float64), torch.randn(B, d, generator=g, dtype=torch.float64)
    c = torch.randn(B, K, d, generator=g, dtype=torch.float64)
    noise = tuple(torch.nn.functional.normalize(torch.rand(B, 1, d, generator=g, dtype=torch.float64), dim=-1) * 0.1
                  for _ in range(2))
    lam = torch.tensor(0.37, dtype=torch.float64)
    got = authors_loss(authors_terms(u, p, c, noise, lam), 0.8, 0.1)
    want = loop_loss(u.tolist(), p.tolist(), c.tolist(), noise[0][:, 0].tolist(), noise[1][:, 0].tolist(), 0.37, 0.8, 0.1)
    assert got.item() == pytest.approx(want, rel=1e-12)


def test_batch_lambda_is_one_sigmoid_over_the_batch_mean():
    """Their lambda: one number per batch; history attention over valid positions only."""
    g = torch.Generator().manual_seed(1)
    B, L, d = 5, 3, 4
    attention = AuthorsAttention(d, 0.1).double()
    u = torch.randn(B, d, generator=g, dtype=torch.float64)
    h = torch.randn(B, L, d, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    lam = attention(u, h, mask)
    outputs = []
    with torch.no_grad():
        for b in range(B):
            keys = torch.tanh(attention.key(h[b]))
            w = torch.exp(keys @ u[b]) * mask[b]
            w = w / (w.sum() + 1e-10)
            mixed = 0.1 * u[b] + 0.9 * attention.ui_map((w[:, None] * h[b]).sum(0))
            outputs.append(attention.to_lambda(mixed).item())
    assert lam.dim() == 0 and lam.item() == pytest.approx(sigmoid(sum(outputs) / B), rel=1e-12)
    h_changed = h.clone()
    h_changed[1, 1:] += 100.0  # masked positions do not count
    assert attention(u, h_changed, mask).item() == pytest.approx(lam.item(), rel=1e-12)


def test_first_known_takes_each_users_first_items():
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 0, 2]), torch.tensor([7, 3, 5, 1]), 3, 9)
    items, valid = first_known(known, torch.tensor([0, 1, 2]), 2)
    assert items.tolist() == [[3, 5], [0, 0], [1, 0]] and valid.tolist() == [[True, True], [False, False], [True, False]]
    # a length past the catalog (10**12) is the catalog's, not an allocation of 10**12 slots
    longest = first_known(known, torch.tensor([0, 1, 2]), 9)
    for got, want in zip(first_known(known, torch.tensor([0, 1, 2]), 10**12), longest):
        assert torch.equal(got, want)


def test_trains_through_the_cli(tmp_path):
    """One epoch on the built-in default data: the objective, its attention's parameters and the
    trainer's L2 over the candidates fit together, and the run evaluates."""
    import json

    from pnn_fast.cli import main

    code = main(["train", "--loss", "pnn-authors", "--epochs", "1", "--dim", "8", "--no-progress",
                 "--out", str(tmp_path)])
    assert code in (0, None)
    result = json.loads(next(tmp_path.rglob("results.json")).read_text())
    assert math.isfinite(result["test"]["ndcg@20"]) and result["test"]["ndcg@20"] > 0


@pytest.mark.parametrize("bad, message", [({"candidates": 0}, "candidates must be an int >= 1"),
                                          ({"history_len": 2.5}, "history_len must be an int, got 2.5"),
                                          ({"gamma": 1.5}, r"gamma must be a finite number in \[0, 1\]"),
                                          ({"beta": -0.1}, "beta must be a finite number >= 0"),
                                          ({"alpha": float("nan")}, "alpha must be a finite number"),
                                          ({"lambda_range": [0, 1]}, r"has no argument\(s\) \['lambda_range'\]")])
def test_bad_arguments_are_named(bad, message):
    from pnn_fast.models import build_model
    from pnn_fast.objectives import build_objective

    known = KnownPositives.from_pairs(torch.tensor([0, 1]), torch.tensor([2, 3]), 2, 6)
    model = build_model("mf", 2, 6, torch.tensor([0, 1]), torch.tensor([2, 3]), dim=8)
    with pytest.raises(ValueError, match=message):
        build_objective("pnn-authors", known, model, **bad)
