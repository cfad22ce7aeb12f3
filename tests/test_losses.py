"""pnn_fast.losses: PNNLoss against the slow per-row loop of tests/slow_pnn.py (terms, loss and
gradients, edge rows, the ablation switches, gradcheck, hard_candidates, rank_weight), its argument
checks, and on the fused kernels the reference's loss and gradients, bit-reproducibility and
torch.compile; BPRLoss, embedding_bpr and DNSLoss against their formulas and each other."""
import pytest
import torch
import torch.nn.functional as F

from batches import DEVICES, TOLERANCE, bpr_inputs, make_batch, requires_kernels, under_thread_counts
from pnn_fast import BPRLoss, DNSLoss, KnownPositives, PNNLoss, UserAwareAttention, embedding_bpr
from slow_pnn import known_sets, slow_lambda, slow_loss, slow_rows, slow_uniform

CUDA = "cuda" in DEVICES


# ---- PNNLoss against the slow per-row loop --------------------------------------------------
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


def run_both(p, neg_size, lambda_mode="fixed", alpha=0.8, beta=0.6, **switches):
    """PNNLoss (reference backend) and the slow loop on problem ``p``; ``switches`` are PNNLoss's
    ablation arguments (use_rank, rank_weight, uniform_t, uniform_normalize), given to both."""
    torch.manual_seed(0)
    loss_fn = PNNLoss(p["known"], p["dim"], alpha=alpha, beta=beta, neg_size=neg_size, lambda_mode=lambda_mode,
                      fixed_lambda=0.3, history_len=1000, backend="reference", **switches).double()
    ue = p["user_emb"].clone().requires_grad_()
    it = p["item_table"].clone().requires_grad_()
    loss, comp = loss_fn(ue, it, p["users"], p["pos"], p["neg"], noise=p["noise"], return_components=True)

    ue2 = p["user_emb"].clone().requires_grad_()
    it2 = p["item_table"].clone().requires_grad_()
    cands = p["pos"] if p["neg"] is None else p["neg"]
    rows = slow_rows(ue2, it2, p["users"], p["pos"], cands, p["sets"], p["num_items"], neg_size, *p["noise"])
    uniform = slow_uniform(it2, cands, switches.get("uniform_t", 2.0), switches.get("uniform_normalize", True))
    if lambda_mode == "fixed":
        lams = [torch.tensor(0.3, dtype=torch.float64)] * p["users"].numel()
    else:
        lams = slow_lambda(loss_fn.attention, ue2, it2, p["users"], p["sets"])
    slow = slow_loss(rows, uniform, lams, alpha, beta, switches.get("use_rank", True),
                     switches.get("rank_weight", 1.0))
    return (loss, comp, ue, it), (slow, rows, uniform, lams, ue2, it2)


def assert_matches_slow_loop(p, neg_size, lambda_mode="fixed", **switches) -> dict:
    """Components, loss and both gradients of PNNLoss equal the slow loop's on ``p``; returns the components."""
    (loss, comp, ue, it), (slow, rows, uniform, lams, ue2, it2) = run_both(p, neg_size, lambda_mode, **switches)
    # the rank component is L_rank as it enters L_PNN: scaled by rank_weight, zero without use_rank
    rank_scale = switches.get("rank_weight", 1.0) if switches.get("use_rank", True) else 0.0
    want = {"bpr": rows["bpr"], "rank": [rank_scale * r for r in rows["rank"]], "constrain": rows["constrain"]}
    for key, value in want.items():
        torch.testing.assert_close(comp[key], torch.stack(value).reshape(-1), rtol=1e-10, atol=1e-12, msg=key)
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
    return comp


@pytest.mark.parametrize("neg_size", NEG_SIZES)
@pytest.mark.parametrize("k", [None, 8])
@pytest.mark.parametrize("lambda_mode", ["fixed", "attention"])
def test_components_loss_and_grads_match_slow_loop(neg_size, k, lambda_mode):
    # a fixed seed per case, so that a failure reproduces (hash() of a str changes with every process)
    seed = 100 * NEG_SIZES.index(neg_size) + 10 * (k is not None) + (lambda_mode == "attention")
    assert_matches_slow_loop(make_problem(seed=seed, k=k), neg_size, lambda_mode)


@pytest.mark.parametrize("switches", [dict(use_rank=False), dict(rank_weight=2.5), dict(uniform_t=0.5),
                                      dict(uniform_normalize=False)], ids=lambda s: "-".join(map(str, s.items())))
@pytest.mark.parametrize("k", [None, 8])
def test_ablation_switches_match_slow_loop(switches, k):
    """The paper's "w/o rank" (use_rank=False), rank_weight, and L_uniform's temperature and
    normalisation, on in-batch and sampled candidates, with the attention's lambda."""
    assert_matches_slow_loop(make_problem(seed=40 + (k is not None), k=k), "proportional", "attention", **switches)


def test_problem_exercises_edge_rows():
    """Rows with 0, 1 and 2 unlabeled candidates (no class, a neutral class only, both classes)
    give the slow loop's values and gradients."""
    p = make_problem(seed=3, k=2, known_per_user=20)
    comp = assert_matches_slow_loop(p, "proportional")
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


def test_noise_is_drawn_in_range_when_not_given():
    p = make_problem(seed=2, k=4)
    loss_fn = PNNLoss(p["known"], p["dim"], noise_max=0.0, lambda_mode="fixed", backend="reference").double()
    _, comp = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"], return_components=True)
    assert torch.all(comp["constrain"] == 0)  # zero-magnitude noise: the two clamps coincide
    loss_fn.noise_max = 0.1
    _, comp = loss_fn(p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"], return_components=True)
    has_neg = comp["num_negative"] > 0
    assert torch.all(comp["constrain"][has_neg] > 0)
    # constrain = ||n_pos * u - n_neg * v||^2 with unit u, v and noise coordinates in [0, noise_max):
    # ||n * u|| <= noise_max ||u|| = noise_max, so by the triangle inequality it is at most (2 noise_max)^2
    assert torch.all(comp["constrain"] <= 4 * 0.1 ** 2)


@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=requires_kernels)])
def test_hard_candidates_replace_only_the_bpr_hard_negative(backend):
    """hard_candidates: L_BPR against DNS's hardest of M given items; the classes, L_rank and
    L_constrain are still those of the candidates."""
    p = make_problem(seed=4, k=6)
    hard_set = torch.randint(0, p["num_items"], (p["users"].numel(), 3), generator=torch.Generator().manual_seed(9))
    loss_fn = PNNLoss(p["known"], p["dim"], lambda_mode="fixed", fixed_lambda=0.4, backend=backend).double()
    args = (p["user_emb"], p["item_table"], p["users"], p["pos"], p["neg"])
    _, plain = loss_fn(*args, noise=p["noise"], return_components=True)
    _, mixed = loss_fn(*args, noise=p["noise"], return_components=True, hard_candidates=hard_set)
    dns = DNSLoss(p["known"], backend=backend)
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


# ---- PNNLoss: argument checks ---------------------------------------------------------------
@pytest.fixture
def small_pnn():
    """A PNNLoss on the reference backend, checking eagerly, and valid arguments for it (3 users, 6 items, d = 4)."""
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 1, 2]), torch.tensor([1, 3, 2, 0]), 3, 6)
    loss_fn = PNNLoss(known, 4, backend="reference", validate="eager")
    args = dict(user_emb=torch.randn(3, 4), item_table=torch.randn(6, 4), users=torch.tensor([0, 1, 2]),
                pos_items=torch.tensor([1, 2, 0]))
    return loss_fn, args


def call_loss(loss_fn, args, **overrides):
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
    (dict(user_emb=torch.randn(3, 4, device="meta"), item_table=torch.randn(6, 4, device="meta")), ValueError,
     "user_emb is a meta tensor"),
])
def test_bad_input_names_the_argument(small_pnn, override, error, name):
    loss_fn, args = small_pnn
    with pytest.raises(error, match=name):
        call_loss(loss_fn, args, **override)


@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=requires_kernels)])
@pytest.mark.parametrize("override, message", [
    (dict(users=torch.tensor([0, 1, 3])), r"^PNNLoss: users has ids outside \[0, 3\)$"),
    (dict(users=torch.tensor([0, -1, 2])), r"^PNNLoss: users has ids outside \[0, 3\)$"),
    (dict(pos_items=torch.tensor([1, 2, 6])), r"^PNNLoss: pos_items has ids outside \[0, 6\)$"),
    (dict(neg_items=torch.tensor([[1, 2], [3, 9], [0, 0]])), r"^PNNLoss: neg_items has ids outside \[0, 6\)$"),
])
def test_deferred_check_runs_the_step_and_names_the_argument_on_check(small_pnn, backend, override, message):
    """validate="deferred" (the default): a bad id is clamped, the call returns, and check() raises once."""
    loss_fn, args = small_pnn
    deferred = PNNLoss(loss_fn.known, 4, backend=backend)
    assert deferred.validate == "deferred"
    deferred.check()
    assert torch.isfinite(call_loss(deferred, args, **override))
    with pytest.raises(ValueError, match=message):
        deferred.check()
    deferred.check()  # cleared


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs, name", [
    (dict(neg_size="all"), "neg_size"), (dict(neg_size=-1), "neg_size"), (dict(lambda_mode="x"), "lambda_mode"),
    (dict(fixed_lambda=1.5), "fixed_lambda"), (dict(history_len=0), "history_len"), (dict(backend="gpu"), "backend"),
    (dict(noise_max=-0.1), "noise_max"),
    # a negative or non-finite weight makes the loss unbounded below or NaN: refused, never trained on
    (dict(alpha=-1.0), "alpha"), (dict(alpha=NAN), "alpha"), (dict(alpha=INF), "alpha"), (dict(alpha="0.8"), "alpha"),
    (dict(beta=-0.1), "beta"), (dict(beta=NAN), "beta"), (dict(noise_max=NAN), "noise_max"),
    (dict(noise_max=INF), "noise_max"), (dict(fixed_lambda=-0.5), "fixed_lambda"),
    (dict(fixed_lambda=NAN), "fixed_lambda"), (dict(rank_weight=INF), "rank_weight"),
    (dict(uniform_t=0.0), "uniform_t"), (dict(uniform_t=NAN), "uniform_t"),
    (dict(history_len=-3), "history_len"), (dict(history_len=2.5), "history_len"),
    # at most K - 1 of K candidates can be negative: the neutral class keeps one
    (dict(neg_size=8, num_candidates=8), r"neg_size must be .* an int in \[0, num_candidates\) = \[0, 8\), got 8"),
    (dict(neg_size=9, num_candidates=8), "neg_size"),
])
def test_bad_constructor_argument(kwargs, name):
    known = KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([0]), 1, 2)
    with pytest.raises(ValueError, match=name):
        PNNLoss(known, 4, **kwargs)
    with pytest.raises(ValueError, match="dim"):
        PNNLoss(known, 0)
    with pytest.raises(TypeError, match="known"):
        PNNLoss("not known", 4)


def test_boundary_constructor_arguments_are_accepted():
    known = KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([0]), 1, 2)
    loss_fn = PNNLoss(known, 4, alpha=0, beta=0.0, noise_max=0.0, rank_weight=0.0, fixed_lambda=1, history_len=1,
                      neg_size=7, num_candidates=8)
    assert (loss_fn.alpha, loss_fn.fixed_lambda, loss_fn.attention.history_len) == (0.0, 1.0, 1)
    with pytest.raises(ValueError, match="history_len"):
        UserAwareAttention(4, history_len=0)


def test_backend_for_wrong_device_is_refused(small_pnn):
    _, args = small_pnn
    loss_fn = PNNLoss(KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([0]), 3, 6), 4, backend="cuda")
    with pytest.raises((ValueError, RuntimeError), match="cuda"):
        call_loss(loss_fn, args)


def test_int32_ids_give_the_same_loss(small_pnn):
    loss_fn, args = small_pnn
    noise = (torch.rand(3, 4), torch.rand(3, 4))
    loss_fn.lambda_mode, loss_fn.attention = "fixed", None
    a = call_loss(loss_fn, args, noise=noise)
    b = call_loss(loss_fn, args, users=args["users"].int(), pos_items=args["pos_items"].int(), noise=noise)
    assert a == b


# ---- PNNLoss on the fused kernels: against the reference, reproducibility, torch.compile -----
@requires_kernels
@pytest.mark.parametrize("per_row", [None, 12], ids=["in-batch", "sampled"])
@pytest.mark.parametrize("lambda_mode", ["fixed", "attention"])
def test_cpu_loss_and_gradients_match_reference(per_row, lambda_mode):
    """The whole loss, not only the per-row terms: PNNLoss(backend="cpu") against
    PNNLoss(backend="reference") on continuous float64 inputs (distinct candidates per row, see
    tests/batches.py), with L_uniform and the attention's lambda; the loss and the gradients of the
    user rows, the item table and the attention's parameters."""
    batch = make_batch(64, 16, per_row=per_row, seed=43)
    neg = None if per_row is None else batch["candidates"]
    results = {}
    for backend in ("reference", "cpu"):
        torch.manual_seed(0)  # the attention's initial parameters and its history draw: the same for both
        loss_fn = PNNLoss(batch["known"], 16, lambda_mode=lambda_mode, backend=backend).double()
        user_emb = batch["user_emb"].clone().requires_grad_()
        item_table = batch["item_table"].clone().requires_grad_()
        loss = loss_fn(user_emb, item_table, batch["users"], batch["pos_items"], neg,
                       noise=(batch["noise_pos"], batch["noise_neg"]))
        params = [user_emb, item_table, *loss_fn.parameters()]
        results[backend] = (loss.detach(), *torch.autograd.grad(loss, params))
    assert len(results["cpu"]) == (6 if lambda_mode == "attention" else 3)  # the loss and 2 or 5 gradients
    for got, want in zip(results["cpu"], results["reference"]):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    assert results["cpu"][2].abs().sum() > 0  # the item table's gradient is not trivially zero


@requires_kernels
def test_fused_pnn_step_is_bitwise_reproducible_on_two_threads():
    """The same seed gives bit-identical loss and gradients on a multi-threaded CPU: the kernels'
    reductions have a fixed order, and the loss's own gathers use index_select (whose backward adds
    repeated rows in order) rather than advanced indexing (whose CPU backward may add them in any order)."""
    batch = make_batch(2048, 64, dtype=torch.float32, num_users=500, num_items=3000, seed=31)
    loss_fn = PNNLoss(batch["known"], 64, backend="cpu")

    def step():
        torch.manual_seed(0)  # the attention's history sample and the clamp noise
        user_emb = batch["user_emb"].clone().requires_grad_()
        item_table = batch["item_table"].clone().requires_grad_()
        loss = loss_fn(user_emb, item_table, batch["users"], batch["pos_items"])
        loss.backward()
        return loss.detach(), user_emb.grad, item_table.grad

    results = under_thread_counts((2, 2, 2), step)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@requires_kernels
@pytest.mark.parametrize("device,mode", [("cpu", None)] + [
    pytest.param("cuda", mode, marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs CUDA kernels")])
    for mode in (None, "reduce-overhead")])
def test_compiled_training_matches_eager(device, mode):
    """torch.compile(fullgraph=True) of a small MF model trained with PNNLoss on the fused
    kernels: no graph break (fullgraph raises on one) and the same losses as eager.  CUDA graphs
    (reduce-overhead) would expose a kernel launched off the current stream."""
    batch = make_batch(32, 16, seed=29, device=device)
    known = batch["known"]

    def train(compiled: bool):
        torch.manual_seed(0)
        users = torch.nn.Embedding(known.num_users, 16, device=device)
        items = torch.nn.Embedding(known.num_items, 16, device=device)
        loss_fn = PNNLoss(known, 16, lambda_mode="fixed", backend=device, validate=False)
        opt = torch.optim.SGD([users.weight, items.weight], lr=0.1)

        def step(u, p, noise):
            return loss_fn(users(u), items.weight, u, p, noise=noise)

        step = torch.compile(step, fullgraph=True, mode=mode) if compiled else step
        losses = []
        for _ in range(3):
            loss = step(batch["users"], batch["pos_items"], (batch["noise_pos"].float(), batch["noise_neg"].float()))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        return torch.stack(losses)

    torch.testing.assert_close(train(True), train(False), rtol=1e-5, atol=1e-6)


# ---- BPRLoss, embedding_bpr and DNSLoss ------------------------------------------------------
def test_bpr_loss_matches_formula():
    torch.manual_seed(0)
    ue, it = torch.randn(4, 3), torch.randn(7, 3)
    pos, neg = torch.tensor([0, 1, 2, 3]), torch.tensor([[4, 5], [6, 4], [5, 5], [0, 1]])
    expected = torch.stack([F.softplus(ue[b] @ it[neg[b, k]] - ue[b] @ it[pos[b]]) for b in range(4) for k in range(2)]).mean()
    torch.testing.assert_close(BPRLoss()(ue, it, pos, neg), expected)
    torch.testing.assert_close(BPRLoss()(ue, it, pos, neg[:, 0]), torch.stack(
        [F.softplus(ue[b] @ it[neg[b, 0]] - ue[b] @ it[pos[b]]) for b in range(4)]).mean())
    with pytest.raises(ValueError, match="neg_items"):
        BPRLoss(validate="eager")(ue, it, pos, torch.tensor([[9, 1]] * 4))
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


@requires_kernels
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
