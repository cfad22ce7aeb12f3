"""No loss step reads a value back to the host (issue 65, item 1): on CUDA each read is a
synchronisation, and a step that made 7 to 13 of them kept the GPU idle most of the time.

Each loss runs forward and backward on the fused kernels (the code a CUDA step runs), with the
default ``validate="deferred"``, under tests/host_reads.py's guard: a dispatch mode for the aten
ops that read, patches for the Tensor methods that read without dispatching on the CPU, and the
compiled ops' own read-back counter. The guard itself is shown to catch each kind of read.
"""
from __future__ import annotations

import pytest
import torch

from batches import requires_kernels
from host_reads import host_reads
from pnn_fast import BPRLoss, CSR, DNSLoss, KnownPositives, PNNLoss, SampledSoftmaxLoss, embedding_bpr
from pnn_fast import losses as pnn_losses
from pnn_fast.models import build_model
from pnn_fast.objectives import build_objective
from pnn_fast.softmax_losses import BilateralSoftmaxLoss, PairwiseSoftmaxLoss, SoftmaxLossAtK

pytestmark = requires_kernels

NUM_USERS, DIM, BATCH = 40, 8, 64


def _problem(num_items: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    pair_users = torch.randint(0, NUM_USERS, (NUM_USERS * 12,), generator=gen)
    pair_items = (torch.rand(NUM_USERS * 12, generator=gen) ** 3 * num_items).long()
    known = KnownPositives.from_pairs(pair_users, pair_items, NUM_USERS, num_items)
    pick = torch.randint(0, pair_users.numel(), (BATCH,), generator=gen)
    users, pos = pair_users[pick], pair_items[pick]
    neg = torch.randint(0, num_items, (BATCH, 9), generator=gen)
    user_table = torch.randn(NUM_USERS, DIM, generator=gen, requires_grad=True)
    item_table = torch.randn(num_items, DIM, generator=gen, requires_grad=True)
    return known, users, pos, neg, user_table, item_table


def _steps(known, dim, sparse=False):
    """name -> step(user_rows, item_table, users, pos, neg) of every loss and candidate mode."""
    torch.manual_seed(0)
    pnn = PNNLoss(known, dim, backend="cpu", sparse=sparse)  # the paper's: L_uniform and the attention
    both = PNNLoss(known, dim, backend="cpu", sparse=sparse, uniform_over="users_and_items")
    preset = PNNLoss.from_preset("dns-anchored", known, dim, backend="cpu", sparse=sparse)
    dns = DNSLoss(known, backend="cpu", sparse=sparse)
    sl = SampledSoftmaxLoss(known, num_negatives=16, backend="cpu", sparse=sparse)
    sl_classes = SampledSoftmaxLoss(known, num_negatives=16, neutral_weight=0.5, backend="cpu", sparse=sparse)
    bpr = BPRLoss(backend="cpu", sparse=sparse)
    bsl = BilateralSoftmaxLoss(known, num_negatives=16, backend="cpu", sparse=sparse)
    psl = PairwiseSoftmaxLoss(known, num_negatives=16, backend="cpu", sparse=sparse)
    slatk = SoftmaxLossAtK(known, k=4, num_negatives=16, backend="cpu", sparse=sparse)
    return {
        "pnn-in-batch": lambda u, t, users, pos, neg: pnn(u, t, users, pos),
        "pnn-in-batch-users-and-items": lambda u, t, users, pos, neg: both(u, t, users, pos),
        "pnn-given-candidates": lambda u, t, users, pos, neg: pnn(u, t, users, pos, neg),
        "pnn-preset-drawn": lambda u, t, users, pos, neg: preset(u, t, users, pos),
        "dns": lambda u, t, users, pos, neg: dns(u, t, users, pos, neg),
        "dns-in-batch": lambda u, t, users, pos, neg: dns(u, t, users, pos),
        "sl-drawn": lambda u, t, users, pos, neg: sl(u, t, users, pos),
        "sl-pnn-classes": lambda u, t, users, pos, neg: sl_classes(u, t, users, pos, neg),
        "bpr": lambda u, t, users, pos, neg: bpr(u, t, pos, neg),
        "bsl-drawn": lambda u, t, users, pos, neg: bsl(u, t, users, pos),
        "psl-drawn": lambda u, t, users, pos, neg: psl(u, t, users, pos),
        "slatk-drawn": lambda u, t, users, pos, neg: slatk(u, t, users, pos),
    }


def _reads_of_step(name, num_items, sparse=False):
    known, users, pos, neg, user_table, item_table = _problem(num_items)
    step = _steps(known, DIM, sparse)[name]
    step(user_table[users], item_table, users, pos, neg)  # a first call: one-off set-up (the flags, caches)
    with host_reads() as guard:
        loss = step(user_table[users], item_table, users, pos, neg)
        loss.backward()
    assert torch.isfinite(loss)
    return guard.reads


@pytest.mark.parametrize("name", list(_steps(_problem(150)[0], DIM)))
def test_dense_loss_step_reads_nothing(name):
    """A catalog smaller than the batch's ids and known items: every loss runs on the whole table."""
    reads = _reads_of_step(name, num_items=150)
    assert not reads, f"{name}: {len(reads)} host reads, the first {reads[0][0]} at\n{reads[0][1]}"


@pytest.mark.parametrize("name", ["pnn-preset-drawn", "dns", "sl-drawn", "bpr"])
def test_dense_loss_step_on_a_larger_catalog_reads_nothing(name):
    """A catalog larger than the batch's ids: the preset gathers its rows first, into a table sized by
    the ids rather than by a count read back."""
    reads = _reads_of_step(name, num_items=20_000)
    assert not reads, f"{name}: {len(reads)} host reads, the first {reads[0][0]} at\n{reads[0][1]}"


@pytest.mark.parametrize("name", ["pnn-in-batch", "pnn-given-candidates"])
def test_dense_pnn_step_with_a_lookup_reads_nothing_where_a_read_synchronises(name, monkeypatch):
    """PNN's dense step on a catalog larger than its rows, with candidates whose known items it must
    look up: on the CPU it gathers its rows first, the lookup sized by one count read back; where a
    read is a synchronisation (a GPU: ``_reads_are_free`` False) it runs on the whole table instead,
    with no read and the same loss and gradients."""
    known, users, pos, neg, user_table, item_table = _problem(20_000)

    def loss_and_grads():
        torch.manual_seed(3)
        step = _steps(known, DIM)[name]
        torch.manual_seed(4)  # the step's noise and histories
        loss = step(user_table[users], item_table, users, pos, neg)
        return (loss, *torch.autograd.grad(loss, [user_table, item_table]))

    assert [what for what, _ in _reads_of_step(name, num_items=20_000)] == ["Tensor.tolist"]  # gathers first
    gathered = loss_and_grads()
    monkeypatch.setattr(pnn_losses, "_reads_are_free", lambda device: False)
    reads = _reads_of_step(name, num_items=20_000)
    assert not reads, f"{name}: {len(reads)} host reads, the first {reads[0][0]} at\n{reads[0][1]}"
    for got, want in zip(loss_and_grads(), gathered):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["pnn-in-batch", "pnn-preset-drawn", "dns", "sl-drawn", "bpr"])
def test_sparse_loss_step_reads_once(name):
    """With ``sparse=True`` a step gathers its rows once and reads one count (two sizes at once): the
    rows its sparse gradient holds, which the optimiser's sparse tensor needs by value
    (pnn_fast/compact.py). The paper's PNN gathers its attention's history with its other rows."""
    reads = _reads_of_step(name, num_items=20_000, sparse=True)
    assert [what for what, _ in reads] == ["Tensor.tolist"], reads


def test_embedding_bpr_reads_nothing():
    known, users, pos, neg, user_table, item_table = _problem(150)
    with host_reads() as guard:
        embedding_bpr(user_table, item_table, users, pos, neg, reg_weight=1e-3, backend="cpu").backward()
    assert not guard.reads, guard.reads[0]


@pytest.mark.parametrize("objective, args", [
    ("bpr", {}), ("dns", {}), ("sl", {"num_negatives": 16}), ("pnn", {}), ("pnn", {"preset": "dns-anchored"}),
    ("pnn-authors", {}), ("bsl", {"num_negatives": 16}), ("psl", {"num_negatives": 16}),
    ("slatk", {"num_negatives": 16, "k": 4}),
])
def test_trainer_objective_step_reads_nothing(objective, args):
    """The trainer's step of each loss (its objective), on an MF model."""
    known, users, pos, *_ = _problem(150)
    model = build_model("mf", NUM_USERS, 150, known.entries_of(torch.arange(NUM_USERS))[0],
                        known.indices, dim=DIM)
    fn = build_objective(objective, known, model, **args)  # backend "auto": the fused kernels
    generator = torch.Generator().manual_seed(0)
    fn(model, users, pos, generator)  # one-off set-up
    with host_reads() as guard:
        fn(model, users, pos, generator).loss.backward()
    assert not guard.reads, f"{objective}: {len(guard.reads)} host reads, the first {guard.reads[0]}"


def test_slatk_quantile_refresh_reads_nothing():
    """SL@K's periodic work, the quantile refresh after a step, stays on the device too."""
    known, users, pos, *_ = _problem(150)
    model = build_model("mf", NUM_USERS, 150, known.entries_of(torch.arange(NUM_USERS))[0],
                        known.indices, dim=DIM)
    fn = build_objective("slatk", known, model, num_negatives=16, k=4, quantile_every=1)
    fn.on_epoch_start(model, None, 0)  # epoch 0 refreshes when quantile_every is 1
    generator = torch.Generator().manual_seed(0)
    fn(model, users, pos, generator)
    fn.after_step(model)  # one-off set-up
    with host_reads() as guard:
        fn(model, users, pos, generator).loss.backward()
        fn.after_step(model)
    assert not guard.reads, f"{len(guard.reads)} host reads, the first {guard.reads[0]}"
    assert fn.loss_fn.quantile[users].ne(0).all()


READS = {
    "item": lambda t: t.sum().item(),
    "bool": lambda t: bool(t.sum() > 0),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "nonzero": lambda t: t.nonzero(),
    "unique": lambda t: torch.unique(t),
    "masked_select": lambda t: t.masked_select(t > 0),
    "a C++ read-back": None,  # below
}


@pytest.mark.parametrize("kind", list(READS))
def test_the_guard_sees_each_kind_of_read(kind):
    t = torch.randn(5)
    if kind == "a C++ read-back":  # the evaluator's masked_topk checks its exclusions with read-backs
        from pnn_fast import ops
        csr = CSR.from_pairs(torch.tensor([0, 1]), torch.tensor([1, 0]), 2, 2)
        with host_reads() as guard:
            ops.masked_topk(torch.randn(2, 2), torch.tensor([0, 1]), [csr], 1)
    else:
        with host_reads() as guard:
            READS[kind](t)
    assert guard.reads, kind


def test_the_guard_sees_an_eager_loss_read():
    """validate="eager" checks its values with one read a call: the guard sees it."""
    known, users, pos, neg, user_table, item_table = _problem(150)
    dns = DNSLoss(known, backend="cpu", validate="eager")
    with host_reads() as guard:
        dns(user_table[users], item_table, users, pos, neg)
    assert guard.reads
