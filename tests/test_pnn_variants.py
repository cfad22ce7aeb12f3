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


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_lambda_range_maps_the_attention_into_its_bounds(backend):
    """lambda = low + (high - low) * attention: the same attention weights with and without a range."""
    known, users, pos, user_emb, item_table, noise = problem(seed=3)
    free = PNNLoss(known, 6, backend=backend).double()
    bounded = PNNLoss(known, 6, lambda_range=(0.05, 0.3), backend=backend).double()
    bounded.attention.load_state_dict(free.attention.state_dict())
    torch.manual_seed(1)  # the attention's history draw
    _, want = free(user_emb, item_table, users, pos, noise=noise, return_components=True)
    torch.manual_seed(1)
    loss, got = bounded(user_emb, item_table, users, pos, noise=noise, return_components=True)
    torch.testing.assert_close(got["lambda"], 0.05 + 0.25 * want["lambda"], rtol=1e-12, atol=0)
    assert got["lambda"].min() >= 0.05 and got["lambda"].max() <= 0.3
    rows = torch.where(got["valid"], (1 - got["lambda"]) * got["bpr"] + got["lambda"] * (
        0.8 * got["constrain"] + 0.6 * got["uniform"] + got["rank"]), torch.zeros_like(got["bpr"]))
    torch.testing.assert_close(loss, rows.sum() / got["valid"].sum(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_lambda_temperature_divides_the_attention_logit(backend):
    """lambda = sigmoid(logit / T): the same attention weights at T = 1 and T = 4 give
    logit(lambda_4) = logit(lambda_1) / 4, and the loss uses that lambda."""
    known, users, pos, user_emb, item_table, noise = problem(seed=4)
    paper = PNNLoss(known, 6, backend=backend).double()
    tempered = PNNLoss(known, 6, lambda_temperature=4.0, backend=backend).double()
    tempered.attention.load_state_dict(paper.attention.state_dict())
    torch.manual_seed(1)  # the attention's history draw
    _, want = paper(user_emb, item_table, users, pos, noise=noise, return_components=True)
    torch.manual_seed(1)
    loss, got = tempered(user_emb, item_table, users, pos, noise=noise, return_components=True)
    torch.testing.assert_close(torch.logit(got["lambda"]), torch.logit(want["lambda"]) / 4, rtol=1e-10, atol=1e-12)
    assert (got["lambda"] - 0.5).abs().max() < (want["lambda"] - 0.5).abs().max()
    rows = torch.where(got["valid"], (1 - got["lambda"]) * got["bpr"] + got["lambda"] * (
        0.8 * got["constrain"] + 0.6 * got["uniform"] + got["rank"]), torch.zeros_like(got["bpr"]))
    torch.testing.assert_close(loss, rows.sum() / got["valid"].sum(), rtol=1e-12, atol=0)


def test_lambda_temperature_reaches_the_objective():
    from pnn_fast.models import build_model
    from pnn_fast.objectives import build_objective

    known, users, pos = problem()[:3]
    model = build_model("mf", 12, 40, users, pos, dim=6)
    objective = build_objective("pnn", known, model, in_batch=False, lambda_temperature=3.0)
    assert objective.loss_fn.attention.temperature == 3.0


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_uniformity_over_users_and_items_is_the_mean_of_both(backend):
    """DirectAU's uniformity: the mean of L_uniform over the distinct candidate items and over the
    distinct users of the batch (each user's row once, normalised like the items')."""
    from pnn_fast.backends import reference
    import torch.nn.functional as F

    known, users, pos, user_emb, item_table, noise = problem(seed=5)
    user_emb = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))[users]
    loss_fn = PNNLoss(known, 6, uniform_over="users_and_items", lambda_mode="fixed", backend=backend).double()
    _, got = loss_fn(user_emb, item_table, users, pos, noise=noise, return_components=True)
    items = F.normalize(item_table[torch.unique(pos)], dim=1, eps=1e-12)
    distinct_users = F.normalize(user_emb[[users.tolist().index(u) for u in torch.unique(users).tolist()]], dim=1)
    want = (reference.pairwise_uniformity(items, 2.0) + reference.pairwise_uniformity(distinct_users, 2.0)) / 2
    torch.testing.assert_close(got["uniform"], want, rtol=1e-10, atol=1e-12)
    items_only = PNNLoss(known, 6, lambda_mode="fixed", backend=backend).double()
    _, plain = items_only(user_emb, item_table, users, pos, noise=noise, return_components=True)
    assert not torch.allclose(plain["uniform"], got["uniform"])


@pytest.mark.parametrize("kwargs, message", [
    ({"lambda_range": (0.3, 0.1)}, "lambda_range must have low < high"),
    ({"lambda_range": (0.1, 1.5)}, r"lambda_range high must be a finite number in \[0, 1\]"),
    ({"lambda_range": (float("nan"), 0.5)}, "lambda_range low must be a finite number"),
    ({"lambda_range": 0.3}, r"lambda_range must be a pair \(low, high\)"),
    ({"lambda_range": (0.1, 0.3), "lambda_mode": "fixed"}, "lambda_range bounds the attention's lambda"),
    ({"uniform_over": "users"}, "uniform_over must be 'items' or 'users_and_items'"),
    ({"lambda_temperature": 0.0}, "lambda_temperature must be a finite number > 0, got 0.0"),
    ({"lambda_temperature": -2.0}, "lambda_temperature must be a finite number"),
    ({"lambda_temperature": float("inf")}, "lambda_temperature must be a finite number"),
    ({"lambda_temperature": 2.0, "lambda_mode": "fixed"}, "lambda_temperature belongs to the attention's lambda"),
])
def test_bad_lambda_range_and_uniform_over_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PNNLoss(problem()[0], 6, **kwargs)
