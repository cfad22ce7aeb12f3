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
