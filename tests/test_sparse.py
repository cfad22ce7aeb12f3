"""``sparse=True``: every loss gives the dense loss and gradients, with the item table's gradient as a
sparse COO tensor of the rows the step read, and no tensor of the step has the catalog's size."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pnn_fast import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss, _extension, embedding_bpr
from pnn_fast.compact import compact_items
from pnn_fast.known import KnownPositives
from pnn_fast.sampling import sample_unknown
from pnn_fast.softmax_losses import BilateralSoftmaxLoss, PairwiseSoftmaxLoss, SoftmaxLossAtK

from batches import requires_kernels

BACKENDS = ["reference", pytest.param("cpu", marks=requires_kernels)]

NUM_USERS, NUM_ITEMS, DIM, BATCH = 40, 2003, 6, 32


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    users_of_pairs = torch.randint(0, NUM_USERS, (NUM_USERS * 12,), generator=gen)
    # popular items: most of a batch's candidates repeat and many are known to the row's user
    items_of_pairs = (torch.rand(NUM_USERS * 12, generator=gen) ** 3 * 60).long()
    known = KnownPositives.from_pairs(users_of_pairs, items_of_pairs, NUM_USERS, NUM_ITEMS)
    pick = torch.randint(0, users_of_pairs.numel(), (BATCH,), generator=gen)
    users, pos = users_of_pairs[pick], items_of_pairs[pick]
    neg = (torch.rand(BATCH, 9, generator=gen) ** 3 * 80).long()
    user_table = torch.randn(NUM_USERS, DIM, generator=gen, dtype=torch.float64)
    item_table = torch.randn(NUM_ITEMS, DIM, generator=gen, dtype=torch.float64)
    noise = (torch.rand(BATCH, DIM, generator=gen, dtype=torch.float64) * 0.1,
             torch.rand(BATCH, DIM, generator=gen, dtype=torch.float64) * 0.1)
    return known, users, pos, neg, user_table, item_table, noise


def _losses(known, backend, sparse):
    """(name, module, call(user_emb, item_table, users, pos, neg, noise)) of every loss."""
    torch.manual_seed(5)  # the attention's parameters
    pnn = PNNLoss(known, DIM, backend=backend, sparse=sparse).double()
    torch.manual_seed(5)
    preset = PNNLoss.from_preset("dns-anchored", known, DIM, backend=backend, sparse=sparse).double()
    # built here, not in the step: their item counts (logQ) and quantiles are made once, not per step
    mixed_logq = SampledSoftmaxLoss(known, num_negatives=9, shared_negatives=True, in_batch_negatives=True, logq=True,
                                    backend=backend, sparse=sparse)
    softmax_family = {"bsl": BilateralSoftmaxLoss(known, num_negatives=9, backend=backend, sparse=sparse),
                      "psl": PairwiseSoftmaxLoss(known, num_negatives=9, backend=backend, sparse=sparse),
                      "slatk": SoftmaxLossAtK(known, k=3, num_negatives=9, backend=backend, sparse=sparse)}
    softmax_family["slatk"].quantile = torch.linspace(-0.5, 0.6, NUM_USERS)
    # a pool shared by the batch: the first draw of each row, 1-D
    pooled = {f"{name}-pool": (lambda u, t, users, pos, neg, noise, loss=loss: loss(u, t, users, pos, neg[:, 0]))
              for name, loss in softmax_family.items()}
    return pooled | {
        "pnn-in-batch": lambda u, t, users, pos, neg, noise: pnn(u, t, users, pos, noise=noise),
        "pnn-sampled": lambda u, t, users, pos, neg, noise: pnn(u, t, users, pos, neg, noise=noise),
        "pnn-preset": lambda u, t, users, pos, neg, noise: preset(u, t, users, pos, neg, noise=noise,
                                                                  hard_candidates=neg.flip(1)),
        "pnn-preset-drawn": lambda u, t, users, pos, neg, noise: preset(u, t, users, pos, noise=noise),
        "dns": lambda u, t, users, pos, neg, noise: DNSLoss(known, backend=backend, sparse=sparse)(u, t, users, pos, neg),
        "dns-drawn-promised": lambda u, t, users, pos, neg, noise: DNSLoss(known, backend=backend, sparse=sparse)(
            u, t, users, pos, _drawn(known, users), candidates_unknown=True),
        "dns-in-batch": lambda u, t, users, pos, neg, noise: DNSLoss(known, backend=backend, sparse=sparse)(u, t, users,
                                                                                                            pos),
        "bpr": lambda u, t, users, pos, neg, noise: BPRLoss(backend=backend, sparse=sparse)(u, t, pos, neg),
        "sl": lambda u, t, users, pos, neg, noise: SampledSoftmaxLoss(known, num_negatives=9, backend=backend,
                                                                      sparse=sparse)(u, t, users, pos, neg),
        "sl-drawn": lambda u, t, users, pos, neg, noise: SampledSoftmaxLoss(known, num_negatives=9, backend=backend,
                                                                            sparse=sparse)(u, t, users, pos),
        "sl-pnn-classes": lambda u, t, users, pos, neg, noise: SampledSoftmaxLoss(
            known, num_negatives=9, neutral_weight=0.5, backend=backend, sparse=sparse)(u, t, users, pos, neg),
        "sl-pool": lambda u, t, users, pos, neg, noise: SampledSoftmaxLoss(known, num_negatives=9, backend=backend,
                                                                           sparse=sparse)(u, t, users, pos, neg[:, 0]),
        "sl-mixed-logq": lambda u, t, users, pos, neg, noise: mixed_logq(u, t, users, pos, neg[:, 0]),
    }


def _drawn(known, users):
    """8 uniform unknown items a row, the same draws every call."""
    return sample_unknown(known, users, 8, torch.Generator().manual_seed(9), backend="reference")


def test_dns_promised_unknown_candidates_give_the_loss_of_the_lookups():
    """candidates_unknown=True skips the known-item lookups: on drawn candidates, the same loss."""
    known, users, pos, _, user_table, item_table, _ = _problem(8)
    neg = _drawn(known, users)
    for backend in ["reference"] + (["cpu"] if _extension.has_kernels("cpu") else []):
        for sparse in (False, True):
            loss_fn = DNSLoss(known, backend=backend, sparse=sparse)
            torch.testing.assert_close(loss_fn(user_table[users], item_table, users, pos, neg, candidates_unknown=True),
                                       loss_fn(user_table[users], item_table, users, pos, neg))
    with pytest.raises(ValueError, match="candidates_unknown promises"):
        DNSLoss(known)(user_table[users], item_table, users, pos, candidates_unknown=True)


def _run(name, backend, sparse, seed=0, step_context=contextlib.nullcontext):
    """(loss, user table's gradient, item table's gradient) of one step; ``step_context()`` is
    entered around the loss's forward and backward only."""
    known, users, pos, neg, user_table, item_table, noise = _problem(seed)
    user_table.requires_grad_(True)
    item_table.requires_grad_(True)
    user_emb = user_table.index_select(0, users)
    loss_fn = _losses(known, backend, sparse)[name]
    torch.manual_seed(11)  # the attention's history draws
    with step_context():
        loss = loss_fn(user_emb, item_table, users, pos, neg, noise)
        loss.backward()
    return loss.detach(), user_table.grad, item_table.grad


LOSS_NAMES = list(_losses(_problem()[0], "reference", False))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_sparse_matches_dense(name, backend):
    dense_loss, dense_user_grad, dense_item_grad = _run(name, backend, sparse=False)
    loss, user_grad, item_grad = _run(name, backend, sparse=True)
    assert item_grad.is_sparse, "the item table's gradient is not sparse"
    assert not dense_item_grad.is_sparse
    torch.testing.assert_close(loss, dense_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(user_grad, dense_user_grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(item_grad.to_dense(), dense_item_grad, rtol=1e-10, atol=1e-12)
    # only the rows the step read: far fewer than the table's
    rows = item_grad.coalesce().indices().unique().numel()
    assert 0 < rows < NUM_ITEMS // 4
    assert dense_item_grad.abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_bpr_sparse_gives_both_tables_sparse_gradients(backend):
    _, users, pos, neg, user_table, item_table, _ = _problem(1)
    grads = []
    for sparse in (False, True):
        u, t = user_table.clone().requires_grad_(True), item_table.clone().requires_grad_(True)
        loss = embedding_bpr(u, t, users, pos, neg, reg_weight=0.3, backend=backend, sparse=sparse)
        loss.backward()
        grads.append((loss.detach(), u.grad, t.grad))
    (dense_loss, du, dt), (loss, su, st) = grads
    assert su.is_sparse and st.is_sparse
    torch.testing.assert_close(loss, dense_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(su.to_dense(), du, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(st.to_dense(), dt, rtol=1e-10, atol=1e-12)


class _CatalogSizedOutputs(TorchDispatchMode):
    """Records every op whose dense output has a dimension of a given size (a sparse COO tensor of
    that shape holds only its nonzero rows)."""

    def __init__(self, size):
        super().__init__()
        self.size, self.seen = size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and self.size in t.shape:
                self.seen.append(f"{func}: {list(t.shape)}")
        return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_sparse_step_has_no_catalog_sized_tensor(name, backend):
    """NUM_ITEMS (2003) is prime and above every other size of the problem, so a tensor with it as a
    dimension is catalog-sized; the dense step has one (its gradient), which shows the probe works."""
    for sparse in (True, False):
        probe = _CatalogSizedOutputs(NUM_ITEMS)
        _run(name, backend, sparse, step_context=lambda: probe)
        if sparse:
            assert probe.seen == [], f"sparse {name} made catalog-sized tensors: {probe.seen[:5]}"
        else:
            assert probe.seen, f"the probe saw no catalog-sized tensor in the dense {name} step"


def test_sparse_table_computed_by_the_model_gets_a_dense_gradient():
    """A non-leaf table (LightGCN's propagated one) passes its gradient on to ops that take dense ones."""
    known, users, pos, neg, user_table, item_table, _ = _problem(2)
    base = item_table.clone().requires_grad_(True)
    loss = SampledSoftmaxLoss(known, num_negatives=9, sparse=True, backend="reference")(
        user_table[users], base * 2.0, users, pos, neg)
    loss.backward()
    assert not base.grad.is_sparse and base.grad.abs().sum() > 0


def test_compact_items_renames_ids_to_rows_of_the_compact_table():
    known, users, pos, neg, _, item_table, _ = _problem(3)
    table, items, (pos_c, neg_c), lookup = compact_items(item_table, [pos, neg], sparse=False, known=known, users=users)
    assert torch.equal(items, torch.unique(torch.cat([pos, neg.reshape(-1)])))
    assert torch.equal(table[pos_c], item_table[pos]) and torch.equal(table[neg_c], item_table[neg])
    # row b of the lookup knows exactly the compact rows of users[b]'s known items
    contains = lookup.known.contains(lookup.rows[:, None], neg_c)
    assert torch.equal(contains, known.contains(users[:, None], neg))
    assert contains.any() and not contains.all()
