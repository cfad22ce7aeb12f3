"""Sampled softmax over one batch-shared pool of uniform negatives (issue 69, item 2): ``neg_items`` as
one 1-D pool [M], scored as one product [B, d] x [d, M], each row's known items masked out, against
a loop written from the equation; dense and ``sparse=True`` agree; the step reads nothing back."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from batches import requires_kernels
from host_reads import host_reads
from pnn_fast import KnownPositives, SampledSoftmaxLoss

BACKENDS = ["reference", pytest.param("cpu", marks=requires_kernels)]
NUM_USERS, NUM_ITEMS, DIM, BATCH, POOL = 12, 60, 5, 16, 25


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    pair_users = torch.randint(0, NUM_USERS, (150,), generator=gen)
    pair_items = (torch.rand(150, generator=gen) ** 2 * NUM_ITEMS).long()  # popular items: many pool hits
    known = KnownPositives.from_pairs(pair_users, pair_items, NUM_USERS, NUM_ITEMS)
    pick = torch.randint(0, 150, (BATCH,), generator=gen)
    users, pos = pair_users[pick], pair_items[pick]
    pool = torch.randint(0, NUM_ITEMS, (POOL,), generator=gen)
    user_rows = torch.randn(BATCH, DIM, dtype=torch.float64, generator=gen)
    item_table = torch.randn(NUM_ITEMS, DIM, dtype=torch.float64, generator=gen)
    return known, users, pos, pool, user_rows, item_table


def _loop(known, users, pos, pool, user_rows, item_table, temperature):
    """-log( exp s(u, p) / (exp s(u, p) + sum over the pool's draws j not known to u of exp s(u, j)) ),
    s the cosine over temperature, averaged over rows: one row and one draw at a time."""
    total = 0.0
    for b in range(users.numel()):
        u = F.normalize(user_rows[b], dim=0)
        score = lambda item: float(u @ F.normalize(item_table[item], dim=0)) / temperature  # noqa: E731
        denominator = math.exp(score(int(pos[b])))
        for item in pool.tolist():
            if not bool(known.contains(users[b], torch.tensor(item))):
                denominator += math.exp(score(item))
        total += math.log(denominator) - score(int(pos[b]))
    return total / users.numel()


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_pool_matches_the_loop(backend):
    known, users, pos, pool, user_rows, item_table = _problem()
    masked = known.contains(users[:, None], pool[None, :])
    assert masked.any() and not masked.all()  # the masks matter here
    loss = SampledSoftmaxLoss(known, num_negatives=POOL, temperature=0.3, backend=backend)(
        user_rows, item_table, users, pos, pool)
    assert loss.item() == pytest.approx(_loop(known, users, pos, pool, user_rows, item_table, 0.3), rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_pool_sparse_gives_the_dense_loss_and_gradients(backend):
    known, users, pos, pool, user_rows, item_table = _problem(1)
    results = []
    for sparse in (False, True):
        rows, table = user_rows.clone().requires_grad_(), item_table.clone().requires_grad_()
        loss = SampledSoftmaxLoss(known, num_negatives=POOL, backend=backend, sparse=sparse)(rows, table, users, pos,
                                                                                            pool)
        loss.backward()
        grad = table.grad.to_dense() if sparse else table.grad
        assert table.grad.is_sparse == sparse
        results.append((loss.detach(), rows.grad, grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_drawn_shared_pool_is_one_uniform_pool_for_the_batch():
    """``shared_negatives=True``: a call without neg_items draws one pool of num_negatives items
    uniformly from the whole catalog for the batch (the same draws as ``torch.randint`` would make)."""
    known, users, pos, pool, user_rows, item_table = _problem(2)
    loss_fn = SampledSoftmaxLoss(known, num_negatives=POOL, shared_negatives=True, backend="reference")
    drawn = loss_fn.sample_negatives(users, torch.Generator().manual_seed(4))
    assert drawn.shape == (POOL,)
    assert torch.equal(drawn, torch.randint(0, NUM_ITEMS, (POOL,), generator=torch.Generator().manual_seed(4)))
    got = loss_fn(user_rows, item_table, users, pos, generator=torch.Generator().manual_seed(4))
    assert got.item() == pytest.approx(_loop(known, users, pos, drawn, user_rows, item_table, 0.1), rel=1e-12)


def test_a_row_whose_pool_is_all_known_keeps_its_positive_alone():
    """Every draw known to the row's user: the denominator is the positive's alone, the loss 0."""
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 1]), torch.tensor([1, 2, 3]), 2, 5)
    loss = SampledSoftmaxLoss(known, num_negatives=2, backend="reference")(
        torch.randn(1, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64), torch.tensor([0]),
        torch.tensor([1]), torch.tensor([1, 2]))
    assert loss.item() == 0.0


@requires_kernels
def test_shared_pool_step_reads_nothing_back():
    known, users, pos, pool, user_rows, item_table = _problem(3)
    loss_fn = SampledSoftmaxLoss(known, num_negatives=POOL, shared_negatives=True, backend="cpu")
    table = item_table.clone().requires_grad_()
    loss_fn(user_rows, table, users, pos)  # one-off set-up
    with host_reads() as guard:
        loss_fn(user_rows, table, users, pos).backward()
    assert not guard.reads, guard.reads[0]


def test_shared_pool_refuses_pnn_classes():
    known = _problem()[0]
    with pytest.raises(ValueError, match="shared_negatives"):
        SampledSoftmaxLoss(known, num_negatives=POOL, neutral_weight=0.5, shared_negatives=True)
