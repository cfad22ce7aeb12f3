"""BSL, PSL and SL@K (issue 69, item 1) against loops written from their papers' equations, one row
and one draw at a time: each row's own draws and one shared pool, the backends and ``sparse=True``
alike; SL@K's quantile estimate against a sort of its own; and the trainer's schedule for SL@K (the
SL warm-up, the learning-rate switch with Adam restarted, the periodic refresh) resumed exactly."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from batches import requires_kernels
from conftest import data_path
from test_shared_pool import BATCH, NUM_ITEMS, NUM_USERS, _problem as shared_pool_problem
from pnn_fast import KnownPositives, SampledSoftmaxLoss
from pnn_fast.data import load_dataset
from pnn_fast.softmax_losses import BilateralSoftmaxLoss, PairwiseSoftmaxLoss, SoftmaxLossAtK
from pnn_fast.train import TrainConfig, Trainer, run

BACKENDS = ["reference", pytest.param("cpu", marks=requires_kernels)]
DRAWS = 9


def _problem(seed=0):
    """test_shared_pool's problem (known items, users, positives, a pool of 25, float64 tables) and each
    row's own DRAWS draws: (known, users, pos, own, pool, user_rows, item_table)."""
    known, users, pos, pool, user_rows, item_table = shared_pool_problem(seed)
    own = torch.randint(0, NUM_ITEMS, (BATCH, DRAWS), generator=torch.Generator().manual_seed(seed + 100))
    return known, users, pos, own, pool, user_rows, item_table


def _negatives(known, users, neg, b):
    """Row b's negatives: its own draws, or the pool's draws not known to its user."""
    if neg.dim() == 2:
        return neg[b].tolist()
    return [j for j in neg.tolist() if not bool(known.contains(users[b], torch.tensor(j)))]


def _cos(user_rows, item_table, b, item):
    return float(F.normalize(user_rows[b], dim=0) @ F.normalize(item_table[item], dim=0))


def _bsl_row(s_group, s_neg, tau, weight, w=None):
    # BSL (ICDE'24, the authors' code, mode multi): -log( mean_{b' of the user} exp(s_b'p / tau)
    #   / (mean_j exp(s_j / tau)) ** weight ), s_group the positives of the batch's rows of the row's user;
    # w_j: the logQ correction's 1 / E_j on each term of the negatives' mean
    w = w or [1.0] * len(s_neg)
    positive = sum(math.exp(s / tau) for s in s_group) / len(s_group)
    negative = sum(wj * math.exp(s / tau) for s, wj in zip(s_neg, w)) / len(s_neg)
    return -math.log(positive / negative ** weight)


def _psl_row(s_p, s_neg, tau, tau_star, activation, w=None):
    # PSL (NeurIPS'24, method 1): log sum_j exp( sigma(d_uij) / tau_star ), d_uij = (s_j - s_p) / tau
    sigma = {"tanh": lambda x: math.log(math.tanh(x) + 1), "atan": lambda x: math.log(math.atan(x) + 1),
             "relu": lambda x: math.log(max(x + 1, 0.0))}[activation]
    w = w or [1.0] * len(s_neg)
    return math.log(sum(wj * math.exp(sigma((s - s_p) / tau) / tau_star) for s, wj in zip(s_neg, w)))


def _slatk_row(s_p, s_neg, tau, tau_w, beta, w=None, w_p=1.0):
    # SL@K (KDD'25): sigmoid((s_p - beta_u) / tau_w) * -log( exp(s_p/tau) / (exp(s_p/tau) + sum_j exp(s_j/tau)) )
    return _sl_row(s_p, s_neg, tau, w, w_p) / (1 + math.exp(-(s_p - beta) / tau_w))


def _sl_row(s_p, s_neg, tau, w=None, w_p=1.0):
    # SL: -log( exp(s_p/tau) / (exp(s_p/tau) + sum_j exp(s_j/tau)) ), each term times its 1 / E under logQ
    w = w or [1.0] * len(s_neg)
    top = w_p * math.exp(s_p / tau)
    return -math.log(top / (top + sum(wj * math.exp(s / tau) for s, wj in zip(s_neg, w))))


def _group(users, pos, user_rows, item_table, b):
    """The positives' cosines of every row of the batch whose user is row b's (BSL's positive side)."""
    return [_cos(user_rows, item_table, c, int(pos[c])) for c in range(users.numel()) if users[c] == users[b]]


def _loop(row, known, users, pos, neg, user_rows, item_table):
    total = 0.0
    for b in range(users.numel()):
        s_neg = [_cos(user_rows, item_table, b, j) for j in _negatives(known, users, neg, b)]
        total += row(b, _cos(user_rows, item_table, b, int(pos[b])), s_neg) if s_neg else 0.0
    return total / users.numel()


def _cases(known):
    beta = torch.linspace(-0.5, 0.6, NUM_USERS, dtype=torch.float64)
    slatk = SoftmaxLossAtK(known, k=3, num_negatives=DRAWS, temperature=0.3, weight_temperature=0.7)
    slatk.quantile = beta.float()
    return {
        "bsl": (BilateralSoftmaxLoss(known, num_negatives=DRAWS, temperature=0.2, negative_weight=1.3), None),
        "psl-tanh": (PairwiseSoftmaxLoss(known, num_negatives=DRAWS, temperature=2.0, robust_temperature=0.1),
                     lambda b, s_p, s_neg: _psl_row(s_p, s_neg, 2.0, 0.1, "tanh")),
        "psl-tanh-below-2": (PairwiseSoftmaxLoss(known, num_negatives=DRAWS, temperature=0.5, robust_temperature=0.2),
                             lambda b, s_p, s_neg: _psl_row(s_p, s_neg, 0.5, 0.2, "tanh")),
        "psl-atan": (PairwiseSoftmaxLoss(known, num_negatives=DRAWS, robust_temperature=0.1, activation="atan"),
                     lambda b, s_p, s_neg: _psl_row(s_p, s_neg, 2.0, 0.1, "atan")),
        "psl-relu": (PairwiseSoftmaxLoss(known, num_negatives=DRAWS, temperature=2.5, robust_temperature=0.1,
                                         activation="relu"),
                     lambda b, s_p, s_neg: _psl_row(s_p, s_neg, 2.5, 0.1, "relu")),
        "slatk": (slatk, None),  # its row needs the user's beta: below
    }


CASES = list(_cases(_problem()[0]))


@pytest.mark.parametrize("pool", [False, True], ids=["own-draws", "shared-pool"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_loss_matches_the_loop(name, backend, pool):
    known, users, pos, own, shared, user_rows, item_table = _problem()
    neg = shared if pool else own
    loss_fn, row = _cases(known)[name]
    loss_fn.backend = backend
    if name == "slatk":
        beta = loss_fn.quantile.double()
        row = lambda b, s_p, s_neg: _slatk_row(s_p, s_neg, 0.3, 0.7, float(beta[users[b]]))  # noqa: E731
    if name == "bsl":
        row = lambda b, s_p, s_neg: _bsl_row(_group(users, pos, user_rows, item_table, b), s_neg, 0.2, 1.3)  # noqa: E731
    want = _loop(row, known, users, pos, neg, user_rows, item_table)
    got = loss_fn(user_rows, item_table, users, pos, neg)
    assert got.item() == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_sparse_gives_the_dense_loss_and_gradients(name, backend):
    known, users, pos, own, pool, user_rows, item_table = _problem(1)
    loss_fn = _cases(known)[name][0]
    loss_fn.backend = backend
    results = []
    for sparse in (False, True):
        loss_fn.sparse = sparse
        rows, table = user_rows.clone().requires_grad_(), item_table.clone().requires_grad_()
        loss = loss_fn(rows, table, users, pos, own)
        loss.backward()
        assert table.grad.is_sparse == sparse
        results.append((loss.detach(), rows.grad, table.grad.to_dense() if sparse else table.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@requires_kernels
@pytest.mark.parametrize("name", CASES)
def test_backends_agree_on_gradients(name):
    """The fused kernels (cpu) and the reference give one gradient, float32 on continuous inputs."""
    known, users, pos, own, pool, user_rows, item_table = _problem(2)
    grads = []
    for backend in ("reference", "cpu"):
        loss_fn = _cases(known)[name][0]
        loss_fn.backend = backend
        rows, table = user_rows.float().requires_grad_(), item_table.float().requires_grad_()
        loss_fn(rows, table, users, pos, own).backward()
        grads.append((rows.grad, table.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_row_with_no_negative_left_adds_zero_and_a_finite_gradient():
    """A pool whose every draw is a known item of the row's user: the row has nothing to rank against."""
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 1]), torch.tensor([1, 2, 3]), 2, 6)
    rows = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    table = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    users, pos, pool = torch.tensor([0, 1]), torch.tensor([1, 3]), torch.tensor([1, 2, 2])
    for loss_fn in (BilateralSoftmaxLoss(known), PairwiseSoftmaxLoss(known), SoftmaxLossAtK(known, k=3)):
        loss = loss_fn(rows, table, users, pos, pool)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(rows.grad).all() and torch.isfinite(table.grad).all()
        alone = loss_fn(rows[1:], table, users[1:], pos[1:], pool)  # row 1 has negatives: 2 of them
        assert loss.item() == pytest.approx(alone.item() / 2, rel=1e-12)
        rows.grad = table.grad = None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weight_gradient", [True, False], ids=["through-the-weight", "weight-held"])
def test_slatk_gradient_flows_through_its_weight_or_holds_it(backend, weight_gradient):
    """The gradient against autograd over the rows written out (each row's own draws, cosines, SL's
    term and the sigmoid weight, detached for weight_gradient=False); the two settings' gradients differ."""
    known, users, pos, own, _, user_rows, item_table = _problem()
    beta = torch.linspace(-0.5, 0.6, NUM_USERS, dtype=torch.float64)
    loss_fn = SoftmaxLossAtK(known, k=3, num_negatives=DRAWS, temperature=0.3, weight_temperature=0.7,
                             weight_gradient=weight_gradient, backend=backend)
    loss_fn.quantile = beta.float()
    rows, table = user_rows.detach().requires_grad_(), item_table.detach().requires_grad_()
    got = torch.autograd.grad(loss_fn(rows, table, users, pos, own), [rows, table])

    def written_out(through_weight):
        unit_rows, unit_table = F.normalize(rows, dim=1), F.normalize(table, dim=1)
        s_p = (unit_rows * unit_table[pos]).sum(1)
        s_neg = (unit_rows[:, None, :] * unit_table[own]).sum(2)
        sl = torch.logsumexp(torch.cat([s_p[:, None], s_neg], 1) / 0.3, 1) - s_p / 0.3
        weight = torch.sigmoid((s_p - beta.float().double()[users]) / 0.7)
        row_losses = (weight if through_weight else weight.detach()) * sl
        return torch.autograd.grad(row_losses.mean(), [rows, table])

    for g, w in zip(got, written_out(weight_gradient)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(written_out(not weight_gradient)[0], got[0])


def test_slatk_quantile_is_the_kth_highest_of_known_items_and_draws():
    known, users, pos, own, pool, user_rows, item_table = _problem(3)
    loss_fn = SoftmaxLossAtK(known, k=4, num_negatives=DRAWS)
    counts = [known.count(torch.tensor([u])).item() for u in range(NUM_USERS)]
    assert loss_fn.positive_cap == int(torch.quantile(torch.tensor(counts, dtype=torch.float64), 0.9))
    loss_fn.refresh_quantile(user_rows, item_table, users, own)
    want = {}
    for b, u in enumerate(users.tolist()):
        first_known = known.entries_of(torch.tensor([u]))[1][:loss_fn.positive_cap].tolist()
        scores = sorted((_cos(user_rows, item_table, b, i) for i in first_known + own[b].tolist()), reverse=True)
        want[u] = max(want.get(u, -math.inf), scores[3])  # a user on several rows keeps the highest
    for u in range(NUM_USERS):
        assert loss_fn.quantile[u].item() == pytest.approx(want.get(u, 0.0), abs=1e-6), u


@pytest.mark.parametrize("make, message", [
    (lambda k: PairwiseSoftmaxLoss(k, activation="gelu"), "activation must be one of"),
    (lambda k: PairwiseSoftmaxLoss(k, temperature=1.0, activation="atan"), "needs temperature >= 2"),
    (lambda k: SoftmaxLossAtK(k, k=30, num_negatives=20), "k must be at most num_negatives=20"),
    (lambda k: BilateralSoftmaxLoss(k, temperature=0.0), "temperature must be a finite number > 0"),
    (lambda k: BilateralSoftmaxLoss(k, negative_weight=-1.0), "negative_weight must be a finite number > 0"),
    (lambda k: SoftmaxLossAtK(k, weight_temperature=float("nan")), "weight_temperature must be a finite number"),
])
def test_bad_arguments_are_one_line_errors(make, message):
    with pytest.raises(ValueError, match=message) as err:
        make(_problem()[0])
    assert "\n" not in str(err.value)


# ---- mixed negatives and the logQ correction ---------------------------------------------------------

@pytest.mark.parametrize("logq", [False, True], ids=["plain", "logq"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["sl", "bsl", "psl-tanh", "slatk"])
def test_mixed_negatives_match_the_loop(name, backend, logq):
    """The batch's positives join the shared pool as every row's negatives, each row's known items left
    out; with logq each term of a sum over draws is divided by its item's expected count among them,
    E_j = B * pairs_j / pairs + M / I (the positive's too where it sits in its own denominator)."""
    known, users, pos, own, pool, user_rows, item_table = _problem(4)
    pairs = torch.bincount(known.indices, minlength=NUM_ITEMS).double()
    expected = lambda j: BATCH * float(pairs[j]) / known.indices.numel() + pool.numel() / NUM_ITEMS  # noqa: E731
    beta = torch.linspace(-0.5, 0.6, NUM_USERS, dtype=torch.float64)
    common = dict(num_negatives=pool.numel(), shared_negatives=True, in_batch_negatives=True, logq=logq,
                  backend=backend)
    make = {"sl": lambda: SampledSoftmaxLoss(known, temperature=0.3, **common),
            "bsl": lambda: BilateralSoftmaxLoss(known, temperature=0.2, negative_weight=1.3, **common),
            "psl-tanh": lambda: PairwiseSoftmaxLoss(known, robust_temperature=0.1, **common),
            "slatk": lambda: SoftmaxLossAtK(known, k=3, temperature=0.3, weight_temperature=0.7, **common)}
    loss_fn = make[name]()
    if name == "slatk":
        loss_fn.quantile = beta.float()
    total = 0.0
    for b in range(BATCH):
        negatives = [j for j in pos.tolist() + pool.tolist() if not bool(known.contains(users[b], torch.tensor(j)))]
        s_p = _cos(user_rows, item_table, b, int(pos[b]))
        s_neg = [_cos(user_rows, item_table, b, j) for j in negatives]
        w = [1 / expected(j) for j in negatives] if logq else None
        w_p = 1 / expected(int(pos[b])) if logq else 1.0
        total += {"sl": lambda: _sl_row(s_p, s_neg, 0.3, w, w_p),
                  "bsl": lambda: _bsl_row(_group(users, pos, user_rows, item_table, b), s_neg, 0.2, 1.3, w),
                  "psl-tanh": lambda: _psl_row(s_p, s_neg, 2.0, 0.1, "tanh", w),
                  "slatk": lambda: _slatk_row(s_p, s_neg, 0.3, 0.7, float(loss_fn.quantile[users[b]]), w, w_p)}[name]()
    got = loss_fn(user_rows, item_table, users, pos, pool)
    assert got.item() == pytest.approx(total / BATCH, rel=1e-10)
    sparse = make[name]()
    sparse.sparse = True
    if name == "slatk":
        sparse.quantile = beta.float()
    assert sparse(user_rows, item_table, users, pos, pool).item() == pytest.approx(got.item(), rel=1e-12)


@pytest.mark.parametrize("args, message", [
    ({"in_batch_negatives": True}, "in_batch_negatives mixes the batch's positives with one uniform pool"),
    ({"logq": True, "shared_negatives": True}, "logq corrects for the in-batch negatives' popularity"),
    ({"in_batch_negatives": "yes", "shared_negatives": True}, "in_batch_negatives must be True or False"),
])
def test_mixed_negative_arguments_are_one_line_errors(args, message):
    with pytest.raises((ValueError, TypeError), match=message) as err:
        SampledSoftmaxLoss(_problem()[0], **args)
    assert "\n" not in str(err.value)


def test_mixed_negatives_refuse_each_rows_own_draws():
    known, users, pos, own, pool, user_rows, item_table = _problem()
    loss_fn = SampledSoftmaxLoss(known, shared_negatives=True, in_batch_negatives=True)
    with pytest.raises(ValueError, match=r"neg_items must be a pool \[M\], got shape \[16, 9\]"):
        loss_fn(user_rows, item_table, users, pos, own)


# ---- SL@K's schedule in the trainer ---------------------------------------------------------------

def _slatk_config(**loss_args):
    args = {"num_negatives": 20, "k": 5, "warmup_epochs": 2, "quantile_every": 2, "switch_lr_factor": 0.1,
            **loss_args}
    return TrainConfig(loss="slatk", loss_args=args, epochs=4, batch_size=256, eval_every=1, patience=10,
                       seed=3, device="cpu")


@pytest.fixture(scope="module")
def ml100k():
    return load_dataset(data_path("ml-100k"), split="rs", seed=2020)


def test_slatk_schedule_switches_lr_restarts_adam_and_refreshes_on_its_epochs(ml100k, tmp_path):
    trainer = Trainer(ml100k, _slatk_config(), tmp_path)
    seen = []
    for epoch in range(4):
        trainer.train_epoch(progress=False)
        group = trainer.optimizer.param_groups[0]
        steps = int(trainer.optimizer.state[group["params"][0]]["step"])
        seen.append((group["lr"], trainer.objective.loss_fn.weighted, steps,
                     bool(trainer.objective.loss_fn.quantile.ne(0).any())))
        trainer.epoch += 1
    per_epoch = math.ceil(ml100k.train[0].numel() / 256)
    lr = trainer.config.lr
    # warm-up (plain SL, the run's lr); then SL@K at lr * 0.1 with Adam's step count restarted;
    # the quantile is refreshed in epochs 2 and 4 (1-based), the first after the warm-up being 4
    assert seen == [(lr, False, per_epoch, False), (lr, False, 2 * per_epoch, False),
                    (pytest.approx(lr * 0.1), True, per_epoch, False), (pytest.approx(lr * 0.1), True, 2 * per_epoch, True)]


def test_slatk_resumed_across_the_switch_trains_as_an_uninterrupted_run(ml100k, tmp_path):
    whole = run(ml100k, _slatk_config(), tmp_path / "whole", progress=False, log=lambda *_: None)
    short = dataclasses.replace(_slatk_config(), epochs=2)
    run(ml100k, short, tmp_path / "resumed", progress=False, log=lambda *_: None)
    resumed = run(ml100k, _slatk_config(), tmp_path / "resumed", resume=True, progress=False, log=lambda *_: None)
    assert [h["loss"] for h in resumed["epochs"]] == [h["loss"] for h in whole["epochs"]]
    assert resumed["test"] == whole["test"]
    json.dumps(resumed["config"])  # the schedule's arguments are recorded with the run


@pytest.mark.parametrize("validate", ["deferred", "eager"])
@pytest.mark.parametrize("call, message", [
    (lambda f, u, t, users: f.refresh_quantile(u, t, users, torch.zeros(2, 9, dtype=torch.long)),
     r"neg_items must have shape \[B=16, K\] or \[M\] \(a shared pool\), got \[2, 9\]"),
    (lambda f, u, t, users: f.refresh_quantile(u, t, users, torch.full((16, 9), 99)), r"neg_items has ids outside \[0, 60\)"),
    (lambda f, u, t, users: f.refresh_quantile(u, t, users + 50, torch.zeros(16, 9, dtype=torch.long)),
     r"users has ids outside \[0, 12\)"),
    (lambda f, u, t, users: f.refresh_quantile(u, t, users, torch.zeros(16, 2, dtype=torch.long)),
     "k=3 needs at least k draws, got 2"),
])
def test_slatk_refresh_checks_its_inputs_as_a_call_does(validate, call, message):
    """refresh_quantile is public: its ids are checked as forward's are (deferred: raised at check())."""
    from pnn_fast import check_kernel_inputs

    known, users, pos, own, pool, user_rows, item_table = _problem()
    loss_fn = SoftmaxLossAtK(known, k=3, num_negatives=DRAWS, validate=validate)
    with pytest.raises(ValueError, match=message) as err:
        call(loss_fn, user_rows, item_table, users)
        check_kernel_inputs()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss_class", [SampledSoftmaxLoss, BilateralSoftmaxLoss, PairwiseSoftmaxLoss])
def test_both_ways_of_normalising_the_items_agree(monkeypatch, backend, loss_class):
    """cosine_scores normalises the whole item table once, or each gathered row inside the product on
    a catalog large for the draws: the same loss and gradients either way."""
    from pnn_fast import losses
    known, users, pos, own, _, user_rows, item_table = _problem(3)
    results = []
    for rows_per_draw in (math.inf, 0.0):  # always the whole table; always inside the product
        monkeypatch.setattr(losses, "TABLE_ROWS_PER_DRAW_TO_NORMALISE_ONCE", rows_per_draw)
        user, table = user_rows.clone().requires_grad_(), item_table.clone().requires_grad_()
        loss = loss_class(known, num_negatives=DRAWS, backend=backend)(user, table, users, pos, own)
        results.append((loss.detach(), *torch.autograd.grad(loss, (user, table))))
    for whole, inside in zip(*results):
        torch.testing.assert_close(inside, whole, rtol=1e-10, atol=1e-12)
