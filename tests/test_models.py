"""Recommenders: shapes, the normalised graph, propagation against dense algebra, SGL views, errors."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from pnn_fast.models import LightGCN, Recommender, build_model
from pnn_fast.models.graph import NormalizedAdjacency, sparse_matmul

# torch's once-per-process "sparse CSR is beta" notice (graph.py filters it, pytest resets filters).
pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

NUM_USERS, NUM_ITEMS = 5, 7
# A repeated pair (0, 1), user 4 and item 6 without interactions.
TRAIN_USERS = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 0])
TRAIN_ITEMS = torch.tensor([0, 1, 2, 1, 3, 2, 4, 5, 0, 1])


def dense_normalized_adjacency(users, items, num_users, num_items) -> torch.Tensor:
    """RecBole's D^-1/2 A D^-1/2 written densely (test only), float64."""
    n = num_users + num_items
    a = torch.zeros(n, n, dtype=torch.float64)
    a[users, items + num_users] = 1.0
    a[items + num_users, users] = 1.0
    d = (a.sum(1) + 1e-7).pow(-0.5)
    return d[:, None] * a * d[None, :]


def _build(name, **overrides):
    torch.manual_seed(0)
    return build_model(name, NUM_USERS, NUM_ITEMS, TRAIN_USERS, TRAIN_ITEMS, **overrides)


@pytest.mark.parametrize("name,dim", [("mf", 64), ("lightgcn", 64), ("ngcf", 256), ("sgl", 64)])
def test_embedding_shapes(name, dim):
    model = _build(name)
    assert isinstance(model, Recommender)
    assert (model.num_users, model.num_items, model.dim) == (NUM_USERS, NUM_ITEMS, dim)
    users, items = model.embeddings()
    assert users.shape == (NUM_USERS, dim) and items.shape == (NUM_ITEMS, dim)
    assert users.dtype == items.dtype == torch.float32
    ego_u, ego_i = model.ego_embeddings(torch.tensor([1, 3]), torch.tensor([[0, 6], [2, 2]]))
    assert ego_u.shape == (2, 64) and ego_i.shape == (2, 2, 64)
    assert torch.equal(ego_u, model.user_embedding.weight[[1, 3]])


def test_custom_dim():
    model = build_model("ngcf", NUM_USERS, NUM_ITEMS, TRAIN_USERS, TRAIN_ITEMS, dim=8, hidden_size_list=[4, 2])
    assert model.dim == 14 and model.embeddings()[0].shape == (NUM_USERS, 14)


def test_adjacency_is_symmetric_normalised():
    adj = NormalizedAdjacency(TRAIN_USERS, TRAIN_ITEMS, NUM_USERS, NUM_ITEMS)
    dense = adj.csr().to_dense().double()
    expected = dense_normalized_adjacency(TRAIN_USERS, TRAIN_ITEMS, NUM_USERS, NUM_ITEMS)
    assert torch.allclose(dense, expected, atol=1e-7)
    assert torch.equal(dense, dense.T)
    assert adj.values.numel() == 2 * 9  # nine distinct pairs, both directions
    assert dense[NUM_USERS - 1].abs().sum() == 0 and dense[-1].abs().sum() == 0  # isolated nodes
    # Spot value: user 0 has degree 3 and item 1 (node 6) degree 2.
    assert dense[0, NUM_USERS + 1].item() == pytest.approx(1 / math.sqrt(3 * 2))


def test_sparse_matmul_gradient_matches_dense():
    adj = NormalizedAdjacency(TRAIN_USERS, TRAIN_ITEMS, NUM_USERS, NUM_ITEMS)
    x = torch.randn(NUM_USERS + NUM_ITEMS, 3, requires_grad=True)
    weight = torch.randn(NUM_USERS + NUM_ITEMS, 3)
    (adj(x) * weight).sum().backward()
    dense = adj.csr().to_dense()
    assert torch.allclose(x.grad, dense.T @ weight, atol=1e-6)
    # With an explicit (non-symmetric) matrix and transpose.
    m = torch.tensor([[0.0, 2.0], [0.0, 0.0]])
    y = torch.ones(2, 1, requires_grad=True)
    sparse_matmul(m.to_sparse_csr(), y, m.T.to_sparse_csr()).sum().backward()
    assert y.grad.flatten().tolist() == [0.0, 2.0]


@pytest.mark.parametrize("n_layers", [0, 1, 2, 3])
def test_lightgcn_equals_dense_propagation(n_layers):
    model = _build("lightgcn", n_layers=n_layers)
    users, items = model.embeddings()
    a = dense_normalized_adjacency(TRAIN_USERS, TRAIN_ITEMS, NUM_USERS, NUM_ITEMS)
    e = torch.cat([model.user_embedding.weight, model.item_embedding.weight]).double()
    layers = [e]
    for _ in range(n_layers):
        layers.append(a @ layers[-1])
    expected = torch.stack(layers).mean(0)
    assert torch.allclose(torch.cat([users, items]).double(), expected, atol=1e-6)
    # Backward reaches the layer-0 tables with the dense gradient.
    (users.sum() + 2 * items.sum()).backward()
    upstream = torch.cat([torch.ones(NUM_USERS, 64), 2 * torch.ones(NUM_ITEMS, 64)]).double()
    dense_grad = sum(torch.linalg.matrix_power(a, k) for k in range(n_layers + 1)) @ upstream / (n_layers + 1)
    assert torch.allclose(model.user_embedding.weight.grad.double(), dense_grad[:NUM_USERS], atol=1e-5)


def test_lightgcn_defaults_and_initialisation():
    model = build_model("lightgcn", 2000, 3000, torch.tensor([0]), torch.tensor([0]))
    assert model.n_layers == 2
    w = model.item_embedding.weight
    bound = math.sqrt(6 / (3000 + 64))  # xavier_uniform on [num, dim]
    assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
    mf = build_model("mf", 2000, 3000, torch.tensor([0]), torch.tensor([0]))
    std = math.sqrt(2 / (3000 + 64))  # xavier_normal
    assert mf.item_embedding.weight.std().item() == pytest.approx(std, rel=0.05)
    assert mf.item_embedding.weight.abs().max() > bound  # normal, not uniform


def test_ngcf_equals_dense_layers_in_eval_mode():
    model = _build("ngcf", hidden_size_list=[6, 5]).eval()
    users, items = model.embeddings()
    a = dense_normalized_adjacency(TRAIN_USERS, TRAIN_ITEMS, NUM_USERS, NUM_ITEMS).float()
    e = torch.cat([model.user_embedding.weight, model.item_embedding.weight])
    outputs = [e]
    for layer in model.layers:
        x = a @ e
        out = layer.linear.weight @ (e + x).T + layer.linear.bias[:, None]
        out = out + layer.interaction.weight @ (x * e).T + layer.interaction.bias[:, None]
        e = F.normalize(F.leaky_relu(out.T, 0.2), dim=1)
        outputs.append(e)
    assert torch.allclose(torch.cat([users, items]), torch.cat(outputs, 1), atol=1e-5)
    for layer in model.layers:  # xavier_normal weights, zero biases
        assert torch.count_nonzero(layer.linear.bias) == 0 and torch.count_nonzero(layer.interaction.bias) == 0


def test_ngcf_dropout_only_in_training():
    model = _build("ngcf")
    assert (model.message_dropout, model.node_dropout, model.hidden_size_list) == (0.1, 0.0, [64, 64, 64])
    model.eval()
    assert torch.equal(model.embeddings()[0], model.embeddings()[0])
    model.train()
    assert not torch.equal(model.embeddings()[0], model.embeddings()[0])


@pytest.mark.parametrize("node_dropout", [0.0, 0.5])
def test_ngcf_forward_backward_finite(node_dropout):
    model = _build("ngcf", node_dropout=node_dropout).train()
    users, items = model.embeddings()
    assert torch.isfinite(users).all() and torch.isfinite(items).all()
    loss = -(users[TRAIN_USERS] * items[TRAIN_ITEMS]).sum(1).sigmoid().log().mean()
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_node_dropout_keeps_expected_fraction_and_scales():
    adj = NormalizedAdjacency(torch.arange(400) % 40, torch.arange(400) // 40 % 30, 40, 30)
    torch.manual_seed(1)
    dropped, dropped_t = adj.dropout_entries(0.25)
    kept = dropped.values().numel() / adj.values.numel()
    assert 0.65 < kept < 0.85
    assert torch.equal(dropped.to_dense().T, dropped_t.to_dense())
    nz = dropped.to_dense() != 0
    assert torch.allclose(dropped.to_dense()[nz], adj.csr().to_dense()[nz] / 0.75)


def test_sgl_defaults():
    model = _build("sgl")
    assert (model.n_layers, model.type, model.drop_ratio, model.ssl_tau, model.ssl_weight) == (3, "ED", 0.1, 0.5, 0.05)


@pytest.mark.parametrize("name", ["mf", "lightgcn", "ngcf", "sgl"])
def test_the_l2_weight_is_not_a_model_argument(name):
    """The trainer owns the L2 weight (--reg-weight); a model given one says where it belongs."""
    with pytest.raises(ValueError, match=r"no hyper-parameter\(s\) \['reg_weight'\].*--reg-weight"):
        build_model(name, 5, 6, torch.tensor([0]), torch.tensor([0]), reg_weight=1e-5)


def test_sgl_auxiliary_loss_positive_differentiable_and_resampled():
    model = _build("sgl")
    users, items = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 3, 4, 0])
    gen = torch.Generator().manual_seed(0)
    model.on_epoch_start(gen)
    first = model.auxiliary_loss(users, items)
    assert first.dim() == 0 and torch.isfinite(first) and first.item() > 0
    first.backward()
    assert torch.isfinite(model.user_embedding.weight.grad).all()
    assert model.user_embedding.weight.grad.abs().sum() > 0
    assert torch.equal(model.auxiliary_loss(users, items), first.detach())  # same views, same loss
    model.on_epoch_start(gen)
    assert model.auxiliary_loss(users, items).item() != pytest.approx(first.item(), abs=1e-7)
    # Same generator seed, same views.
    model.on_epoch_start(torch.Generator().manual_seed(0))
    assert torch.equal(model.auxiliary_loss(users, items), first.detach())


def test_sgl_auxiliary_loss_matches_dense_infonce():
    model = _build("sgl", ssl_tau=0.2, ssl_weight=0.5)
    model.on_epoch_start(torch.Generator().manual_seed(3))
    users, items = torch.tensor([0, 2, 2]), torch.tensor([5, 0, 1])
    e = torch.cat([model.user_embedding.weight, model.item_embedding.weight])

    def view_tables(view):
        a = view[0].csr().to_dense()
        layers = [e]
        for _ in range(3):
            layers.append(a @ layers[-1])
        final = torch.stack(layers).mean(0)
        return final[:NUM_USERS], final[NUM_USERS:]

    def info_nce(z1, z2, rows):
        z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        sims = torch.exp(z1[rows] @ z2.T / 0.2)
        return -torch.log(sims[torch.arange(len(rows)), rows] / sims.sum(1)).sum()

    u1, i1 = view_tables(model.view1)
    u2, i2 = view_tables(model.view2)
    expected = 0.5 * (info_nce(u1, u2, users) + info_nce(i1, i2, items))
    assert torch.allclose(model.auxiliary_loss(users, items), expected, atol=1e-5)


def test_sgl_edge_dropout_views():
    users = torch.arange(300) % 30
    items = (torch.arange(300) * 7) % 50
    model = build_model("sgl", 30, 50, users, items)
    model.on_epoch_start(torch.Generator().manual_seed(0))
    assert len(model.view1) == len(model.view2) == 1
    distinct = model.edge_users.numel()
    assert model.view1[0].values.numel() == 2 * int(distinct * 0.9)
    assert not torch.equal(model.view1[0].col_indices, model.view2[0].col_indices)
    dense = model.view1[0].csr().to_dense()
    assert torch.equal(dense, dense.T)
    # The kept edges are a subset of the training graph, renormalised on their own degrees.
    full = model.adjacency.csr().to_dense()
    assert bool(((dense != 0) <= (full != 0)).all())
    kept_u, kept_i = (dense[:30, 30:] != 0).nonzero(as_tuple=True)
    assert torch.allclose(dense.double(), dense_normalized_adjacency(kept_u, kept_i, 30, 50).double(), atol=1e-6)


@pytest.mark.parametrize("kind", ["ND", "RW"])
def test_sgl_other_augmentations(kind):
    model = _build("sgl", type=kind, drop_ratio=0.4)
    model.on_epoch_start(torch.Generator().manual_seed(0))
    assert len(model.view1) == (3 if kind == "RW" else 1)
    loss = model.auxiliary_loss(torch.tensor([0, 1]), torch.tensor([2, 3]))
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    if kind == "ND":  # int(5 * 0.4) users and int(7 * 0.4) items lose all their edges
        dense = model.view1[0].csr().to_dense()
        isolated_users = int((dense[:NUM_USERS].abs().sum(1) == 0).sum())
        assert isolated_users >= 2


def test_sgl_lazy_views_without_epoch_hook():
    model = _build("sgl")
    assert torch.isfinite(model.auxiliary_loss(torch.tensor([0]), torch.tensor([0])))


@pytest.mark.parametrize("name", ["mf", "lightgcn", "ngcf"])
def test_no_auxiliary_loss_and_noop_epoch_hook(name):
    model = _build(name)
    before = [p.detach().clone() for p in model.parameters()]
    model.on_epoch_start(torch.Generator().manual_seed(0))
    assert model.auxiliary_loss(torch.tensor([0]), torch.tensor([1])).item() == 0.0
    assert not model.has_auxiliary_loss and _build("sgl").has_auxiliary_loss  # the trainer skips the call
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_models_deepcopy_and_state_dict_hold_only_parameters():
    model = _build("sgl")
    model.on_epoch_start()
    clone = copy.deepcopy(model)
    assert torch.equal(clone.embeddings()[0], model.embeddings()[0])
    assert set(model.state_dict()) == {"user_embedding.weight", "item_embedding.weight"}
    double = _build("sgl").double()
    assert double.embeddings()[0].dtype == torch.float64
    double.on_epoch_start()
    assert double.auxiliary_loss(torch.tensor([0]), torch.tensor([1])).dtype == torch.float64


def test_build_model_errors():
    with pytest.raises(ValueError, match=r"unknown model 'gcn'.*lightgcn.*mf.*ngcf.*sgl"):
        _build("gcn")
    with pytest.raises(ValueError, match="n_layer"):
        _build("lightgcn", n_layer=3)
    with pytest.raises(ValueError, match="n_layers"):
        _build("mf", n_layers=2)
    with pytest.raises(ValueError, match="type"):
        _build("sgl", type="XX")
    with pytest.raises(ValueError, match="drop_ratio"):
        _build("sgl", drop_ratio=1.0)
    with pytest.raises(ValueError, match="message_dropout"):
        _build("ngcf", message_dropout=-0.1)
    with pytest.raises(ValueError, match="n_layers"):
        _build("lightgcn", n_layers=-1)
    with pytest.raises(ValueError, match="train_items"):
        build_model("lightgcn", NUM_USERS, NUM_ITEMS, TRAIN_USERS, TRAIN_ITEMS + NUM_ITEMS)
    with pytest.raises(ValueError, match="dim"):
        build_model("mf", NUM_USERS, NUM_ITEMS, TRAIN_USERS, TRAIN_ITEMS, dim=0)
    assert isinstance(_build("LightGCN"), LightGCN)
