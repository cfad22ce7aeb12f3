"""pnn_fast::class_centroids_fwd / _bwd, the mean embedding of each row's neutral and negative
class: the selection and the means against the reference on exact grid inputs and on continuous
ones, gradcheck, opcheck, and bad input."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, make_batch, raw_args, reference_classes, requires_kernels, row_args
from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.known import KnownPositives

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
    """(op, args) for each schema of this op, the forward with and without an item_table requiring
    grad, per-row and shared candidates (the latter with saved scatter groups)."""
    cases = []
    for per_row, capacity in ((4, 0), (None, 6)):
        batch = make_batch(10, 5, per_row=per_row, num_items=20, seed=5, device=device)
        base = raw_args(batch)
        k = torch.full((10,), 2, device=device)
        diff = list(base)
        diff[1] = base[1].clone().requires_grad_()
        out = torch.ops.pnn_fast.class_centroids_fwd(*base, k, capacity)
        grads = [torch.randn(10, 5, dtype=torch.float64, device=device) for _ in range(2)]
        cases += [
            (torch.ops.pnn_fast.class_centroids_fwd.default, base + [k, capacity]),
            (torch.ops.pnn_fast.class_centroids_fwd.default, diff + [k, capacity]),
            (torch.ops.pnn_fast.class_centroids_bwd.default, grads + base + [out[4], out[5], out[2], out[3], out[7],
                                                                              out[8]]),
        ]
    return cases


def centroids_state(batch: dict, k: torch.Tensor, capacity: int) -> tuple:
    """The registered forward's outputs, without the item table requiring grad."""
    return torch.ops.pnn_fast.class_centroids_fwd(*raw_args(batch), k, capacity)


def backward_of(batch: dict, state: tuple, grads: list, saved_members: torch.Tensor, saved_ends: torch.Tensor):
    return torch.ops.pnn_fast.class_centroids_bwd(*grads, *raw_args(batch), state[4], state[5], state[2], state[3],
                                                  saved_members, saved_ends)


def mixed_batch(dtype=torch.float64):
    """300 shared candidates whose rows need every path of the backward: by difference (the
    labeled candidates fewer than U_b) and not, groups within and beyond a capacity of C / 8.
    Users 0-3 know 15 items in 16, users 4-7 two in 3, the others about 8 of the 200."""
    batch = make_batch(300, 7, dtype=dtype, num_users=40, num_items=200, known_per_user=8, seed=12)
    known = batch["known"]
    users = [torch.repeat_interleave(torch.arange(40), known.indptr.diff())]
    items = [known.indices]
    for heavy, one_in in ((torch.arange(0, 4), 16), (torch.arange(4, 8), 3)):
        heavy_items = torch.arange(200)[torch.arange(200) % one_in != 0]
        users.append(heavy.repeat_interleave(heavy_items.numel()))
        items.append(heavy_items.repeat(heavy.numel()))
    batch["known"] = KnownPositives.from_pairs(torch.cat(users), torch.cat(items), 40, 200)
    return batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saved_groups_are_each_rows_labeled_candidates_and_classes(dtype):
    """For every row that has them, the forward's saved groups are the candidates the reference
    labels (not in U_b) and its smaller class when the larger class is taken by difference
    (|labeled| <= |U_b|), else its neutral and its negative class; the other rows have none."""
    batch = mixed_batch(dtype)
    rows, count = batch["candidates"].shape[0], batch["candidates"].shape[0]
    k = torch.randint(0, 40, (rows,), generator=torch.Generator().manual_seed(1))
    capacity = count // 8
    state = centroids_state(batch, k, capacity)
    saved_members, saved_ends = state[7], state[8]
    assert saved_members.shape == (rows, capacity) and saved_ends.shape == (rows, 2)
    _, unlabeled, negative = reference_classes(batch, k)
    neutral = unlabeled & ~negative
    kinds = set()
    for b in range(rows):
        first, last = saved_ends[b].tolist()
        by_difference = count - int(unlabeled[b].sum()) <= int(unlabeled[b].sum())
        if by_difference:
            smaller = negative[b] if negative[b].sum() <= neutral[b].sum() else neutral[b]
            want = [~unlabeled[b], smaller]
        else:
            want = [neutral[b], negative[b]]
        need = sum(int(mask.sum()) for mask in want)
        if need > capacity:
            assert (first, last) == (-1, -1), f"row {b} needs {need} > {capacity} entries"
            kinds.add((by_difference, "rescored"))
            continue
        kinds.add((by_difference, "saved"))
        got = [saved_members[b, :first], saved_members[b, first:last]]
        for group, mask in zip(got, want):
            assert sorted(group.tolist()) == mask.nonzero().flatten().tolist(), f"row {b}"
    assert kinds == {(True, "saved"), (True, "rescored"), (False, "saved"), (False, "rescored")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saved_groups_give_the_rescored_gradient_bit_for_bit(dtype):
    """The backward from the saved groups, from none (every row rescored) and from a capacity of
    0 gives the same bits: the same additions in the same order."""
    batch = mixed_batch(dtype)
    rows = batch["candidates"].shape[0]
    k = torch.randint(0, 40, (rows,), generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(rows, 7, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2)]
    state = centroids_state(batch, k, rows // 8)
    from_saved = backward_of(batch, state, grads, state[7], state[8])
    assert (state[8][:, 1] >= 0).any() and (state[8][:, 1] < 0).any()
    rescored = backward_of(batch, state, grads, state[7], torch.full_like(state[8], -1))
    assert torch.equal(from_saved, rescored)
    no_capacity = centroids_state(batch, k, 0)
    assert (no_capacity[8] == -1).all()
    assert torch.equal(backward_of(batch, no_capacity, grads, no_capacity[7], no_capacity[8]), rescored)


def test_kernel_preconditions_are_clear_errors():
    batch = make_batch(6, 4, seed=6)
    args = raw_args(batch)
    no_groups = [torch.zeros(6, 0, dtype=torch.int32), torch.full((6, 2), -1, dtype=torch.int32)]
    with pytest.raises(RuntimeError, match="threshold must be Double"):
        torch.ops.pnn_fast.class_centroids_bwd(args[0], args[0], *args, torch.zeros(6), torch.zeros(6, dtype=torch.long),
                                               torch.ones(6, dtype=torch.long), torch.ones(6, dtype=torch.long),
                                               *no_groups)
    with pytest.raises(RuntimeError, match="k must be Long"):
        torch.ops.pnn_fast.class_centroids_fwd(*args, torch.ones(6, dtype=torch.int32), 0)
    k = torch.ones(6, dtype=torch.long)
    with pytest.raises(RuntimeError, match="capacity must be >= 0, got -1"):
        torch.ops.pnn_fast.class_centroids_fwd(*args, k, -1)
    state = centroids_state(batch, k, 4)
    grads = [args[0], args[0]]
    with pytest.raises(RuntimeError, match="saved_ends must be Int"):
        backward_of(batch, state, grads, state[7], state[8].long())
    with pytest.raises(RuntimeError, match=r"saved_ends\[2\] = \(0, 5\) is neither \(-1, -1\) nor within \[0, 4\]"):
        ends = state[8].clone()
        ends[2] = torch.tensor([0, 5])
        backward_of(batch, state, grads, state[7], ends)
    with pytest.raises(RuntimeError, match=r"saved_members\[1, 0\] = 6 is not a candidate index in \[0, 6\)"):
        members, ends = torch.zeros_like(state[7]), state[8].clone()
        members[1, 0] = 6
        ends[1] = torch.tensor([1, 1])
        backward_of(batch, state, grads, members, ends)


def test_outputs_are_named_and_the_hard_negative_is_hard_negative_argmaxs():
    """The op returns named results (no caller unpacks seven tensors by position)."""
    batch = make_batch(24, 8, per_row=12, seed=3)
    k = torch.full((24,), 3, dtype=torch.int64)
    out = ops.class_centroids(*row_args(batch), k)
    assert out._fields == ("neutral", "negative", "num_neutral", "num_negative", "threshold", "cutoff", "hard")
    found = ops.hard_negative_argmax(*row_args(batch))
    assert found._fields == ("hard", "num_unlabeled")
    assert torch.equal(out.hard, found.hard)
    assert torch.equal(out.num_neutral + out.num_negative, found.num_unlabeled)
