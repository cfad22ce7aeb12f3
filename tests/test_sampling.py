"""pnn_fast.sampling: uniform draws from a user's unknown items (sample_unknown) and uniform subsets
of its known items (sample_history).  The kernels behind them are tested with their ops
(tests/ops/test_unknown_items.py, tests/ops/test_history_sample.py)."""
import torch

from pnn_fast import KnownPositives
from pnn_fast.sampling import sample_history, sample_unknown


def test_sample_unknown_is_uniform_over_unknown_items():
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 2, 3, 5]), 3, 6)
    g = torch.Generator().manual_seed(0)
    draws = sample_unknown(known, torch.tensor([0, 1, 2]), 30000, generator=g)
    for row, allowed in enumerate([{1, 4, 5}, {0, 1, 2, 3, 4}, set(range(6))]):
        values, counts = draws[row].unique(return_counts=True)
        assert set(values.tolist()) == allowed
        freq = counts.double() / counts.sum()
        assert torch.allclose(freq, torch.full_like(freq, 1 / len(allowed)), atol=0.015)


def test_history_subset_is_random_subset_of_known():
    known = KnownPositives.from_pairs(torch.zeros(40, dtype=torch.long), torch.arange(40), 2, 50)
    users = torch.tensor([0, 1])
    items, mask = sample_history(known, users, 10)
    assert mask[0].all() and not mask[1].any()
    assert len(set(items[0].tolist())) == 10 and set(items[0].tolist()) <= set(range(40))
    items2, _ = sample_history(known, users, 10)
    assert items[0].tolist() != items2[0].tolist()  # fresh sample each call (fails with prob ~1e-14)
