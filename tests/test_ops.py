"""The registered ops one by one: semantics against reference.py, gradcheck, torch.library.opcheck."""
from __future__ import annotations

import pytest
import torch

from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")

if _extension.has_kernels("cpu"):
    from pnn_fast import ops

from test_fused_parity import make_batch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _extension.has_kernels("cuda") else [])
ROW_ARGS = ("user_emb", "item_table", "users", "pos_items", "candidates", "known")


def row_args(batch: dict) -> list:
    return [batch[name] for name in ROW_ARGS]


def raw_args(batch: dict) -> list:
    """The positional tensors of the registered per-row ops."""
    known = batch["known"]
    return [batch["user_emb"], batch["item_table"], batch["users"], batch["pos_items"], batch["candidates"],
            known.indptr, known.indices]


def reference_classes(batch: dict, k: torch.Tensor):
    """(scores, unlabeled, negative) of reference.py; grid inputs make the scores exact."""
    scores = reference.row_scores(batch["user_emb"], batch["item_table"], batch["candidates"])
    unlabeled = reference.unlabeled_mask(batch["known"], batch["users"], batch["pos_items"], batch["candidates"])
    return scores, unlabeled, reference.bottom_k_mask(scores, unlabeled, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 7])
def test_hard_negative_argmax(device, per_row):
    batch = make_batch(150, 9, per_row=per_row, dtype=torch.float32, num_items=50, seed=1, device=device)
    hard, num_unlabeled = ops.hard_negative_argmax(*row_args(batch))
    scores, unlabeled, _ = reference_classes(batch, torch.zeros(150, dtype=torch.long, device=device))
    assert torch.equal(hard, reference.hard_negative(scores, unlabeled))
    assert torch.equal(num_unlabeled, unlabeled.sum(dim=1))
    assert torch.equal(ops.count_unlabeled(*row_args(batch)), num_unlabeled)
    # the centroid pass finds the same hard negative
    assert torch.equal(ops.class_centroids(*row_args(batch), torch.ones_like(hard))[6], hard)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 7])
def test_class_centroids_selection_state_reproduces_the_selection(device, per_row):
    """class_centroids' (threshold, cutoff) select the reference's negative class (k clamped)."""
    batch = make_batch(150, 9, per_row=per_row, dtype=torch.float32, num_items=50, seed=2, device=device)
    num_cands = batch["candidates"].shape[-1]
    k = torch.randint(-1, num_cands + 2, (150,), generator=torch.Generator().manual_seed(0)).to(device)
    *_, threshold, cutoff, _ = ops.class_centroids(*row_args(batch), k)
    assert threshold.dtype == torch.float32 and cutoff.dtype == torch.int64
    scores, unlabeled, negative = reference_classes(batch, k.clamp_min(0))
    index = torch.arange(num_cands, device=device)
    from_state = unlabeled & (cutoff[:, None] >= 0) & (
        (scores < threshold[:, None]) | ((scores == threshold[:, None]) & (index <= cutoff[:, None])))
    assert torch.equal(from_state, negative)


@pytest.mark.parametrize("device", DEVICES)
def test_class_centroids_are_class_means(device):
    batch = make_batch(80, 6, per_row=11, dtype=torch.float32, num_items=40, seed=3, device=device)
    k = torch.randint(0, 12, (80,), generator=torch.Generator().manual_seed(1)).to(device)
    neutral, negative, num_neutral, num_negative, *_ = ops.class_centroids(*row_args(batch), k)
    _, unlabeled, neg_mask = reference_classes(batch, k)
    cand_emb = reference.candidate_embeddings(batch["item_table"], batch["candidates"])
    for got, count, mask in ((neutral, num_neutral, unlabeled & ~neg_mask), (negative, num_negative, neg_mask)):
        assert torch.equal(count, mask.sum(dim=1))
        want = reference.class_sum(mask.float(), cand_emb) / count.clamp_min(1)[:, None]
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 5])
def test_class_centroids_gradcheck(device, per_row):
    batch = make_batch(12, 3, per_row=per_row, num_items=30, seed=4, device=device)  # continuous float64
    k = torch.full((12,), 2, device=device)
    args = row_args(batch)

    def centroids(item_table):
        return ops.class_centroids(args[0], item_table, *args[2:], k)[:2]

    table = batch["item_table"].clone().requires_grad_()
    assert torch.autograd.gradcheck(centroids, (table,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0.3, 30.0])
def test_pairwise_uniformity_gradcheck(device, scale):
    x = (torch.randn(9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale).to(device)
    assert torch.autograd.gradcheck(lambda y: ops.pairwise_uniformity(y, 2.0 / scale**2), (x.requires_grad_(),))


def opcheck_cases(device: str):
    """(op, args) for every registered op, with item_table/x requiring grad where differentiable."""
    batch = make_batch(10, 5, per_row=4, num_items=20, seed=5, device=device)
    base = raw_args(batch)
    k = torch.full((10,), 2, device=device)
    diff = list(base)
    diff[1] = base[1].clone().requires_grad_()
    out = torch.ops.pnn_fast.class_centroids_fwd(*base, k)
    grads = [torch.randn(10, 5, dtype=torch.float64, device=device) for _ in range(2)]
    x = torch.randn(6, 3, dtype=torch.float64, device=device)
    value = torch.ops.pnn_fast.pairwise_uniformity_fwd(x, 2.0)
    return [
        (torch.ops.pnn_fast.hard_negative_argmax.default, base),
        (torch.ops.pnn_fast.count_unlabeled.default, base),
        (torch.ops.pnn_fast.class_centroids_fwd.default, base + [k]),
        (torch.ops.pnn_fast.class_centroids_fwd.default, diff + [k]),
        (torch.ops.pnn_fast.class_centroids_bwd.default, grads + base + [out[4], out[5], out[2], out[3]]),
        (torch.ops.pnn_fast.pairwise_uniformity_fwd.default, [x, 2.0]),
        (torch.ops.pnn_fast.pairwise_uniformity_fwd.default, [x.clone().requires_grad_(), 2.0]),
        (torch.ops.pnn_fast.pairwise_uniformity_bwd.default, [torch.tensor(0.5, dtype=torch.float64, device=device),
                                                              x, 2.0, value]),
    ] + lookup_opcheck_cases(device)


def lookup_opcheck_cases(device: str):
    """(op, args) of the table-lookup ops (unknown_items, embedding_bpr, gathered_norm)."""
    gen = torch.Generator().manual_seed(8)
    known = make_batch(4, 3, num_items=20, seed=8, device=device)["known"]
    users = torch.tensor([0, 1, 1, 3], device=device)
    uniform = torch.rand(4, 3, generator=gen).to(device)
    user_table = torch.randn(5, 3, dtype=torch.float64, generator=gen).to(device)
    item_table = torch.randn(20, 3, dtype=torch.float64, generator=gen).to(device)
    pos, neg = torch.tensor([2, 5, 5, 0], device=device), torch.randint(20, (4, 2), generator=gen).to(device)
    bpr = [user_table, item_table, users, pos, neg]
    grad = torch.tensor(0.7, dtype=torch.float64, device=device)
    norm = torch.ops.pnn_fast.gathered_norm_fwd(item_table, neg.reshape(-1))
    bpr_cases = []
    for reg_weight in (0.0, 0.3):  # without and with the fused EmbLoss term
        _, coef, norms = torch.ops.pnn_fast.embedding_bpr_fwd(*bpr, reg_weight)
        bpr_cases += [
            (torch.ops.pnn_fast.embedding_bpr_fwd.default, bpr + [reg_weight]),
            (torch.ops.pnn_fast.embedding_bpr_fwd.default,
             [user_table.clone().requires_grad_(), item_table.clone().requires_grad_()] + bpr[2:] + [reg_weight]),
            (torch.ops.pnn_fast.embedding_bpr_bwd.default, [grad, coef, norms] + bpr + [reg_weight]),
        ]
    return bpr_cases + [
        (torch.ops.pnn_fast.unknown_items.default, [known.indptr, known.indices, users, uniform, known.num_items]),
        (torch.ops.pnn_fast.history_sample.default, [known.indptr, known.indices, users, uniform]),
        (torch.ops.pnn_fast.gathered_norm_fwd.default, [item_table.clone().requires_grad_(), neg.reshape(-1)]),
        (torch.ops.pnn_fast.gathered_norm_bwd.default, [grad, item_table, neg.reshape(-1), norm]),
        (torch.ops.pnn_fast.gathered_dots_fwd.default, [user_table[users], item_table, neg]),
        (torch.ops.pnn_fast.gathered_dots_fwd.default, [user_table[users].requires_grad_(),
                                                        item_table.clone().requires_grad_(), neg]),
        (torch.ops.pnn_fast.gathered_dots_bwd.default, [torch.randn(4, 2, dtype=torch.float64, generator=gen).to(device),
                                                        user_table[users], item_table, neg]),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_op(device):
    cases = opcheck_cases(device)
    assert {op.name() for op, _ in cases} == {f"pnn_fast::{name}" for name in (
        "hard_negative_argmax", "count_unlabeled", "class_centroids_fwd", "class_centroids_bwd",
        "pairwise_uniformity_fwd", "pairwise_uniformity_bwd", "unknown_items", "history_sample", "embedding_bpr_fwd",
        "embedding_bpr_bwd", "gathered_norm_fwd", "gathered_norm_bwd", "gathered_dots_fwd", "gathered_dots_bwd")}
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_kernel_preconditions_are_clear_errors():
    batch = make_batch(6, 4, seed=6)
    args = raw_args(batch)
    with pytest.raises(RuntimeError, match="users must be Long"):
        torch.ops.pnn_fast.hard_negative_argmax(args[0], args[1], args[2].int(), *args[3:])
    with pytest.raises(RuntimeError, match="candidates has ids outside"):
        torch.ops.pnn_fast.hard_negative_argmax(*args[:4], args[4] + 1000, *args[5:])
    with pytest.raises(RuntimeError, match=r"item_table must have shape \[-1, 4\]"):
        torch.ops.pnn_fast.hard_negative_argmax(args[0], args[1][:, :3], *args[2:])
    with pytest.raises(RuntimeError, match="threshold must be Double"):
        torch.ops.pnn_fast.class_centroids_bwd(args[0], args[0], *args, torch.zeros(6), torch.zeros(6, dtype=torch.long),
                                               torch.ones(6, dtype=torch.long), torch.ones(6, dtype=torch.long))


def test_empty_batch_and_no_candidates():
    batch = make_batch(5, 3, per_row=2, seed=7)
    empty = dict(batch, user_emb=batch["user_emb"][:0], users=batch["users"][:0], pos_items=batch["pos_items"][:0],
                 candidates=batch["candidates"][:0])
    hard, count = ops.hard_negative_argmax(*row_args(empty))
    assert hard.shape == (0,) and count.shape == (0,)
    no_cands = dict(batch, candidates=batch["candidates"][:, :0])
    hard, count = ops.hard_negative_argmax(*row_args(no_cands))
    assert hard.tolist() == [-1] * 5 and count.tolist() == [0] * 5
    neutral, negative, *_ = ops.class_centroids(*row_args(no_cands), torch.ones(5, dtype=torch.long))
    assert not neutral.any() and not negative.any()
