"""Bad input gets a clear error naming the argument; KnownPositives; BPR and DNS losses."""
import pytest
import torch
import torch.nn.functional as F

from pnn_fast import BPRLoss, DNSLoss, KnownPositives, PNNLoss
from pnn_fast.sampling import sample_unknown
from slow_pnn import known_sets, slow_rows


@pytest.fixture
def setup():
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 1, 2]), torch.tensor([1, 3, 2, 0]), 3, 6)
    loss_fn = PNNLoss(known, 4, backend="reference")
    args = dict(user_emb=torch.randn(3, 4), item_table=torch.randn(6, 4), users=torch.tensor([0, 1, 2]),
                pos_items=torch.tensor([1, 2, 0]))
    return loss_fn, args


def _call(loss_fn, args, **overrides):
    kwargs = dict(args, **overrides)
    return loss_fn(kwargs.pop("user_emb"), kwargs.pop("item_table"), kwargs.pop("users"), kwargs.pop("pos_items"), **kwargs)


@pytest.mark.parametrize("override, error, name", [
    (dict(user_emb=torch.randn(3, 5)), ValueError, "user_emb"),
    (dict(user_emb=torch.randn(3, 4, 1)), ValueError, "user_emb"),
    (dict(user_emb=torch.randn(0, 4), users=torch.zeros(0, dtype=torch.long), pos_items=torch.zeros(0, dtype=torch.long)), ValueError, "empty"),
    (dict(item_table=torch.randn(7, 4)), ValueError, "item_table"),
    (dict(item_table=torch.randn(6, 3)), ValueError, "item_table"),
    (dict(item_table=torch.randn(6, 4, dtype=torch.float64)), TypeError, "item_table"),
    (dict(users=torch.tensor([0, 1])), ValueError, "users"),
    (dict(users=torch.tensor([0.0, 1.0, 2.0])), TypeError, "users"),
    (dict(users=torch.tensor([0, 1, 3])), ValueError, "users"),
    (dict(users=torch.tensor([0, -1, 2])), ValueError, "users"),
    (dict(pos_items=torch.tensor([1, 2, 6])), ValueError, "pos_items"),
    (dict(pos_items=[1, 2, 0]), TypeError, "pos_items"),
    (dict(neg_items=torch.tensor([[1, 2], [3, 9], [0, 0]])), ValueError, "neg_items"),
    (dict(neg_items=torch.tensor([1, 2, 3])), ValueError, "neg_items"),
    (dict(neg_items=torch.zeros(3, 0, dtype=torch.long)), ValueError, "neg_items"),
    (dict(user_emb=torch.tensor([[float("nan")] * 4] * 3)), ValueError, "user_emb"),
    (dict(item_table=torch.full((6, 4), float("inf"))), ValueError, "item_table"),
    (dict(user_emb=torch.randint(0, 3, (3, 4))), TypeError, "user_emb"),
    (dict(noise=(torch.rand(3, 4),)), TypeError, "noise"),
    (dict(noise=(torch.rand(3, 4), torch.rand(2, 4))), ValueError, "noise_neg"),
])
def test_bad_input_names_the_argument(setup, override, error, name):
    loss_fn, args = setup
    with pytest.raises(error, match=name):
        _call(loss_fn, args, **override)


@pytest.mark.parametrize("kwargs, name", [
    (dict(neg_size="all"), "neg_size"), (dict(neg_size=-1), "neg_size"), (dict(lambda_mode="x"), "lambda_mode"),
    (dict(fixed_lambda=1.5), "fixed_lambda"), (dict(history_len=0), "history_len"), (dict(backend="gpu"), "backend"),
    (dict(noise_max=-0.1), "noise_max"),
])
def test_bad_constructor_argument(kwargs, name):
    known = KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([0]), 1, 2)
    with pytest.raises(ValueError, match=name):
        PNNLoss(known, 4, **kwargs)
    with pytest.raises(ValueError, match="dim"):
        PNNLoss(known, 0)
    with pytest.raises(TypeError, match="known"):
        PNNLoss("not known", 4)


def test_backend_for_wrong_device_is_refused(setup):
    _, args = setup
    loss_fn = PNNLoss(KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([0]), 3, 6), 4, backend="cuda")
    with pytest.raises((ValueError, RuntimeError), match="cuda"):
        _call(loss_fn, args)


def test_int32_ids_give_the_same_loss(setup):
    loss_fn, args = setup
    noise = (torch.rand(3, 4), torch.rand(3, 4))
    loss_fn.lambda_mode, loss_fn.attention = "fixed", None
    a = _call(loss_fn, args, noise=noise)
    b = _call(loss_fn, args, users=args["users"].int(), pos_items=args["pos_items"].int(), noise=noise)
    assert a == b


def test_known_positives_csr_and_queries():
    users = torch.tensor([2, 0, 2, 2, 0])
    items = torch.tensor([4, 1, 0, 4, 3])  # (2, 4) twice
    known = KnownPositives.from_pairs(users, items, 4, 5)
    assert known.indptr.tolist() == [0, 2, 2, 4, 4]
    assert known.indices.tolist() == [1, 3, 0, 4]
    assert known.count(torch.tensor([0, 1, 2, 3])).tolist() == [2, 0, 2, 0]
    q_users = torch.tensor([[0], [2], [3]])
    q_items = torch.tensor([[0, 1, 3, 4]])
    assert known.contains(q_users, q_items).tolist() == [
        [False, True, True, False], [True, False, False, True], [False, False, False, False]]
    assert known.to("cpu") is known
    with pytest.raises(ValueError, match="item_ids"):
        KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([5]), 1, 5)
    with pytest.raises(ValueError, match="user_ids"):
        KnownPositives.from_pairs(torch.tensor([-1]), torch.tensor([0]), 1, 5)
    with pytest.raises(ValueError, match="sorted"):
        KnownPositives(torch.tensor([0, 2]), torch.tensor([3, 1]), 1, 5)
    with pytest.raises(ValueError, match="indptr"):
        KnownPositives(torch.tensor([0, 2]), torch.tensor([1, 3]), 2, 5)


def test_bpr_loss_matches_formula():
    torch.manual_seed(0)
    ue, it = torch.randn(4, 3), torch.randn(7, 3)
    pos, neg = torch.tensor([0, 1, 2, 3]), torch.tensor([[4, 5], [6, 4], [5, 5], [0, 1]])
    expected = torch.stack([F.softplus(ue[b] @ it[neg[b, k]] - ue[b] @ it[pos[b]]) for b in range(4) for k in range(2)]).mean()
    torch.testing.assert_close(BPRLoss()(ue, it, pos, neg), expected)
    torch.testing.assert_close(BPRLoss()(ue, it, pos, neg[:, 0]), torch.stack(
        [F.softplus(ue[b] @ it[neg[b, 0]] - ue[b] @ it[pos[b]]) for b in range(4)]).mean())
    with pytest.raises(ValueError, match="neg_items"):
        BPRLoss()(ue, it, pos, torch.tensor([[9, 1]] * 4))
    with pytest.raises(ValueError, match="item_table"):
        BPRLoss()(ue, torch.randn(7, 2), pos, neg)


@pytest.mark.parametrize("k", [None, 3])
def test_dns_loss_matches_pnn_bpr_rows(k):
    g = torch.Generator().manual_seed(4)
    ku, ki = torch.randint(0, 5, (15,), generator=g), torch.randint(0, 12, (15,), generator=g)
    known = KnownPositives.from_pairs(ku, ki, 5, 12)
    users, pos = torch.randint(0, 5, (10,), generator=g), torch.randint(0, 12, (10,), generator=g)
    neg = None if k is None else torch.randint(0, 12, (10, k), generator=g)
    ue, it = torch.randn(10, 4, generator=g, dtype=torch.float64), torch.randn(12, 4, generator=g, dtype=torch.float64)
    noise = torch.zeros(10, 4, dtype=torch.float64)
    rows = slow_rows(ue, it, users, pos, pos if neg is None else neg, known_sets(ku, ki), 12, 1, noise, noise)
    valid_bpr = [b for b, ok in zip(rows["bpr"], rows["valid"]) if ok]
    torch.testing.assert_close(DNSLoss(known, backend="reference")(ue, it, users, pos, neg), torch.stack(valid_bpr).mean())


def test_sample_unknown_is_uniform_over_unknown_items():
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 2, 3, 5]), 3, 6)
    g = torch.Generator().manual_seed(0)
    draws = sample_unknown(known, torch.tensor([0, 1, 2]), 30000, generator=g)
    for row, allowed in enumerate([{1, 4, 5}, {0, 1, 2, 3, 4}, set(range(6))]):
        values, counts = draws[row].unique(return_counts=True)
        assert set(values.tolist()) == allowed
        freq = counts.double() / counts.sum()
        assert torch.allclose(freq, torch.full_like(freq, 1 / len(allowed)), atol=0.015)
