"""The table-lookup ops of a training step (unknown_items, embedding_bpr, gathered_norm) against
independent definitions, the reference backend, gradcheck, thread-count determinism and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pnn_fast import BPRLoss, KnownPositives, _extension, embedding_bpr
from pnn_fast.backends import reference
from pnn_fast.sampling import sample_unknown, unknown_from_uniform

pytestmark = pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")

if _extension.has_kernels("cpu"):
    from pnn_fast import ops

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _extension.has_kernels("cuda") else [])


def small_known(device="cpu") -> KnownPositives:
    """Users with no item, the first item, the last item, every item but one, and a random few."""
    items = {0: [], 1: [0], 2: [9], 3: [0, 1, 2, 3, 4, 5, 6, 8, 9], 4: [2, 3, 7]}
    users = [u for u, its in items.items() for _ in its]
    flat = [i for its in items.values() for i in its]
    return KnownPositives.from_pairs(torch.tensor(users), torch.tensor(flat), 5, 10).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_unknown_from_uniform_enumerates_the_unknown_items(device, backend):
    known = small_known(device)
    for user in range(5):
        unknown = sorted(set(range(10)) - set(known.indices[known.indptr[user]:known.indptr[user + 1]].tolist()))
        # the middle of each rank's interval, and its two ends (0 and the largest float32 below 1)
        middle = (torch.arange(len(unknown), dtype=torch.float32) + 0.5) / len(unknown)
        ends = torch.tensor([0.0, 1.0 - 2.0**-24])
        uniform = torch.cat([middle, ends]).to(device)[None, :]
        got = unknown_from_uniform(known, torch.tensor([user], device=device), uniform, backend)
        assert got.tolist() == [unknown + [unknown[0], unknown[-1]]], (user, backend)


def test_kernel_and_reference_samplers_agree_on_real_sizes():
    gen = torch.Generator().manual_seed(3)
    users = torch.randint(0, 300, (20000,), generator=gen)
    items = torch.randint(0, 2000, (20000,), generator=gen)
    known = KnownPositives.from_pairs(users, items, 300, 2000)
    batch = torch.randint(0, 300, (4096,), generator=gen)
    uniform = torch.rand(4096, 5, generator=gen)
    fused = unknown_from_uniform(known, batch, uniform, "cpu")
    assert torch.equal(fused, unknown_from_uniform(known, batch, uniform, "reference"))
    assert not known.contains(batch[:, None], fused).any()
    assert torch.equal(sample_unknown(known, batch, 3, torch.Generator().manual_seed(1), backend="cpu"),
                       sample_unknown(known, batch, 3, torch.Generator().manual_seed(1), backend="reference"))


def test_unknown_items_rejects_bad_draws_and_users():
    full = KnownPositives.from_pairs(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]), 2, 2)  # user 0 knows all
    with pytest.raises(RuntimeError, match="every user must have an unknown item"):
        ops.unknown_items(full, torch.tensor([0]), torch.tensor([[0.5]]))
    known = small_known()
    for bad in (1.0, -0.25, float("nan")):
        with pytest.raises(RuntimeError, match=r"uniform must lie in \[0, 1\)"):
            ops.unknown_items(known, torch.tensor([0]), torch.tensor([[bad]]))
    with pytest.raises(RuntimeError, match="users has ids outside"):
        ops.unknown_items(known, torch.tensor([5]), torch.tensor([[0.0]]))
    with pytest.raises(RuntimeError, match="uniform must be Float"):
        ops.unknown_items(known, torch.tensor([0]), torch.tensor([[0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="backend must be one of"):
        unknown_from_uniform(known, torch.tensor([0]), torch.tensor([[0.0]]), "gpu")


def bpr_inputs(dtype=torch.float64, device="cpu", rows=64, negatives=3, seed=0):
    """Tables and ids with many repeated users and items (so the scatter has to add up)."""
    gen = torch.Generator().manual_seed(seed)
    user_table = torch.randn(12, 7, generator=gen, dtype=torch.float64).to(dtype).to(device)
    item_table = torch.randn(30, 7, generator=gen, dtype=torch.float64).to(dtype).to(device)
    users = torch.randint(0, 12, (rows,), generator=gen).to(device)
    pos = torch.randint(0, 30, (rows,), generator=gen).to(device)
    neg = torch.randint(0, 30, (rows, negatives), generator=gen).to(device)
    return user_table, item_table, users, pos, neg


def bpr_by_loops(user_table, item_table, users, pos, neg):
    """The definition, one (row, negative) pair at a time."""
    terms = [F.softplus(item_table[n] @ user_table[u] - item_table[p] @ user_table[u])
             for u, p, row in zip(users.tolist(), pos.tolist(), neg.tolist()) for n in row]
    return torch.stack(terms).mean()


def value_and_grads(fn, user_table, item_table, *ids):
    u, i = user_table.clone().requires_grad_(), item_table.clone().requires_grad_()
    value = fn(u, i, *ids)
    value.backward()
    return value.detach(), u.grad, i.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("negatives", [1, 4])
def test_embedding_bpr_matches_the_definition_float64(device, negatives):
    inputs = bpr_inputs(device=device, negatives=negatives)
    expected = value_and_grads(bpr_by_loops, *inputs)
    for fn in (ops.embedding_bpr, reference.embedding_bpr):
        for got, want in zip(value_and_grads(fn, *inputs), expected):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_bpr_float32_and_large_scores(device):
    user_table, item_table, *ids = bpr_inputs(dtype=torch.float32, device=device, rows=300)
    item_table = item_table * 8  # pushes some s_neg - s_pos above softplus' threshold of 20
    got = value_and_grads(ops.embedding_bpr, user_table, item_table, *ids)
    want = value_and_grads(reference.embedding_bpr, user_table, item_table, *ids)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("negatives", [1, 3])
def test_embedding_bpr_with_embloss_matches_recbole_form(device, negatives):
    """reg_weight adds RecBole's EmbLoss of U[users], I[pos], I[neg] (each its own Frobenius norm) / B."""
    inputs = bpr_inputs(device=device, negatives=negatives)
    user_table, item_table, users, pos, neg = inputs

    def by_definition(u, i, users, pos, neg):
        embloss = u[users].norm() + i[pos].norm() + i[neg].norm()
        return bpr_by_loops(u, i, users, pos, neg) + 0.25 * embloss / users.numel()

    expected = value_and_grads(by_definition, *inputs)
    for fn in (ops.embedding_bpr, reference.embedding_bpr):
        got = value_and_grads(lambda *a: fn(*a, reg_weight=0.25), *inputs)
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # a table of zeros: norm 0, whose gradient torch takes as 0 (not NaN)
    zero_items = torch.zeros_like(item_table)
    got = value_and_grads(lambda *a: ops.embedding_bpr(*a, reg_weight=0.25), user_table, zero_items, users, pos, neg)
    want = value_and_grads(lambda *a: reference.embedding_bpr(*a, reg_weight=0.25), user_table, zero_items, users,
                           pos, neg)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reg_weight", [0.0, 0.5])
def test_embedding_bpr_gradcheck(reg_weight):
    inputs = bpr_inputs(rows=9, negatives=2)
    tables = tuple(t.clone().requires_grad_() for t in inputs[:2])
    assert torch.autograd.gradcheck(lambda u, i: ops.embedding_bpr(u, i, *inputs[2:], reg_weight=reg_weight), tables)


def test_cpu_scatter_is_the_same_for_any_thread_count():
    user_table, item_table, users, pos, neg = bpr_inputs(dtype=torch.float32, rows=20000, negatives=2, seed=4)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            results.append(value_and_grads(lambda *a: ops.embedding_bpr(*a, reg_weight=0.1), user_table, item_table,
                                           users, pos, neg)
                           + value_and_grads(lambda u, i, ids: ops.gathered_norm(u, ids) + ops.gathered_norm(i, ids),
                                             user_table, item_table[:12], users))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("device", DEVICES)
def test_gathered_norm(device):
    table = torch.randn(10, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    ids = torch.tensor([3, 3, 0, 9, 3], device=device)
    expected = value_and_grads(lambda t, _, i: torch.sqrt(sum((t[j] ** 2).sum() for j in i.tolist())), table, table,
                               ids)
    got = value_and_grads(lambda t, _, i: ops.gathered_norm(t, i), table, table, ids)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-15)
    zero = torch.zeros(4, 3, dtype=torch.float64, device=device, requires_grad=True)
    ops.gathered_norm(zero, torch.tensor([1, 2], device=device)).backward()
    assert not zero.grad.any()  # torch's norm has gradient 0 at the origin, not NaN
    assert ops.gathered_norm(table, ids[:0]).item() == 0.0
    assert torch.autograd.gradcheck(lambda t: ops.gathered_norm(t, ids), (table.clone().requires_grad_(),))


def test_bpr_loss_and_embedding_bpr_agree_on_every_backend():
    user_table, item_table, users, pos, neg = bpr_inputs(dtype=torch.float32, rows=50)
    rows = user_table[users]
    values = [BPRLoss(backend=b)(rows, item_table, pos.int(), neg.int()) for b in ("reference", "cpu")]
    values += [embedding_bpr(user_table, item_table, users, pos, neg, backend=b) for b in ("reference", "cpu")]
    for value in values[1:]:
        torch.testing.assert_close(value, values[0], rtol=1e-6, atol=0)
    # non-contiguous tables and a [B] negative column
    wide = torch.stack([item_table, -item_table], dim=2)[:, :, 0]  # item_table's values, stride 2
    assert not wide.is_contiguous()
    torch.testing.assert_close(embedding_bpr(user_table, wide, users, pos, neg[:, 0]),
                               embedding_bpr(user_table, item_table, users, pos, neg[:, :1], backend="reference"))


def test_embedding_bpr_bad_input_names_the_argument():
    user_table, item_table, users, pos, neg = bpr_inputs(rows=5)
    with pytest.raises(ValueError, match="users"):
        embedding_bpr(user_table, item_table, users + 100, pos, neg)
    with pytest.raises(ValueError, match="neg_items"):
        embedding_bpr(user_table, item_table, users, pos, neg[:4])
    with pytest.raises(ValueError, match="neg_items"):
        embedding_bpr(user_table, item_table, users, pos, neg[:, :0])
    with pytest.raises(TypeError, match="item_table has dtype"):
        embedding_bpr(user_table, item_table.float(), users, pos, neg)
    with pytest.raises(TypeError, match="pos_items must be int32 or int64"):
        embedding_bpr(user_table, item_table, users, pos.float(), neg)
    with pytest.raises(ValueError, match="empty"):
        embedding_bpr(user_table, item_table, users[:0], pos[:0], neg[:0])
    with pytest.raises(RuntimeError, match="neg_items has ids outside"):
        torch.ops.pnn_fast.embedding_bpr_fwd(user_table, item_table, users, pos, neg - 100, 0.0)
    for bad in (-1e-4, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="reg_weight"):
            embedding_bpr(user_table, item_table, users, pos, neg, reg_weight=bad)
    with pytest.raises(RuntimeError, match="reg_weight must be finite"):
        torch.ops.pnn_fast.embedding_bpr_fwd(user_table, item_table, users, pos, neg, -1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots_matches_the_definition_and_gradcheck(device):
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(40, 7, dtype=torch.float64, generator=gen).to(device)
    table = torch.randn(9, 7, dtype=torch.float64, generator=gen).to(device)
    ids = torch.randint(0, 9, (40, 6), generator=gen).to(device)  # many repeats per table row

    def by_loops(r, t, i):
        return torch.stack([torch.stack([r[b] @ t[j] for j in i[b].tolist()]) for b in range(r.shape[0])])

    expected = value_and_grads(lambda r, t, i: (by_loops(r, t, i) ** 2).sum(), rows, table, ids)
    for fn in (ops.gathered_dots, reference.gathered_dots):
        got = value_and_grads(lambda r, t, i: (fn(r, t, i) ** 2).sum(), rows, table, ids)
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    inputs = (rows[:5].clone().requires_grad_(), table.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda r, t: ops.gathered_dots(r, t, ids[:5]), inputs)
    with pytest.raises(RuntimeError, match="ids has ids outside"):
        ops.gathered_dots(rows, table, ids + 9)
    with pytest.raises(TypeError, match="table has dtype"):
        ops.gathered_dots(rows, table.float(), ids)


def test_gathered_dots_gradients_do_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(6)
    rows, table = torch.randn(3000, 64, generator=gen), torch.randn(50, 64, generator=gen)
    ids = torch.randint(0, 50, (3000, 20), generator=gen)
    weights = torch.randn(3000, 20, generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            results.append(value_and_grads(lambda r, t, i: (ops.gathered_dots(r, t, i) * weights).sum(), rows, table,
                                           ids))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def history_known() -> KnownPositives:
    """Users with 0, 1, 3, 5 (= L), 6, 40 and 300 known items among 400."""
    gen = torch.Generator().manual_seed(9)
    sizes = [0, 1, 3, 5, 6, 40, 300]
    users = torch.cat([torch.full((n,), u) for u, n in enumerate(sizes)])
    items = torch.cat([torch.randperm(400, generator=gen)[:n] for n in sizes])
    return KnownPositives.from_pairs(users, items, len(sizes), 400)


@pytest.mark.parametrize("device", DEVICES)
def test_history_sample_is_a_subset_of_min_n_l_known_items_and_matches_the_reference(device):
    known = history_known().to(device)
    users = torch.tensor([6, 0, 5, 1, 6, 2, 4, 3, 5], device=device)
    uniform = torch.rand(users.numel(), 5, generator=torch.Generator().manual_seed(4)).to(device)
    got = ops.history_sample(known, users, uniform)
    assert torch.equal(got, reference.history_sample(known, users, uniform))
    for row, user in zip(got.tolist(), users.tolist()):
        mine = set(known.indices[known.indptr[user]:known.indptr[user + 1]].tolist())
        taken = [i for i in row if i >= 0]
        assert len(taken) == min(len(mine), 5) and len(set(taken)) == len(taken) and set(taken) <= mine
        assert row[len(taken):] == [-1] * (5 - len(taken))
    # the same draws give the same subsets; the ends of [0, 1) are valid draws
    ends = torch.tensor([[0.0, 1.0 - 2.0**-24] * 2 + [0.0]], device=device).expand(users.numel(), -1).contiguous()
    assert torch.equal(ops.history_sample(known, users, ends), reference.history_sample(known, users, ends))


def test_history_sample_draws_every_subset_equally_often():
    """6 items, subsets of 3: each of the 20 subsets about 1/20 of 20000 draws (fixed seed)."""
    known = KnownPositives.from_pairs(torch.zeros(6, dtype=torch.long), torch.arange(6), 1, 6)
    uniform = torch.rand(20000, 3, generator=torch.Generator().manual_seed(0))
    subsets = ops.history_sample(known, torch.zeros(20000, dtype=torch.long), uniform).sort(dim=1).values
    keys = (subsets * torch.tensor([36, 6, 1])).sum(dim=1)
    counts = torch.bincount(keys, minlength=216)
    counts = counts[counts > 0]
    assert counts.numel() == 20
    chi2 = ((counts - 1000.0) ** 2 / 1000.0).sum().item()
    assert chi2 < 43.8  # the 0.999 quantile of chi-square with 19 degrees of freedom


def test_history_sample_rejects_bad_draws():
    known = history_known()
    users = torch.tensor([6, 2])
    for bad in (1.0, -0.5, float("nan")):
        with pytest.raises(RuntimeError, match=r"uniform must lie in \[0, 1\)"):
            ops.history_sample(known, users, torch.full((2, 4), bad))
    with pytest.raises(RuntimeError, match="uniform"):
        ops.history_sample(known, users, torch.rand(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="users has ids outside"):
        ops.history_sample(known, torch.tensor([7, 0]), torch.rand(2, 4))
