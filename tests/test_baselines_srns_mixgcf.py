"""SRNS and MixGCF objectives: against hand-written per-row loops of their equations, gradients,
argument errors, resume, and a short ml-100k run against the most-popular baseline and BPR."""
import itertools
import math
import statistics

import pytest
import torch
from conftest import data_path
from test_train import BelowBPR, assert_reaches_bpr, bpr_twin_ndcg, popularity_ndcg

from pnn_fast.objectives.mixgcf import MixGCFObjective, model_layers
from pnn_fast.objectives.srns import SRNSObjective, gumbel_top_k, select_negative
from pnn_fast.data import load_dataset, synthetic_dataset
from pnn_fast.known import KnownPositives
from pnn_fast.sampling import sample_unknown
from pnn_fast.models import build_model
from pnn_fast.objectives import build_objective
from pnn_fast.train import TrainConfig, run

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

NUM_USERS, NUM_ITEMS = 5, 15


def tiny_problem(seed=0, batch=12):
    """Training pairs (about 4 known items per user), a batch with repeated users, their positives."""
    g = torch.Generator().manual_seed(seed)
    train_users = torch.arange(NUM_USERS).repeat_interleave(4)
    train_items = torch.randint(0, NUM_ITEMS, (train_users.numel(),), generator=g)
    known = KnownPositives.from_pairs(train_users, train_items, NUM_USERS, NUM_ITEMS)
    pick = torch.randint(0, train_users.numel(), (batch,), generator=g)
    return known, train_users, train_items, train_users[pick], train_items[pick]


def tiny_model(name, train_users, train_items, **overrides):
    torch.manual_seed(0)
    return build_model(name, NUM_USERS, NUM_ITEMS, train_users, train_items, dim=4, **overrides).double()


def clone(generator):
    return torch.Generator().set_state(generator.get_state())


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------------------------------------
# SRNS
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight, variance_only, t",
                         [(0.0, False, 3), (2.5, False, 3), (1.0, True, 4), (3.0, False, 0)])
def test_srns_selection_matches_loop(weight, variance_only, t):
    g = torch.Generator().manual_seed(1)
    b, s1 = 7, 5
    pos, mem = torch.randn(b, generator=g, dtype=torch.float64), torch.randn(b, s1, generator=g, dtype=torch.float64)
    hist_pos = torch.randn(t, b, generator=g, dtype=torch.float64) * 2
    hist_mem = torch.randn(t, b, s1, generator=g, dtype=torch.float64) * 2
    got = select_negative(pos, mem, hist_pos, hist_mem, weight, variance_only)
    for row in range(b):
        values = []
        for k in range(s1):
            history = [sigmoid(hist_mem[j, row, k] - hist_pos[j, row]) for j in range(t)]
            std = statistics.pstdev(history) if history else 0.0
            values.append(std if variance_only else sigmoid(mem[row, k] - pos[row]) + weight * std)
        assert int(got[row]) == max(range(s1), key=values.__getitem__)


def test_srns_std_is_the_population_std():
    """Candidate 1's history sigmoid values 0.3, 0.7: population std 0.2 (the official numpy
    formula), sample std 0.28; candidate 0 leads by 0.25 now and has no variance, so it wins."""
    def logit(p):
        return math.log(p / (1 - p))

    pos = torch.zeros(1, dtype=torch.float64)
    mem = torch.tensor([[logit(0.75), logit(0.5)]], dtype=torch.float64)
    hist_pos = torch.zeros(2, 1, dtype=torch.float64)
    hist_mem = torch.tensor([[[0.0, logit(0.3)]], [[0.0, logit(0.7)]]], dtype=torch.float64)
    assert select_negative(pos, mem, hist_pos, hist_mem, weight=1.0).tolist() == [0]
    assert select_negative(pos, mem, hist_pos, hist_mem, weight=1.5).tolist() == [1]


def test_srns_warmup_weight():
    known, tu, ti, _, _ = tiny_problem()
    obj = SRNSObjective(known, tiny_model("mf", tu, ti), alpha=5.0, warmup=50)
    assert [obj.alpha_weight(e) for e in (0, 25, 50, 400)] == [0.0, 2.5, 5.0, 5.0]
    assert SRNSObjective(known, tiny_model("mf", tu, ti), alpha=2.0, warmup=0).alpha_weight(0) == 2.0


def test_gumbel_top_k_draws_like_sequential_softmax_sampling():
    """Ordered pairs of gumbel_top_k(k=2) against numpy's sequential no-replacement rule:
    P(a then b) = p_a * p_b / (1 - p_a)."""
    logits = torch.tensor([1.0, 0.2, -0.5, 0.7], dtype=torch.float64)
    p = torch.softmax(logits, 0).tolist()
    n = 40000
    draws = gumbel_top_k(logits.expand(n, 4), 2, torch.Generator().manual_seed(3))
    for a, b in itertools.permutations(range(4), 2):
        freq = ((draws[:, 0] == a) & (draws[:, 1] == b)).double().mean().item()
        assert abs(freq - p[a] * p[b] / (1 - p[a])) < 0.01, (a, b)


def slow_srns(tables, history, memory, users, pos, fresh, uniform, weight, temperature, s1):
    """Per-row SRNS: selection, BPR loss (a torch scalar over `tables`, for gradients) and the memory
    refresh (first row of each user) with the given fresh items and uniforms of the Gumbel draw."""
    user_table, item_table = tables
    new_memory, negatives, losses = {}, [], []
    for row in range(users.numel()):
        u, i = int(users[row]), int(pos[row])
        mem = memory[u].tolist()
        s_pos = user_table[u] @ item_table[i]
        values = []
        for k in mem:
            lik = sigmoid(float((user_table[u] @ item_table[k] - s_pos).detach()))
            past = [sigmoid(float(hu[u] @ hi[k] - hu[u] @ hi[i])) for hu, hi in history]
            values.append(lik + weight * (statistics.pstdev(past) if past else 0.0))
        j = mem[max(range(len(mem)), key=values.__getitem__)]
        negatives.append(j)
        losses.append(torch.log1p(torch.exp(user_table[u] @ item_table[j] - s_pos)))
        if u not in new_memory:
            cands = mem + fresh[row].tolist()
            keys = [float((user_table[u] @ item_table[c]).detach()) / temperature
                    - math.log(-math.log(float(uniform[row, c_idx]))) for c_idx, c in enumerate(cands)]
            order = sorted(range(len(cands)), key=lambda c_idx: -keys[c_idx])[:s1]
            new_memory[u] = [cands[c_idx] for c_idx in order]
    return sum(losses) / len(losses), negatives, new_memory


def test_srns_objective_matches_loop():
    known, tu, ti, users, pos = tiny_problem(seed=2)
    model = tiny_model("mf", tu, ti)
    obj = SRNSObjective(known, model, S1=3, S2_div_S1=2, alpha=5.0, warmup=2, temperature=0.5, history_epochs=3,
                        reset_memory_each_epoch=False)
    g = torch.Generator().manual_seed(4)
    snapshots = []
    for epoch in range(5):  # epoch 5 on: the ring holds the ends of epochs 2, 3, 4
        obj.on_epoch_start(model, g, 0)
        snapshots.append([w.detach().clone() for w in model.embeddings()])
        with torch.no_grad():
            for w in model.parameters():
                w.add_(torch.randn(w.shape, generator=g, dtype=w.dtype))
    obj.on_epoch_start(model, g, 0)
    snapshots.append([w.detach().clone() for w in model.embeddings()])
    assert int(obj.history_filled) == 3 and obj._epoch == 5
    memory_before = obj.memory.clone()

    g2 = clone(g)
    out = obj(model, users, pos, g)
    out.loss.backward()

    fresh = sample_unknown(known, users, 6, g2)
    uniform = torch.rand(users.numel(), 9, generator=g2, dtype=torch.float64)
    tables = [w.detach().clone().requires_grad_() for w in (model.user_embedding.weight, model.item_embedding.weight)]
    slow_loss, negatives, new_memory = slow_srns(tables, snapshots[-3:], memory_before, users, pos, fresh, uniform,
                                                 weight=5.0, temperature=0.5, s1=3)
    slow_loss.backward()
    torch.testing.assert_close(out.loss, slow_loss, rtol=1e-12, atol=1e-12)
    assert out.neg_items.tolist() == negatives  # the L2 rows: the user, its positive and the chosen negative
    assert torch.equal(out.users, users) and torch.equal(out.pos_items, pos)
    torch.testing.assert_close(model.user_embedding.weight.grad, tables[0].grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(model.item_embedding.weight.grad, tables[1].grad, rtol=1e-9, atol=1e-10)
    for u in range(NUM_USERS):
        assert obj.memory[u].tolist() == new_memory.get(u, memory_before[u].tolist()), u


def test_srns_history_epochs_and_memory_stay_valid():
    known, tu, ti, users, pos = tiny_problem(seed=5)
    model = tiny_model("lightgcn", tu, ti)
    obj = SRNSObjective(known, model, S1=4, history_epochs=2)
    g = torch.Generator().manual_seed(0)
    filled = []
    for _ in range(4):
        obj.on_epoch_start(model, g, 0)
        filled.append(int(obj.history_filled))
        for _ in range(3):
            out = obj(model, users, pos, g)
            assert torch.isfinite(out.loss)
            everyone = torch.arange(NUM_USERS)[:, None]
            assert not known.contains(everyone, obj.memory).any()
    assert filled == [1, 1, 2, 2]  # before-training scores serve epoch 0 only, as the official code
    torch.testing.assert_close(obj.item_history[-1], model.embeddings()[1].detach())


# ---------------------------------------------------------------------------------------------
# MixGCF
# ---------------------------------------------------------------------------------------------
def reference_layers(name, model):
    """Per-layer tables computed independently of model_layers: dense propagation for LightGCN."""
    if name == "mf":
        return [model.user_embedding.weight], [model.item_embedding.weight], "mean"
    if name == "ngcf":
        user, item = model.embeddings()
        return list(user.split([4, 3, 2], 1)), list(item.split([4, 3, 2], 1)), "concat"
    adj = model.adjacency.csr().to_dense().double()
    layer = torch.cat([model.user_embedding.weight, model.item_embedding.weight])
    layers = [layer]
    for _ in range(model.n_layers):
        layers.append(adj @ layers[-1])
    return [x[:NUM_USERS] for x in layers], [x[NUM_USERS:] for x in layers], "mean"


def slow_mixgcf(user_layers, item_layers, pool, users, pos, candidates, alpha):
    """Per-row MixGCF: mix every candidate with the positive per layer, keep the best per layer,
    pool, then log(1 + sum_k exp(s_neg_k - s_pos)) averaged over rows."""
    depth = len(user_layers)

    def pooled(layers, row):
        parts = [layer[row] for layer in layers]
        return sum(parts[1:], parts[0]) / depth if pool == "mean" else torch.cat(parts)

    total = 0
    for b in range(users.numel()):
        u, i = int(users[b]), int(pos[b])
        e_u, e_i = pooled(user_layers, u), pooled(item_layers, i)
        terms = []
        for k in range(candidates.shape[1]):
            chosen = []
            for layer in range(depth):
                a = alpha[b, k, layer]
                query = e_u if pool == "mean" else user_layers[layer][u]
                mixed = [a * item_layers[layer][i] + (1 - a) * item_layers[layer][int(c)] for c in candidates[b, k]]
                scores = [float((query @ m).detach()) for m in mixed]
                chosen.append(mixed[max(range(len(mixed)), key=scores.__getitem__)])
            negative = sum(chosen[1:], chosen[0]) / depth if pool == "mean" else torch.cat(chosen)
            terms.append(e_u @ negative - e_u @ e_i)
        total = total + torch.log1p(sum(torch.exp(t) for t in terms))
    return total / users.numel()


@pytest.mark.parametrize("name, overrides", [("lightgcn", {"n_layers": 2}), ("sgl", {"n_layers": 3}), ("mf", {}),
                                             ("ngcf", {"hidden_size_list": [3, 2], "message_dropout": 0.0})])
@pytest.mark.parametrize("k", [1, 2])
def test_mixgcf_objective_matches_loop(name, overrides, k):
    known, tu, ti, users, pos = tiny_problem(seed=6)
    model = tiny_model(name, tu, ti, **overrides)
    obj = MixGCFObjective(known, model, n_negs=5, K=k)
    g = torch.Generator().manual_seed(7)
    g2 = clone(g)
    out = obj(model, users, pos, g)
    out.loss.backward()
    grads = [p.grad.clone() for p in (model.user_embedding.weight, model.item_embedding.weight)]
    model.zero_grad()

    candidates = sample_unknown(known, users, k * 5, g2).view(-1, k, 5)
    user_layers, item_layers, pool = reference_layers(name if name != "sgl" else "lightgcn", model)
    alpha = torch.rand(users.numel(), k, len(user_layers), generator=g2, dtype=torch.float64)
    slow = slow_mixgcf(user_layers, item_layers, pool, users, pos, candidates, alpha)
    slow.backward()
    torch.testing.assert_close(out.loss, slow, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[0], model.user_embedding.weight.grad, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(grads[1], model.item_embedding.weight.grad, rtol=1e-8, atol=1e-12)
    assert all(torch.isfinite(gr).all() for gr in grads) and grads[1].abs().sum() > 0
    assert out.neg_items.shape == (users.numel(), k)  # the L2 rows: each user's first-choice (layer-0) negatives
    assert not known.contains(users[:, None].expand(-1, k), out.neg_items).any()


@pytest.mark.parametrize("name", ["lightgcn", "sgl"])
def test_layer_embeddings_pool_to_embeddings(name):
    _, tu, ti, _, _ = tiny_problem()
    model = tiny_model(name, tu, ti)
    layers = model.layer_embeddings()
    assert len(layers) == model.n_layers + 1 and torch.equal(layers[0][:NUM_USERS], model.user_embedding.weight)
    user_layers, item_layers, pool = model_layers(model)
    mean_user = sum(user_layers[1:], user_layers[0]) / len(user_layers)
    mean_item = sum(item_layers[1:], item_layers[0]) / len(item_layers)
    user, item = model.embeddings()
    assert pool == "mean"
    # embeddings() sums the layers by Horner's rule (models.graph.layer_mean): equal to rounding
    torch.testing.assert_close(mean_user, user, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(mean_item, item, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# both
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss, bad", [("srns", {"gamma": 1}), ("srns", {"S1": 0}), ("srns", {"temperature": 0}),
                                       ("srns", {"S1": 100}), ("mixgcf", {"gamma": 1}), ("mixgcf", {"n_negs": 0}),
                                       ("mixgcf", {"K": 1.5})])
def test_bad_loss_args_raise(loss, bad):
    known, tu, ti, _, _ = tiny_problem()
    with pytest.raises(ValueError, match=next(iter(bad))):
        build_objective(loss, known, tiny_model("mf", tu, ti), **bad)


@pytest.mark.parametrize("loss, model", [("srns", "mf"), ("mixgcf", "lightgcn")])
def test_gradients_finite_in_float32(loss, model):
    known, tu, ti, users, pos = tiny_problem(seed=8)
    net = tiny_model(model, tu, ti).float()
    obj = build_objective(loss, known, net)
    g = torch.Generator().manual_seed(0)
    obj.on_epoch_start(net, g, 0)
    out = obj(net, users, pos, g)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for p in net.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("loss, model", [("srns", "mf"), ("mixgcf", "lightgcn")])
def test_resume_gives_the_same_result(tmp_path, loss, model):
    data = synthetic_dataset(num_users=120, num_items=60, interactions_per_user=12, seed=1)
    config = dict(loss=loss, model=model, epochs=3, batch_size=256, dim=8, patience=100,
                  loss_args={"reset_memory_each_epoch": False, "warmup": 1} if loss == "srns" else {})
    quiet = dict(progress=False, log=lambda *_: None)
    straight = run(data, TrainConfig(**config), tmp_path / "a", **quiet)
    run(data, TrainConfig(**dict(config, epochs=2)), tmp_path / "b", **quiet)
    resumed = run(data, TrainConfig(**config), tmp_path / "b", resume=True, **quiet)
    assert [h["loss"] for h in resumed["epochs"]] == [h["loss"] for h in straight["epochs"]]
    assert resumed["test"] == straight["test"]


@pytest.mark.parametrize("loss, model", [
    ("srns", "mf"),
    pytest.param("mixgcf", "lightgcn", marks=pytest.mark.xfail(
        raises=BelowBPR, strict=True, reason="MixGCF reaches 0.87 x BPR on LightGCN here (NDCG@20 0.210 against "
        "0.242; 8 epochs: 0.210 against 0.265)")),
])
def test_short_run_on_ml100k_beats_most_popular_and_nearly_bpr(tmp_path, loss, model):
    data = load_dataset(data_path("ml-100k"), split="rs", seed=2020)
    config = TrainConfig(loss=loss, model=model, epochs=4, batch_size=1024, lr=0.01, reg_weight=0.0, dim=32,
                         patience=100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: extra threads only add contention on a shared machine
    try:
        results = run(data, config, tmp_path, progress=False, log=lambda *_: None)
        bpr_ndcg = bpr_twin_ndcg(data, config, tmp_path / "bpr")
    finally:
        torch.set_num_threads(threads)
    baseline = popularity_ndcg(data)
    assert results["test"]["ndcg@20"] > baseline, (results["test"]["ndcg@20"], baseline)
    assert_reaches_bpr(results["test"]["ndcg@20"], bpr_ndcg)
