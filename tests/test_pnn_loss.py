"""PNNLoss (reference backend) against the slow per-row implementation, edge rows, gradcheck."""
import pytest
import torch

import pnn_fast
from pnn_fast import KnownPositives, PNNLoss
from pnn_fast.sampling import sample_history
from slow_pnn import known_sets, slow_lambda, slow_loss, slow_rows, slow_uniform

NEG_SIZES = ["proportional", "count", 3, 0]


def make_problem(seed, batch=24, num_users=9, num_items=30, dim=5, known_per_user=6, k=None, dtype=torch.float64):
    """Random batch with repeated users and items; small item space so known items collide with candidates."""
    g = torch.Generator().manual_seed(seed)
    ku = torch.randint(0, num_users, (num_users * known_per_user,), generator=g)
    ki = torch.randint(0, num_items, (num_users * known_per_user,), generator=g)
    known = KnownPositives.from_pairs(ku, ki, num_users, num_items)
    users = torch.randint(0, num_users, (batch,), generator=g)
    pos = torch.randint(0, num_items, (batch,), generator=g)
    user_emb = torch.randn(batch, dim, generator=g, dtype=dtype)
    item_table = torch.randn(num_items, dim, generator=g, dtype=dtype)
    neg = None if k is None else torch.randint(0, num_items, (batch, k), generator=g)
    noise = (torch.rand(batch, dim, generator=g, dtype=dtype) * 0.1, torch.rand(batch, dim, generator=g, dtype=dtype) * 0.1)
    return dict(known=known, sets=known_sets(ku, ki), users=users, pos=pos, user_emb=user_emb,
                item_table=item_table, neg=neg, noise=noise, num_items=num_items, dim=dim)


def run_both(p, neg_size, lambda_mode="fixed", alpha=0.8, beta=0.6):
    torch.manual_seed(0)
    loss_fn = PNNLoss(p["known"], p["dim"], alpha=alpha, beta=beta, neg_size=neg_size, lambda_mode=lambda_mode,
                      fixed_lambda=0.3, history_len=1000, backend="reference").double()
    ue = p["user_emb"].clone().requires_grad_()
    it = p["item_table"].clone().requires_grad_()
    loss, comp = loss_fn(ue, it, p["users"], p["pos"], p["neg"], noise=p["noise"], return_components=True)

    ue2 = p["user_emb"].clone().requires_grad_()
    it2 = p["item_table"].clone().requires_grad_()
    cands = p["pos"] if p["neg"] is None else p["neg"]
    rows = slow_rows(ue2, it2, p["users"], p["pos"], cands, p["sets"], p["num_items"], neg_size, *p["noise"])
    uniform = slow_uniform(it2, cands, 2.0, True)
    if lambda_mode == "fixed":
        lams = [torch.tensor(0.3, dtype=torch.float64)] * p["users"].numel()
    else:
        lams = slow_lambda(loss_fn.attention, ue2, it2, p["users"], p["sets"])
    slow = slow_loss(rows, uniform, lams, alpha, beta)
    return (loss, comp, ue, it), (slow, rows, uniform, lams, ue2, it2)


@pytest.mark.parametrize("neg_size", NEG_SIZES)
@pytest.mark.parametrize("k", [None, 8])
@pytest.mark.parametrize("lambda_mode", ["fixed", "attention"])
def test_components_loss_and_grads_match_slow_loop(neg_size, k, lambda_mode):
    p = make_problem(seed=hash((str(neg_size), k, lambda_mode)) % 1000, k=k)
    (loss, comp, ue, it), (slow, rows, uniform, lams, ue2, it2) = run_both(p, neg_size, lambda_mode)
    for key in ("bpr", "rank", "constrain"):
        torch.testing.assert_close(comp[key], torch.stack(rows[key]).reshape(-1), rtol=1e-10, atol=1e-12, msg=key)
    for key in ("hard_negative", "num_negative", "num_neutral"):
        assert comp[key].tolist() == rows[key], key
    assert comp["valid"].tolist() == rows["valid"]
    torch.testing.assert_close(comp["uniform"], uniform, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(comp["lambda"], torch.stack(lams).reshape(-1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, slow, rtol=1e-10, atol=1e-12)
    loss.backward()
    slow.backward()
    torch.testing.assert_close(ue.grad, ue2.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(it.grad, it2.grad, rtol=1e-8, atol=1e-10)


def test_problem_exercises_edge_rows():
    """The random problems above do contain rows with 0, 1 and many unlabeled candidates."""
    p = make_problem(seed=3, k=2, known_per_user=20)
    _, comp, *_ = run_both(p, "proportional")[0]
    n_unl = comp["num_negative"] + comp["num_neutral"]
    assert (n_unl == 0).any() and (n_unl == 1).any() and (n_unl == 2).any()


def _tiny_known():
    # user 0 knows items 0,1; user 1 knows item 2
    return KnownPositives.from_pairs(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2]), 2, 6)


def test_row_with_one_unlabeled_keeps_first_rank_term_only():
    known = _tiny_known()
    loss_fn = PNNLoss(known, 2, lambda_mode="fixed", fixed_lambda=1.0, alpha=1.0, beta=0.0, backend="reference")
    user_emb = torch.tensor([[1.0, 0.5]])
    item_table = torch.randn(6, 2)
    # candidates: 0, 1 known; 3 is the positive; only item 4 is unlabeled
    loss, comp = loss_fn(user_emb, item_table, torch.tensor([0]), torch.tensor([3]), torch.tensor([[0, 1, 3, 4]]),
                         return_components=True)
    assert comp["num_negative"].tolist() == [0] and comp["num_neutral"].tolist() == [1]
    assert comp["hard_negative"].tolist() == [3] and comp["constrain"].tolist() == [0.0]
    s_pos = user_emb[0] @ item_table[3]
    expected = torch.nn.functional.softplus(user_emb[0] @ item_table[4] - s_pos)
    torch.testing.assert_close(comp["rank"][0], expected)
    torch.testing.assert_close(loss, expected)  # lambda 1, beta 0: the loss is the rank term


def test_rows_without_unlabeled_contribute_nothing():
    known = _tiny_known()
    loss_fn = PNNLoss(known, 2, lambda_mode="fixed", backend="reference")
    item_table = torch.randn(6, 2, requires_grad=True)
    user_emb = torch.randn(2, 2, requires_grad=True)
    users, pos = torch.tensor([0, 0]), torch.tensor([3, 4])
    neg = torch.tensor([[0, 1, 3], [4, 5, 5]])  # row 0: nothing unlabeled; row 1: items 5, 5
    loss, comp = loss_fn(user_emb, item_table, users, pos, neg, return_components=True)
    assert comp["valid"].tolist() == [False, True]
    assert comp["hard_negative"].tolist() == [-1, 1]  # ties between the two copies of item 5: smallest j
    assert comp["bpr"][0] == 0 and comp["rank"][0] == 0 and comp["constrain"][0] == 0
    row1 = 0.5 * comp["bpr"][1] + 0.5 * (0.8 * comp["constrain"][1] + 0.6 * comp["uniform"] + comp["rank"][1])
    torch.testing.assert_close(loss, row1)  # the mean runs over the valid row only
    loss.backward()
    assert torch.all(user_emb.grad[0] == 0)


def test_no_valid_row_gives_zero_loss_with_gradient():
    known = _tiny_known()
    loss_fn = PNNLoss(known, 2, backend="reference")
    user_emb = torch.randn(1, 2, requires_grad=True)
    loss = loss_fn(user_emb, torch.randn(6, 2), torch.tensor([0]), torch.tensor([3]), torch.tensor([[0, 1, 3]]))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.all(user_emb.grad == 0)


def test_in_batch_candidates_exclude_own_positive_and_known():
    known = _tiny_known()
    loss_fn = PNNLoss(known, 2, lambda_mode="fixed", backend="reference")
    users, pos = torch.tensor([0, 1, 1]), torch.tensor([3, 0, 2])
    _, comp = loss_fn(torch.randn(3, 2), torch.randn(6, 2), users, pos, return_components=True)
    # candidates are 3, 0, 2 for every row. row 0 (user 0 knows 0, 1; own 3): {2};
    # row 1 (user 1 knows 2; own 0): {3}; row 2 (user 1; own 2): {3, 0}
    n_unl = (comp["num_negative"] + comp["num_neutral"]).tolist()
    assert n_unl == [1, 1, 2]
    assert comp["hard_negative"][0].item() == 2


def test_gradcheck_float64():
    p = make_problem(seed=11, batch=6, num_users=4, num_items=12, dim=3, known_per_user=2, k=5)
    loss_fn = PNNLoss(p["known"], p["dim"], neg_size="proportional", history_len=100, backend="reference").double()

    def f(ue, it):
        return loss_fn(ue, it, p["users"], p["pos"], p["neg"], noise=p["noise"])

    ue = p["user_emb"].clone().requires_grad_()
    it = p["item_table"].clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (ue, it), eps=1e-6, atol=1e-6)


def test_attention_parameters_get_gradients_and_stay_positive():
    p = make_problem(seed=5, k=None)
    loss_fn = PNNLoss(p["known"], p["dim"], backend="reference").double()
    loss = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"])
    loss.backward()
    for name in ("raw_w1", "raw_w2", "bias"):
        grad = getattr(loss_fn.attention, name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    assert (loss_fn.attention.w1 > 0).all() and (loss_fn.attention.w2 > 0).all()


def test_history_subset_is_random_subset_of_known():
    known = KnownPositives.from_pairs(torch.zeros(40, dtype=torch.long), torch.arange(40), 2, 50)
    users = torch.tensor([0, 1])
    items, mask = sample_history(known, users, 10)
    assert mask[0].all() and not mask[1].any()
    assert len(set(items[0].tolist())) == 10 and set(items[0].tolist()) <= set(range(40))
    items2, _ = sample_history(known, users, 10)
    assert items[0].tolist() != items2[0].tolist()  # fresh sample each call (fails with prob ~1e-14)


def test_noise_is_drawn_in_range_when_not_given():
    p = make_problem(seed=2, k=4)
    loss_fn = PNNLoss(p["known"], p["dim"], noise_max=0.0, lambda_mode="fixed", backend="reference").double()
    _, comp = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"], return_components=True)
    assert torch.all(comp["constrain"] == 0)  # zero-magnitude noise: the two clamps coincide
    loss_fn.noise_max = 0.1
    _, comp = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"], return_components=True)
    has_neg = comp["num_negative"] > 0
    assert torch.all(comp["constrain"][has_neg] > 0)
    assert torch.all(comp["constrain"] <= 4 * 0.1 ** 2 * p["dim"])


@pytest.mark.parametrize("per_row", [False, True])
def test_repeated_candidates_tie_exactly_and_smallest_index_wins(per_row):
    """A repeated item must get bit-identical scores wherever it stands, so ties follow the rule."""
    g = torch.Generator().manual_seed(7)
    user_emb, item_table = torch.randn(64, 67, generator=g, dtype=torch.float64), torch.randn(40, 67, generator=g, dtype=torch.float64)
    candidates = torch.randint(0, 40, (64, 50) if per_row else (200,), generator=g)
    scores = pnn_fast.backends.reference.row_scores(user_emb, item_table, candidates)
    cands = candidates.expand(64, -1)
    same_item = cands[:, :, None] == cands[:, None, :]
    assert torch.equal(scores[:, :, None].expand_as(same_item)[same_item], scores[:, None, :].expand_as(same_item)[same_item])
    hard = pnn_fast.backends.reference.hard_negative(scores, torch.ones_like(scores, dtype=torch.bool))
    first = (cands == cands.gather(1, hard[:, None])).long().argmax(dim=1)
    assert torch.equal(hard, first)  # the first occurrence of the winning item


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_attention_matches_the_papers_formula(backend):
    """lambda_u = sigmoid(w1 . sum_h a_h e_h), a = softmax_h(e_u . tanh(W2 e_h + b)), by loops over a
    history shorter than history_len (so it is every known item), and 0.5 for a user without one."""
    if backend == "cpu" and not pnn_fast._extension.has_kernels("cpu"):
        pytest.skip("pnn_fast._C is not built")
    g = torch.Generator().manual_seed(11)
    known_items = {0: [1, 4, 7], 1: [0], 2: [], 3: [2, 3, 4, 5, 6, 8]}
    users = torch.tensor([u for u, its in known_items.items() for _ in its])
    known = KnownPositives.from_pairs(users, torch.tensor([i for its in known_items.values() for i in its]), 4, 9)
    att = pnn_fast.UserAwareAttention(5, history_len=8).double()
    with torch.no_grad():
        att.bias.copy_(torch.randn(5, generator=g, dtype=torch.float64))
    item_table = torch.randn(9, 5, generator=g, dtype=torch.float64)
    batch_users = torch.tensor([3, 0, 2, 1, 3])
    user_emb = torch.randn(5, 5, generator=g, dtype=torch.float64)
    got = att(user_emb, item_table, batch_users, known, backend)
    w1, w2 = att.w1.detach(), att.w2.detach()
    for b, u in enumerate(batch_users.tolist()):
        hist = item_table[known_items[u]]
        if not known_items[u]:
            want = torch.tensor(0.5, dtype=torch.float64)
        else:
            a = torch.softmax(torch.stack([user_emb[b] @ torch.tanh(w2 @ e + att.bias.detach()) for e in hist]), 0)
            want = torch.sigmoid(w1 @ (a[:, None] * hist).sum(0))
        torch.testing.assert_close(got[b].detach(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=pytest.mark.skipif(
    not pnn_fast.build_info()["compiled"], reason="pnn_fast._C is not built"))])
def test_hard_candidates_replace_only_the_bpr_hard_negative(backend):
    """hard_candidates: L_BPR against DNS's hardest of M given items; the classes, L_rank and
    L_constrain are still those of the candidates."""
    p = make_problem(seed=4, k=6)
    hard_set = torch.randint(0, p["num_items"], (p["users"].numel(), 3), generator=torch.Generator().manual_seed(9))
    loss_fn = PNNLoss(p["known"], p["dim"], lambda_mode="fixed", fixed_lambda=0.4, backend=backend).double()
    args = (p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"])
    _, plain = loss_fn(*args, noise=p["noise"], return_components=True)
    _, mixed = loss_fn(*args, noise=p["noise"], return_components=True, hard_candidates=hard_set)
    dns = pnn_fast.DNSLoss(p["known"], backend=backend)
    bpr_rows = [dns(p["user_emb"][b:b + 1], p["item_table"], p["users"][b:b + 1], p["pos"][b:b + 1],
                    hard_set[b:b + 1]) for b in range(p["users"].numel())]
    torch.testing.assert_close(mixed["bpr"], torch.stack(bpr_rows))
    for name in ("rank", "constrain", "num_negative", "num_neutral", "valid"):
        torch.testing.assert_close(mixed[name], plain[name])
    with pytest.raises(ValueError, match=r"hard_candidates must have shape \[B=24, K>=1\]"):
        loss_fn(*args, hard_candidates=hard_set[:3])


def test_rank_weight_scales_the_rank_term():
    p = make_problem(seed=5, k=5)
    losses = []
    for weight in (1.0, 2.5):
        loss_fn = PNNLoss(p["known"], p["dim"], lambda_mode="fixed", fixed_lambda=0.4, rank_weight=weight,
                          backend="reference").double()
        loss, comp = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"], noise=p["noise"],
                             return_components=True)
        losses.append((loss, comp))
    (loss1, comp1), (loss2, comp2) = losses
    torch.testing.assert_close(comp2["rank"], 2.5 * comp1["rank"])
    valid = comp1["valid"]
    torch.testing.assert_close(loss2 - loss1, 0.4 * 1.5 * comp1["rank"][valid].sum() / valid.sum())
    with pytest.raises(ValueError, match="rank_weight"):
        PNNLoss(p["known"], p["dim"], rank_weight=-1.0)
