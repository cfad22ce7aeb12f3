"""SL (sampled softmax), the drop-in SampledSoftmaxLoss and the sl objective that wraps it: the loss
against a per-row loop over its equation on every backend (CUDA where a GPU is), matching gradients,
negatives that are never known positives, argument errors, cosine scoring tables, and a short ml-100k
run that beats the most-popular ranking on NDCG@20 and reaches nearly BPR's."""
import math

import pytest
import torch
from batches import DEVICES, tiny_mf
from conftest import data_path
from test_train import assert_reaches_bpr, bpr_twin_ndcg, popularity_ndcg

from pnn_fast import SampledSoftmaxLoss, _extension
from pnn_fast.data import load_dataset
from pnn_fast.losses import sampled_softmax_loss
from pnn_fast.sampling import sample_unknown
from pnn_fast.objectives import build_objective
from pnn_fast.train import TrainConfig, run

compiled = pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")
BACKENDS = ["reference", pytest.param("cpu", marks=compiled)]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- tiny inputs -------------------------------------------------------------------------
NUM_USERS, NUM_ITEMS, DIM = 5, 12, 4
KNOWN = {0: [1, 4, 7], 1: [0, 2], 2: [3, 5, 6, 8, 11], 3: [2], 4: [0, 1, 5, 6, 7, 9, 10]}
USERS = torch.tensor([0, 2, 4, 1, 2, 3, 4])  # repeated users: their rows and gradients add up


def tiny(seed=0):
    """(known, float64 MF model) with random embeddings of varied norms."""
    return tiny_mf(KNOWN, NUM_ITEMS, DIM, seed, varied_norms=True)


def positives(users, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([KNOWN[u][int(torch.randint(len(KNOWN[u]), (1,), generator=g))] for u in users.tolist()])


def sl_loop(model, users, pos, neg, temperature):
    """-log(e^{s+} / (e^{s+} + sum_j e^{s_j})), s = cos / tau, one row and one negative at a time."""
    U, I = model.user_embedding.weight.detach(), model.item_embedding.weight.detach()

    def score(u, i):
        return float(U[u] @ I[i]) / (float(U[u].norm()) * float(I[i].norm())) / temperature

    total = 0.0
    for b in range(users.numel()):
        u = int(users[b])
        positive = math.exp(score(u, int(pos[b])))
        negatives = sum(math.exp(score(u, int(j))) for j in neg[b])
        total += -math.log(positive / (positive + negatives))
    return total / users.numel()


# ---- the equation ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature, num_negatives", [(0.1, 6), (0.5, 1), (2.0, 30)])
def test_loss_matches_a_loop_over_its_equation(backend, temperature, num_negatives):
    known, model = tiny()
    obj = build_objective("sl", known, model, num_negatives=num_negatives, temperature=temperature, backend=backend)
    pos = positives(USERS)
    # the objective draws its negatives from the generator it is given: the same seed, the same draws
    out = obj(model, USERS, pos, torch.Generator().manual_seed(3))
    neg = sample_unknown(known, USERS, num_negatives, torch.Generator().manual_seed(3))
    expected = sl_loop(model, USERS, pos, neg, temperature)
    assert out.loss.dtype == torch.float64 and out.loss.dim() == 0
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(out.users, USERS) and torch.equal(out.pos_items, pos)
    assert out.neg_items is None and not out.l2_included  # the trainer's L2 covers users and positives
    # the scoring function on given negatives, with repeated negatives in a row
    fixed = torch.cat([neg[:, :1].expand(-1, 2), neg], dim=1)
    got = sampled_softmax_loss(model.user_embedding.weight[USERS], model.item_embedding.weight, pos, fixed,
                               temperature, backend)
    assert float(got.detach()) == pytest.approx(sl_loop(model, USERS, pos, fixed, temperature), rel=1e-6)


# ---- the drop-in module ----------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_drop_in_module_matches_the_loop_with_its_own_or_given_draws(backend):
    known, model = tiny()
    loss_fn = SampledSoftmaxLoss(known, num_negatives=7, temperature=0.3, backend=backend)
    assert "num_negatives=7, temperature=0.3, neutral_weight=1.0" in repr(loss_fn)
    user_rows, items, pos = model.user_embedding.weight[USERS], model.item_embedding.weight, positives(USERS)
    own = loss_fn(user_rows, items, USERS, pos, generator=torch.Generator().manual_seed(8))
    neg = sample_unknown(known, USERS, 7, torch.Generator().manual_seed(8))
    assert float(own.detach()) == pytest.approx(sl_loop(model, USERS, pos, neg, 0.3), rel=1e-6)
    given = neg[:, :3]  # any number of given draws a row
    got = loss_fn(user_rows, items, USERS, pos, given)
    assert float(got.detach()) == pytest.approx(sl_loop(model, USERS, pos, given, 0.3), rel=1e-6)
    got.backward()
    assert model.user_embedding.weight.grad.abs().sum() > 0 and model.item_embedding.weight.grad.abs().sum() > 0


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs the CUDA kernels and a GPU")
@pytest.mark.parametrize("extra", [{}, {"neutral_weight": 0.5}, {"neutral_weight": 0.5, "neutral_top": 3}])
def test_cuda_loss_and_gradients_match_the_reference(extra):
    """The module on the CUDA kernels (gathered_dots, lowest_k_mask) against the reference on the CPU,
    float64, continuous scores; PNN's classes at the bottom and at the top of the rows included."""
    known, model = tiny()
    pos, neg = positives(USERS), sample_unknown(known, USERS, 9, torch.Generator().manual_seed(9))
    results = {}
    for backend, device in (("reference", "cpu"), ("cuda", "cuda")):
        user_table = model.user_embedding.weight.detach().to(device).requires_grad_()
        item_table = model.item_embedding.weight.detach().to(device).requires_grad_()
        loss_fn = SampledSoftmaxLoss(known, num_negatives=9, temperature=0.3, backend=backend, **extra)
        users = USERS.to(device)
        loss = loss_fn(user_table[users], item_table, users, pos.to(device), neg.to(device))
        loss.backward()
        results[backend] = [t.detach().cpu() for t in (loss, user_table.grad, item_table.grad)]
    for want, got in zip(results["reference"], results["cuda"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_drop_in_module_is_the_objective_s_loss():
    """The `sl` objective is the module: the same draws and the same value, PNN's classes included."""
    known, model = tiny()
    args = {"num_negatives": 9, "temperature": 0.2, "neutral_weight": 0.5, "neg_size": "count"}
    out = build_objective("sl", known, model, **args)(model, USERS, positives(USERS), torch.Generator().manual_seed(2))
    direct = SampledSoftmaxLoss(known, **args)(model.user_embedding.weight[USERS], model.item_embedding.weight, USERS,
                                               positives(USERS), generator=torch.Generator().manual_seed(2))
    assert torch.equal(out.loss, direct)


@pytest.mark.parametrize("args, message", [
    ({"num_negatives": 0}, r"num_negatives must be an int >= 1, got 0"),
    ({"temperature": 0.0}, r"temperature must be a finite number > 0, got 0\.0"),
    ({"temperature": float("nan")}, r"temperature must be a finite number > 0, got nan"),
    ({"neutral_weight": 0.0}, r"neutral_weight must be a finite number in \(0, 1\], got 0\.0"),
    ({"neutral_top": 5, "num_negatives": 5, "neutral_weight": 0.5}, r"neutral_top must be below num_negatives=5, got 5"),
    ({"neg_size": 5, "num_negatives": 5, "neutral_weight": 0.5}, r"neg_size must be .* \[0, 5\), got 5"),
    ({"backend": "gpu"}, r"backend"),
])
def test_the_drop_in_module_names_a_bad_argument(args, message):
    known, _ = tiny()
    with pytest.raises(ValueError, match=message):
        SampledSoftmaxLoss(known, **args)


def test_the_drop_in_module_needs_known_positives():
    with pytest.raises(TypeError, match="known must be a KnownPositives"):
        SampledSoftmaxLoss(None)


def test_the_drop_in_module_names_given_draws_too_few_for_its_neutral_top():
    known, model = tiny()
    loss_fn = SampledSoftmaxLoss(known, num_negatives=20, neutral_weight=0.5, neutral_top=5)
    neg = sample_unknown(known, USERS, 5, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"neutral_top=5 needs more draws a row than neg_items' 5"):
        loss_fn(model.user_embedding.weight[USERS], model.item_embedding.weight, USERS, positives(USERS), neg)
    with pytest.raises(ValueError, match=r"neg_items \[M\] is a shared pool; PNN's classes .* need each row's own draws"):
        loss_fn(model.user_embedding.weight[USERS], model.item_embedding.weight, USERS, positives(USERS), neg[:, 0])


def test_large_logits_stay_finite():
    # tau = 1e-3: logits up to 1000, where exp overflows float32 and float64 alike
    known, model = tiny()
    model = model.float()
    obj = build_objective("sl", known, model, temperature=1e-3, num_negatives=50)
    out = obj(model, USERS, positives(USERS), torch.Generator().manual_seed(4))
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss >= 0
    assert torch.isfinite(model.user_embedding.weight.grad).all()
    assert torch.isfinite(model.item_embedding.weight.grad).all()


@compiled
def test_gradients_are_finite_and_agree_between_backends():
    grads = {}
    for backend in ("reference", "cpu"):
        known, model = tiny()
        obj = build_objective("sl", known, model, num_negatives=20, temperature=0.2, backend=backend)
        obj(model, USERS, positives(USERS), torch.Generator().manual_seed(5)).loss.backward()
        grads[backend] = [model.user_embedding.weight.grad, model.item_embedding.weight.grad]
    for ref, fused in zip(grads["reference"], grads["cpu"]):
        assert torch.isfinite(ref).all() and ref.abs().sum() > 0
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-12)


# ---- sampling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_negatives_are_never_known_positives_and_cover_the_unknown_items(backend):
    known, model = tiny()
    obj = build_objective("sl", known, model, num_negatives=400, backend=backend)
    neg = obj.sample_negatives(USERS, torch.Generator().manual_seed(6))
    assert neg.shape == (USERS.numel(), 400) and neg.dtype == torch.int64
    assert not known.contains(USERS[:, None].expand_as(neg), neg).any()
    for b, u in enumerate(USERS.tolist()):  # 400 draws reach every unknown item (at most 11 per user)
        assert set(neg[b].tolist()) == set(range(NUM_ITEMS)) - set(KNOWN[u])


@pytest.mark.parametrize("backend", BACKENDS)
def test_neutral_weight_down_weights_all_but_the_lowest_scored_negatives(backend):
    """PNN's classes in the softmax: the k lowest-scored negatives of a row keep weight 1 in the
    denominator, the rest weigh w; checked against a loop over rows with sorted scores."""
    known, model = tiny()
    pos = positives(USERS)
    neg = sample_unknown(known, USERS, 12, torch.Generator().manual_seed(5))
    k = torch.tensor([1, 3, 0, 12, 5, 2, 7, 4][:USERS.numel()])
    weight, temperature = 0.25, 0.3
    U, I = model.user_embedding.weight.detach(), model.item_embedding.weight.detach()
    total = 0.0
    for b in range(USERS.numel()):
        u = int(USERS[b])
        cos = [float(U[u] @ I[int(j)]) / float(U[u].norm() * I[int(j)].norm()) / temperature for j in neg[b]]
        lowest = sorted(range(len(cos)), key=lambda j: (cos[j], j))[:int(k[b])]
        s_pos = float(U[u] @ I[int(pos[b])]) / float(U[u].norm() * I[int(pos[b])].norm()) / temperature
        denominator = math.exp(s_pos) + sum(math.exp(c) * (1.0 if j in lowest else weight) for j, c in enumerate(cos))
        total += -math.log(math.exp(s_pos) / denominator)
    got = sampled_softmax_loss(model.user_embedding.weight[USERS], model.item_embedding.weight, pos, neg,
                               temperature, backend, neutral_weight=weight, num_negative=k)
    assert float(got.detach()) == pytest.approx(total / USERS.numel(), rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_neutral_top_down_weights_the_highest_scored_negatives(backend):
    """The neutral class as the m highest-scored negatives of each row (where the false negatives
    are): they weigh w in the denominator, every other negative 1; checked against a loop over rows
    with sorted scores, through the objective as training calls it."""
    known, model = tiny()
    pos = positives(USERS)
    weight, temperature, top = 0.3, 0.4, 4
    obj = build_objective("sl", known, model, num_negatives=12, temperature=temperature, neutral_weight=weight,
                          neutral_top=top, backend=backend)
    neg = obj.sample_negatives(USERS, torch.Generator().manual_seed(7))
    U, I = model.user_embedding.weight.detach(), model.item_embedding.weight.detach()
    total = 0.0
    for b in range(USERS.numel()):
        u = int(USERS[b])
        cos = [float(U[u] @ I[int(j)]) / float(U[u].norm() * I[int(j)].norm()) / temperature for j in neg[b]]
        highest = sorted(range(len(cos)), key=lambda j: (-cos[j], j))[:top]
        s_pos = float(U[u] @ I[int(pos[b])]) / float(U[u].norm() * I[int(pos[b])].norm()) / temperature
        denominator = math.exp(s_pos) + sum(math.exp(c) * (weight if j in highest else 1.0) for j, c in enumerate(cos))
        total += -math.log(math.exp(s_pos) / denominator)
    got = obj(model, USERS, pos, torch.Generator().manual_seed(7)).loss
    assert float(got.detach()) == pytest.approx(total / USERS.numel(), rel=1e-6)


# ---- arguments and scoring ------------------------------------------------------------------------
@pytest.mark.parametrize("name, value", [
    ("temperature", 0.0), ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
    ("temperature", "hot"), ("temperature", True),
    ("num_negatives", 0), ("num_negatives", -3), ("num_negatives", 2.5), ("backend", "gpu"),
    ("neutral_weight", 0.0), ("neutral_weight", 1.5),
    ("neutral_top", -1), ("neutral_top", 800), ("neutral_top", 2.0), ("neutral_top", True),
    # num_negatives is 800: at most 799 of them can be in the negative class
    ("neg_size", 800), ("neg_size", -1), ("neg_size", "all"), ("neg_size", True),
])
def test_bad_arguments_are_value_errors_naming_the_argument(name, value):
    known, model = tiny()
    with pytest.raises(ValueError, match=name):
        build_objective("sl", known, model, **{name: value})
    with pytest.raises(ValueError, match="margin"):
        build_objective("sl", known, model, margin=0.5)


def test_neutral_top_without_a_neutral_weight_is_an_error():
    known, model = tiny()
    with pytest.raises(ValueError, match=r"neutral_top=8 needs a neutral_weight below 1, got 1\.0"):
        build_objective("sl", known, model, neutral_top=8)


@pytest.mark.parametrize("extra", [{}, {"neutral_weight": 0.5, "neutral_top": 8}])
def test_neg_size_where_pnn_classes_are_off_is_an_error(extra):
    known, model = tiny()
    with pytest.raises(ValueError, match=r"neg_size='count' sizes PNN's negative class, which needs a "
                                         r"neutral_weight below 1 and neutral_top 0"):
        build_objective("sl", known, model, neg_size="count", **extra)
    build_objective("sl", known, model, neg_size="count", neutral_weight=0.5)  # PNN's classes: accepted


def test_scoring_tables_give_the_trained_cosines():
    known, model = tiny()
    obj = build_objective("sl", known, model)
    users_unit, items_unit = obj.scoring_tables(model)
    ones = torch.ones(NUM_USERS, dtype=torch.float64)
    torch.testing.assert_close(users_unit.norm(dim=1), ones)
    expected = torch.nn.functional.cosine_similarity(model.user_embedding.weight[:, None],
                                                     model.item_embedding.weight[None], dim=-1)
    torch.testing.assert_close(users_unit @ items_unit.T, expected)


# ---- a short real run beats most-popular and nearly BPR -------------------------------------
def test_short_run_on_ml100k_beats_most_popular_and_nearly_bpr(tmp_path):
    data = load_dataset(data_path("ml-100k"), split="rs", seed=2020)
    # fewer negatives and a larger step than the defaults keep the CPU run short
    config = TrainConfig(loss="sl", epochs=3, batch_size=1024, lr=0.01, dim=32, patience=100,
                         loss_args={"num_negatives": 200})
    results = run(data, config, tmp_path, progress=False, log=lambda *_: None)
    baseline = popularity_ndcg(data)
    assert results["test"]["ndcg@20"] > baseline, (results["test"]["ndcg@20"], baseline)
    assert_reaches_bpr(results["test"]["ndcg@20"], bpr_twin_ndcg(data, config, tmp_path / "bpr"))
