"""PNNLoss's options beyond the paper (docs/semantics.md, "Variants beyond the paper") and its presets."""
import pytest
import torch

from pnn_fast import KnownPositives, PNNLoss
from pnn_fast.sampling import sample_unknown


def problem(seed=0, batch=32, num_users=12, num_items=40, dim=6):
    g = torch.Generator().manual_seed(seed)
    known = KnownPositives.from_pairs(torch.randint(0, num_users, (90,), generator=g),
                                      torch.randint(0, num_items, (90,), generator=g), num_users, num_items)
    users = torch.randint(0, num_users, (batch,), generator=g)
    pos = torch.randint(0, num_items, (batch,), generator=g)
    noise = (torch.rand(batch, dim, generator=g, dtype=torch.float64) * 0.1,
             torch.rand(batch, dim, generator=g, dtype=torch.float64) * 0.1)
    return known, users, pos, torch.randn(batch, dim, generator=g, dtype=torch.float64), \
        torch.randn(num_items, dim, generator=g, dtype=torch.float64), noise


@pytest.mark.parametrize("num_candidates, num_hard", [(5, None), (None, 3), (5, 3)])
def test_drawn_candidates_equal_the_same_draws_given(num_candidates, num_hard):
    """num_candidates / num_hard_candidates draw from the given generator, candidates first: the
    same as passing those draws as neg_items / hard_candidates."""
    known, users, pos, user_emb, item_table, noise = problem()
    loss_fn = PNNLoss(known, 6, lambda_mode="fixed", fixed_lambda=0.3, num_candidates=num_candidates,
                      num_hard_candidates=num_hard, backend="reference").double()
    got = loss_fn(user_emb, item_table, users, pos, noise=noise, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    neg = sample_unknown(known, users, num_candidates, g) if num_candidates else None
    hard = sample_unknown(known, users, num_hard, g) if num_hard else None
    plain = PNNLoss(known, 6, lambda_mode="fixed", fixed_lambda=0.3, backend="reference").double()
    want = plain(user_emb, item_table, users, pos, neg, noise=noise, hard_candidates=hard)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name, value", [("num_candidates", 0), ("num_hard_candidates", -1),
                                         ("num_candidates", 2.5), ("num_hard_candidates", True)])
def test_bad_candidate_counts_name_the_argument(name, value):
    known = problem()[0]
    with pytest.raises(ValueError, match=name):
        PNNLoss(known, 6, **{name: value})


def test_presets_are_constructor_arguments():
    from pnn_fast.losses import PRESETS

    known = problem()[0]
    paper = PNNLoss.from_preset("paper", known, 6)
    assert (paper.beta, paper.lambda_mode, paper.num_candidates) == (0.6, "attention", None)
    anchored = PNNLoss.from_preset("dns-anchored", known, 6, backend="reference")
    for key, value in PRESETS["dns-anchored"].items():
        assert getattr(anchored, key) == value, key
    assert anchored.backend == "reference"
    with pytest.raises(ValueError, match="unknown PNN preset 'best'"):
        PNNLoss.from_preset("best", known, 6)


def test_the_pnn_objective_takes_a_preset_alone():
    from pnn_fast.models import build_model
    from pnn_fast.objectives import build_objective

    known, users, pos = problem()[:3]
    model = build_model("mf", 12, 40, users, pos, dim=6)
    objective = build_objective("pnn", known, model, preset="dns-anchored")
    assert objective.loss_fn.num_candidates == 8 and objective.loss_fn.fixed_lambda == 0.1
    out = objective(model, users, pos, torch.Generator().manual_seed(0))
    assert torch.isfinite(out.loss)
    with pytest.raises(ValueError, match=r"sets every argument but backend; drop \['beta'\]"):
        build_objective("pnn", known, model, preset="paper", beta=0.1)
