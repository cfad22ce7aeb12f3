"""pnn_fast::class_centroids_fwd / _bwd, the mean embedding of each row's neutral and negative
class: the selection and the means against the reference on exact grid inputs and on continuous
ones, gradcheck, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, make_batch, raw_args, reference_classes, requires_kernels, row_args
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def assert_centroids_are_class_means(batch: dict, k: torch.Tensor, tol: float):
    """class_centroids' class sizes are those of the reference's classes, its centroids their means."""
    neutral, negative, num_neutral, num_negative, *_ = ops.class_centroids(*row_args(batch), k)
    _, unlabeled, neg_mask = reference_classes(batch, k)
    cand_emb = reference.candidate_embeddings(batch["item_table"], batch["candidates"])
    dtype = batch["user_emb"].dtype
    for got, count, mask in ((neutral, num_neutral, unlabeled & ~neg_mask), (negative, num_negative, neg_mask)):
        assert torch.equal(count, mask.sum(dim=1))
        want = reference.class_sum(mask.to(dtype), cand_emb) / count.clamp_min(1)[:, None]
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


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
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("order", ["descending", "ascending", "random", "lowest_every_8th"])
def test_class_centroids_selection_state_on_long_rows(device, dtype, order):
    """Rows of 1,200 shared candidates whose scores fall, rise or wander along the list: the CPU
    selection buffers every member below its bound and re-selects whenever the buffer fills, which
    falling scores do after every few candidates.  "lowest_every_8th" puts the lowest scores at
    every 8th position, where the CPU kernel samples its first bound: that bound then admits fewer
    than k members and the row is scanned again without one.  Grid inputs, so ties at the threshold
    are common and must go to the smallest index; k from 0 to past |U_b|; float keys (packed with
    the index) and double keys (kept apart)."""
    batch = make_batch(1200, 5, dtype=dtype, grid=True, num_items=900, known_per_user=40, seed=4, device=device)
    # one user vector for every row, so that one order of the list orders each row's scores
    batch["user_emb"] = batch["user_emb"][:1].expand(1200, -1).contiguous()
    scores = batch["item_table"][batch["pos_items"]] @ batch["user_emb"][0]
    if order != "random":
        perm = torch.sort(scores.cpu(), descending=order == "descending", stable=True).indices
        if order == "lowest_every_8th":
            every_8th = torch.arange(1200) % 8 == 0
            spread = torch.empty_like(perm)
            spread[every_8th] = perm[:int(every_8th.sum())]
            spread[~every_8th] = perm[int(every_8th.sum()):]
            perm = spread
        perm = perm.to(device)
        for name in ("users", "pos_items", "noise_pos", "noise_neg"):
            batch[name] = batch[name][perm]
        batch["candidates"] = batch["pos_items"]
    k = torch.tensor([0, 1, 2, 7, 63, 64, 65, 200, 1100, 1300] * 120, device=device)
    *_, threshold, cutoff, _ = ops.class_centroids(*row_args(batch), k)
    scores, unlabeled, negative = reference_classes(batch, k)
    assert negative.sum(1).eq(torch.minimum(k, unlabeled.sum(1))).all()
    index = torch.arange(1200, device=device)
    from_state = unlabeled & (cutoff[:, None] >= 0) & (
        (scores < threshold[:, None]) | ((scores == threshold[:, None]) & (index <= cutoff[:, None])))
    assert torch.equal(from_state, negative)


@pytest.mark.parametrize("device", DEVICES)
def test_class_centroids_are_class_means(device):
    batch = make_batch(80, 6, per_row=11, dtype=torch.float32, num_items=40, seed=3, device=device)
    k = torch.randint(0, 12, (80,), generator=torch.Generator().manual_seed(1)).to(device)
    assert_centroids_are_class_means(batch, k, tol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [None, 11])
def test_class_centroids_on_continuous_inputs(device, per_row):
    """float64 scores off the grid, distinct candidates in each row: the reference's class sizes and
    means (not the selection state: its threshold is the kernel's score of the cutoff candidate,
    a few ulps from the reference's off the grid)."""
    batch = make_batch(120, 17, per_row=per_row, seed=8, device=device)
    k = torch.randint(0, batch["candidates"].shape[-1] + 1, (120,), generator=torch.Generator().manual_seed(2))
    assert_centroids_are_class_means(batch, k.to(device), tol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_class_centroids_of_a_long_batch_in_several_score_tiles(device):
    """2,100 rows against 2,100 shared candidates: on CUDA the rows are scored in 8 tiles of 263
    (for_each_score_tile), the last of 259 rows starting at row 1,841.  Grid inputs (exact
    scores): the reference's classes, its class means and the gradient of the means w.r.t. the item
    table, for k from 0 to past |U_b|."""
    batch = make_batch(2100, 6, dtype=torch.float32, num_users=300, num_items=3000, known_per_user=20, seed=11,
                       device=device)
    k = torch.randint(0, 40, (2100,), generator=torch.Generator().manual_seed(3)).to(device)
    k[::97] = 2200
    assert_centroids_are_class_means(batch, k, tol=1e-5)
    weights = torch.randn(2, 2100, 6, generator=torch.Generator().manual_seed(4)).to(device)
    args = row_args(batch)
    table = batch["item_table"].clone().requires_grad_()
    neutral, negative, *_ = ops.class_centroids(args[0], table, *args[2:], k)
    (grad,) = torch.autograd.grad((neutral * weights[0]).sum() + (negative * weights[1]).sum(), table)
    _, unlabeled, neg_mask = reference_classes(batch, k)
    ref_table = batch["item_table"].clone().requires_grad_()
    cand_emb = reference.candidate_embeddings(ref_table, batch["candidates"])
    loss = 0
    for w, mask in ((weights[0], unlabeled & ~neg_mask), (weights[1], neg_mask)):
        mean = reference.class_sum(mask.float(), cand_emb) / mask.sum(1).clamp_min(1)[:, None]
        loss = loss + (mean * w).sum()
    (want,) = torch.autograd.grad(loss, ref_table)
    torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("per_row", [None, 13])
def test_cuda_selection_is_the_cpus_bit_for_bit(per_row):
    """Continuous float32 inputs, d = 67 (no 16-byte rows) and 64: CUDA's scores (the score tiles of a
    shared list, each thread's chain for per-row lists) are pnn_rows.h's chain, as the CPU's, so the
    selection state, the threshold included (a score itself), and the hard negative match exactly."""
    for dim in (67, 64):
        batches = [make_batch(700, dim, per_row=per_row, dtype=torch.float32, grid=False, num_users=300,
                              num_items=900, seed=12, device=device) for device in ("cpu", "cuda")]
        k = torch.randint(0, 30, (700,), generator=torch.Generator().manual_seed(5))
        cpu = ops.class_centroids(*row_args(batches[0]), k)
        cuda = ops.class_centroids(*row_args(batches[1]), k.cuda())
        for name, want, got in zip(("num_neutral", "num_negative", "threshold", "cutoff", "hard"), cpu[2:], cuda[2:]):
            assert torch.equal(got.cpu(), want), f"{name} differs (d = {dim})"
        torch.testing.assert_close(cuda[0].cpu(), cpu[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cuda[1].cpu(), cpu[1], rtol=1e-5, atol=1e-5)


def test_class_centroids_without_candidates_are_zero():
    batch = make_batch(5, 3, per_row=2, seed=7)
    no_cands = dict(batch, candidates=batch["candidates"][:, :0])
    neutral, negative, *_ = ops.class_centroids(*row_args(no_cands), torch.ones(5, dtype=torch.long))
    assert not neutral.any() and not negative.any()


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


def opcheck_cases(device: str) -> list:
    """(op, args) for each schema of this op, the forward with and without an item_table requiring grad."""
    batch = make_batch(10, 5, per_row=4, num_items=20, seed=5, device=device)
    base = raw_args(batch)
    k = torch.full((10,), 2, device=device)
    diff = list(base)
    diff[1] = base[1].clone().requires_grad_()
    out = torch.ops.pnn_fast.class_centroids_fwd(*base, k)
    grads = [torch.randn(10, 5, dtype=torch.float64, device=device) for _ in range(2)]
    return [
        (torch.ops.pnn_fast.class_centroids_fwd.default, base + [k]),
        (torch.ops.pnn_fast.class_centroids_fwd.default, diff + [k]),
        (torch.ops.pnn_fast.class_centroids_bwd.default, grads + base + [out[4], out[5], out[2], out[3]]),
    ]


def test_kernel_preconditions_are_clear_errors():
    args = raw_args(make_batch(6, 4, seed=6))
    with pytest.raises(RuntimeError, match="threshold must be Double"):
        torch.ops.pnn_fast.class_centroids_bwd(args[0], args[0], *args, torch.zeros(6), torch.zeros(6, dtype=torch.long),
                                               torch.ones(6, dtype=torch.long), torch.ones(6, dtype=torch.long))
    with pytest.raises(RuntimeError, match="k must be Long"):
        torch.ops.pnn_fast.class_centroids_fwd(*args, torch.ones(6, dtype=torch.int32))
