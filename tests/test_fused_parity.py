"""The fused backend (pnn_fast.fused on the C++/CUDA kernels) against the reference backend.

Two kinds of inputs keep the comparison about arithmetic, not about the luck of rounding at a
class boundary (the argmax and the bottom-k selection are discontinuous in the scores):

* grid inputs, multiples of 1/16 in [-4, 4] (float32 and the tie tests): every score and
  distance is exact whatever the summation order, so equal scores are equal in both backends,
  and repeated items (ties broken by the smallest candidate index) can be tested;
* continuous float64 inputs with distinct candidates in each row.  Repeated items are left out
  there because the reference's matmul does not give two equal columns bit-identical scores
  (MKL edge kernels), so its tie-break between them is decided by rounding noise.
"""
from __future__ import annotations

import pytest
import torch

from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.known import KnownPositives

pytestmark = pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")

if _extension.has_kernels("cpu"):
    from pnn_fast.backends import fused

CUDA = torch.cuda.is_available() and _extension.has_kernels("cuda")
NEG_SIZES = ("proportional", "count", 3)
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float64: {"rtol": 1e-10, "atol": 1e-10}}


def make_batch(rows: int, dim: int, *, per_row: int | None = None, dtype=torch.float64,
               grid: bool | None = None, num_users: int = 100, num_items: int = 400, known_per_user: int = 8,
               seed: int = 0, device="cpu") -> dict:
    """Random inputs of pnn_row_terms (see the module docstring).

    ``per_row=None`` gives shared (in-batch) candidates ``pos_items``, else ``[rows, per_row]``
    sampled ones.  ``grid`` defaults to True below float64; without it the candidates of a row
    are distinct.  Few items make repeated items and rows with zero or one unlabeled candidate
    common.
    """
    grid = dtype != torch.float64 if grid is None else grid
    gen = torch.Generator().manual_seed(seed)
    pair_users = torch.randint(0, num_users, (num_users * known_per_user,), generator=gen)
    pair_items = torch.randint(0, num_items, (num_users * known_per_user,), generator=gen)
    known = KnownPositives.from_pairs(pair_users, pair_items, num_users, num_items)
    order = torch.randperm(pair_users.numel(), generator=gen)
    if not grid and per_row is None:  # one interaction per positive item: distinct shared candidates
        first = torch.ones_like(order, dtype=torch.bool)
        first[1:] = pair_items[order][1:] != pair_items[order][:-1]
        order = order[torch.sort(pair_items[order], stable=True).indices][first]
        order = order[torch.randperm(order.numel(), generator=gen)]
        assert order.numel() >= rows, "not enough distinct items for distinct candidates"
    pick = order[:rows] if order.numel() >= rows else torch.randint(0, order.numel(), (rows,), generator=gen)

    def embedding(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        if grid:
            x = (x * 16).round().clamp(-64, 64) / 16
        return x.to(dtype)

    batch = {
        "user_emb": embedding(rows, dim), "item_table": embedding(num_items, dim),
        "users": pair_users[pick], "pos_items": pair_items[pick],
        "noise_pos": torch.rand(rows, dim, generator=gen, dtype=torch.float64).to(dtype) * 0.1,
        "noise_neg": torch.rand(rows, dim, generator=gen, dtype=torch.float64).to(dtype) * 0.1,
    }
    if per_row is None:
        batch["candidates"] = batch["pos_items"]
    elif grid:
        batch["candidates"] = torch.randint(0, num_items, (rows, per_row), generator=gen)
    else:
        batch["candidates"] = torch.rand(rows, num_items, generator=gen).argsort(dim=1)[:, :per_row]
    batch = {name: x.to(device) for name, x in batch.items()}
    batch["known"] = known.to(device)
    return batch


def row_terms(module, batch: dict, neg_size, grad_weights: torch.Tensor):
    """pnn_row_terms of `module`, and the gradients of sum_b w_b . (bpr_b, rank_b, constrain_b)."""
    user_emb = batch["user_emb"].clone().requires_grad_()
    item_table = batch["item_table"].clone().requires_grad_()
    terms = module.pnn_row_terms(user_emb, item_table, batch["users"], batch["pos_items"], batch["candidates"],
                                 batch["known"], neg_size, batch["noise_pos"], batch["noise_neg"])
    floats = torch.stack([terms["bpr"], terms["rank"], terms["constrain"]], dim=1)
    grads = torch.autograd.grad((floats * grad_weights).sum(), [user_emb, item_table])
    return terms, grads


def assert_terms_equal(got: dict, want: dict, got_grads, want_grads, **tol):
    for name, value in want.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[name], value, **tol, msg=lambda m, name=name: f"{name}: {m}")
        else:
            assert torch.equal(got[name].cpu(), value.cpu()), name
    for name, g, w in zip(("user_emb", "item_table"), got_grads, want_grads):
        torch.testing.assert_close(g, w, **tol, msg=lambda m, name=name: f"grad {name}: {m}")


def check_row_terms(batch: dict, neg_size, tol: dict, rows=None):
    """fused vs reference on `batch`; the reference only on `rows` (all by default) when given."""
    rows_ = slice(None) if rows is None else rows
    grad_weights = torch.rand(batch["users"].shape[0], 3, dtype=batch["user_emb"].dtype,
                              generator=torch.Generator().manual_seed(1)).to(batch["user_emb"].device)
    if rows is not None:  # gradients of the other rows are zero, so the subset's reference matches
        mask = torch.zeros_like(grad_weights[:, 0], dtype=torch.bool)
        mask[rows] = True
        grad_weights = grad_weights * mask[:, None]
    got, got_grads = row_terms(fused, batch, neg_size, grad_weights)
    sub = dict(batch)
    for name in ("user_emb", "users", "pos_items", "noise_pos", "noise_neg"):
        sub[name] = batch[name][rows_]
    if batch["candidates"].dim() == 2:
        sub["candidates"] = batch["candidates"][rows_]
    want, want_grads = row_terms(reference, sub, neg_size, grad_weights[rows_])
    got = {name: value[rows_] for name, value in got.items()}
    got_grads = (got_grads[0][rows_], got_grads[1])
    assert_terms_equal(got, want, got_grads, want_grads, **tol)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("neg_size", NEG_SIZES)
@pytest.mark.parametrize("rows,dim,per_row", [(1, 8, None), (1, 3, 5), (7, 67, None), (64, 67, None),
                                              (64, 67, 9), (300, 33, None), (300, 5, 40)])
def test_row_terms_match_reference(rows, dim, per_row, neg_size, dtype):
    batch = make_batch(rows, dim, per_row=per_row, dtype=dtype, seed=rows + dim)
    check_row_terms(batch, neg_size, TOLERANCE[dtype])


@pytest.mark.parametrize("per_row", [None, 4])
def test_rows_with_zero_or_one_unlabeled_candidate(per_row):
    # 6 items and users who know about half of them: |U_b| of 0 or 1 is common (with shared
    # candidates only in small batches, hence several)
    rows, batches = (200, 1) if per_row else (6, 12)
    sizes = []
    for seed in range(batches):
        batch = make_batch(rows, 11, per_row=per_row, grid=True, num_users=12, num_items=6, known_per_user=4,
                           seed=seed)
        for neg_size in NEG_SIZES + (0,):
            got = check_row_terms(batch, neg_size, TOLERANCE[torch.float64])
            sizes.append(got["num_negative"] + got["num_neutral"])
    sizes = torch.cat(sizes)
    assert bool((sizes == 0).any()) and bool((sizes == 1).any())


def test_light_and_heavy_users_of_a_shared_list():
    """A shared list's labeled candidates are found by binary searches for a light user and by a
    merge for a heavy one (N_u log2 C >= C + N_u); both, with repeated candidate items and rows
    whose positive is or is not among their known items, must give the reference's U_b."""
    batch = make_batch(128, 8, grid=True, num_users=40, num_items=150, known_per_user=20, seed=11)
    known = batch["known"]
    counts = known.count(batch["users"])
    heavy = (counts + 1) * 7 >= 128 + counts  # log2(C) = 7 for C = 128 candidates
    assert bool(heavy.any()) and bool((~heavy).any())
    assert len(set(batch["pos_items"].tolist())) < 128  # repeated candidate items
    got = None
    for neg_size in NEG_SIZES:
        got = check_row_terms(batch, neg_size, TOLERANCE[torch.float64])
    members = (batch["pos_items"][None, :] != batch["pos_items"][:, None]) & ~known.contains(
        batch["users"][:, None], batch["pos_items"][None, :])
    assert torch.equal(got["num_negative"] + got["num_neutral"], members.sum(dim=1))


def test_repeated_items_tie_break_by_candidate_index():
    # 3 items for 50 rows: every candidate item repeats, so ties are everywhere (grid inputs: exact)
    for dtype in (torch.float32, torch.float64):
        batch = make_batch(50, 4, num_users=30, num_items=3, known_per_user=1, dtype=dtype, grid=True, seed=5)
        for neg_size in NEG_SIZES:
            check_row_terms(batch, neg_size, TOLERANCE[dtype])


@pytest.mark.parametrize("per_row", [None, 16])
def test_large_batch(per_row):
    # B = 8192; with shared candidates the reference ([B, B] matrices) runs on 64 of the rows
    batch = make_batch(8192, 19, per_row=per_row, dtype=torch.float32, num_users=3000, num_items=5000,
                       known_per_user=20, seed=7)
    rows = None if per_row is not None else torch.randperm(8192, generator=torch.Generator().manual_seed(0))[:64]
    check_row_terms(batch, "proportional", TOLERANCE[torch.float32], rows=rows)


@pytest.mark.parametrize("per_row", [None, 6])
@pytest.mark.parametrize("grid", [False, True])
def test_hard_negative_bpr_matches_reference(per_row, grid):
    batch = make_batch(97, 67, per_row=per_row, grid=grid, num_items=120, seed=11)
    args = [batch[name] for name in ("users", "pos_items", "candidates", "known")]
    outs = {}
    for module in (fused, reference):
        user_emb = batch["user_emb"].clone().requires_grad_()
        item_table = batch["item_table"].clone().requires_grad_()
        bpr, hard, num_unlabeled = module.hard_negative_bpr(user_emb, item_table, *args)
        grads = torch.autograd.grad((bpr * torch.linspace(0.5, 2, bpr.numel(), dtype=bpr.dtype)).sum(),
                                    [user_emb, item_table])
        outs[module] = (bpr, hard, num_unlabeled) + grads
    for got, want in zip(outs[fused], outs[reference]):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])


def uniformity_from_differences(x: torch.Tensor, t: float) -> torch.Tensor:
    """The uniformity from ||x_i - x_j||^2 summed over differences ([n, n, d] memory: tests only).

    The reference expands |x_i|^2 + |x_j|^2 - 2 x_i.x_j, which loses ~|x|^2 eps absolute per
    distance; at large scales this form is the accurate one to compare with.
    """
    n = x.shape[0]
    dist2 = (x[:, None, :] - x[None, :, :]).pow(2).sum(dim=-1)
    logits = (-t * dist2).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return torch.logsumexp(logits.reshape(-1), dim=0) - torch.log(torch.tensor(float(n * (n - 1)), dtype=x.dtype))


@pytest.mark.parametrize("n,dim", [(1, 3), (2, 1), (3, 5), (50, 67), (257, 8)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_pairwise_uniformity_matches_reference(n, dim, scale):
    x = (torch.randn(n, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(n)) * scale)
    grad_out = torch.tensor(0.7, dtype=torch.float64)
    want_fn = reference.pairwise_uniformity if scale <= 1 or n < 2 else uniformity_from_differences
    results = []
    for fn in (fused.pairwise_uniformity, want_fn):
        xr = x.clone().requires_grad_()
        value = fn(xr, 2.0)
        grad = torch.autograd.grad(value, xr, grad_out, allow_unused=True)[0]
        results.append((value, torch.zeros_like(x) if grad is None else grad))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    # the weights exp(l_ij - L) carry the absolute rounding of logits of size t |x|^2 (1e8 at
    # scale 1e3: 1e-8 in float64), whatever the formula
    grad_rtol = 1e-9 if scale <= 1 else 1e-6
    torch.testing.assert_close(got_grad, want_grad, rtol=grad_rtol, atol=1e-12)


def test_pairwise_uniformity_float32_at_large_scale():
    # distances from differences, exponentials behind a max: float32 stays accurate and finite
    x = torch.randn(300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 100
    want = reference.pairwise_uniformity(x, 2.0)
    got = fused.pairwise_uniformity(x.float(), 2.0)
    assert torch.isfinite(got)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


def test_int32_ids_and_non_contiguous_inputs():
    batch = make_batch(40, 12, per_row=7, seed=13)
    want, want_grads = row_terms(reference, batch, "count", torch.ones(40, 3, dtype=torch.float64))
    odd = dict(batch)
    odd["user_emb"] = batch["user_emb"].t().contiguous().t()  # column-major
    odd["item_table"] = torch.stack([batch["item_table"]] * 2, dim=2)[..., 1]
    odd["candidates"] = batch["candidates"].int().t().contiguous().t()
    odd["users"] = torch.stack([batch["users"].int()] * 2, dim=1)[:, 0]
    odd["pos_items"] = torch.stack([batch["pos_items"].int()] * 2, dim=1)[:, 1]
    for name in ("user_emb", "item_table", "candidates", "users", "pos_items"):
        assert not odd[name].is_contiguous(), name
    got, got_grads = row_terms(fused, odd, "count", torch.ones(40, 3, dtype=torch.float64))
    assert_terms_equal(got, want, got_grads, want_grads, **TOLERANCE[torch.float64])


def test_mixed_devices_and_dtypes_are_clear_errors():
    batch = make_batch(8, 4, seed=17)
    args = lambda **over: [over.get(n, batch[n]) for n in ("user_emb", "item_table", "users", "pos_items",
                                                              "candidates", "known")]
    with pytest.raises(TypeError, match="item_table has dtype torch.float32 but user_emb has torch.float64"):
        fused.hard_negative_bpr(*args(item_table=batch["item_table"].float()))
    with pytest.raises(ValueError, match="candidates is on meta but user_emb is on cpu"):
        fused.hard_negative_bpr(*args(candidates=batch["candidates"].to("meta")))
    with pytest.raises(RuntimeError, match="no kernels for device type 'meta'"):
        fused.pairwise_uniformity(torch.zeros(3, 2, device="meta"), 2.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    # grid inputs are exact in both formats, so classes match; outputs are rounded to `dtype`
    batch = make_batch(64, 16, dtype=torch.float32, seed=19)
    half = {n: (x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for n, x in batch.items()}
    weights = torch.ones(64, 3)
    want, _ = row_terms(reference, batch, "proportional", weights)
    got, got_grads = row_terms(fused, half, "proportional", weights.to(dtype))
    assert got["bpr"].dtype == dtype and got_grads[1].dtype == dtype
    for name in ("hard_negative", "num_negative", "num_neutral", "valid"):
        assert torch.equal(got[name], want[name]), name
    for name in ("bpr", "rank", "constrain"):
        torch.testing.assert_close(got[name].float(), want[name], rtol=0.05, atol=0.05)
    value = fused.pairwise_uniformity(batch["item_table"].to(dtype), 2.0)
    assert value.dtype == dtype
    torch.testing.assert_close(value.float(), reference.pairwise_uniformity(batch["item_table"], 2.0),
                               rtol=0.02, atol=0.02)


def test_no_batch_by_batch_buffer():
    """At B = 2048 (shared candidates) no single allocation of the fused path reaches a B x B
    bool matrix: torch.profiler records every CPU allocation of ATen and of the kernels."""
    rows = 2048
    batch = make_batch(rows, 64, dtype=torch.float32, num_users=1000, num_items=4000, known_per_user=20, seed=23)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        row_terms(fused, batch, "proportional", torch.ones(rows, 3))
        x = batch["item_table"][:rows].clone().requires_grad_()
        fused.pairwise_uniformity(x, 2.0).backward()
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert 0 < largest < rows * rows, f"an op allocated {largest} bytes"


def test_fused_pnn_step_is_bitwise_reproducible_on_two_threads():
    """The same seed gives bit-identical loss and gradients on a multi-threaded CPU: the kernels'
    reductions have a fixed order, and the loss's own gathers use index_select (whose backward adds
    repeated rows in order) rather than advanced indexing (whose CPU backward may add them in any order)."""
    from pnn_fast import PNNLoss

    batch = make_batch(2048, 64, dtype=torch.float32, num_users=500, num_items=3000, seed=31)
    loss_fn = PNNLoss(batch["known"], 64, backend="cpu")
    threads = torch.get_num_threads()
    results = []
    try:
        torch.set_num_threads(2)
        for _ in range(3):
            torch.manual_seed(0)  # the attention's history sample and the clamp noise
            user_emb = batch["user_emb"].clone().requires_grad_()
            item_table = batch["item_table"].clone().requires_grad_()
            loss = loss_fn(user_emb, item_table, batch["users"], batch["pos_items"])
            loss.backward()
            results.append((loss.detach(), user_emb.grad, item_table.grad))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("device,mode", [("cpu", None)] + [
    pytest.param("cuda", mode, marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs CUDA kernels")])
    for mode in (None, "reduce-overhead")])
def test_compiled_training_matches_eager(device, mode):
    """torch.compile(fullgraph=True) of a small MF model trained with PNNLoss on the fused
    kernels: no graph break (fullgraph raises on one) and the same losses as eager.  CUDA graphs
    (reduce-overhead) would expose a kernel launched off the current stream."""
    from pnn_fast.losses import PNNLoss

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


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("per_row", [None, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_reference(per_row, dtype):
    for neg_size in NEG_SIZES:
        batch = make_batch(300, 67, per_row=per_row, dtype=dtype, seed=31, device="cuda")
        check_row_terms(batch, neg_size, TOLERANCE[dtype])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("rows", [8192, 20000])
def test_cuda_large_batch_takes_the_slow_path_correctly(rows):
    # 20000 shared candidates exceed the shared-memory plan of class_centroids: the multi-pass path
    batch = make_batch(rows, 64, dtype=torch.float32, num_users=5000, num_items=30000, known_per_user=30,
                       seed=37, device="cuda")
    subset = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[:48].cuda()
    for neg_size in ("proportional", "count"):
        check_row_terms(batch, neg_size, TOLERANCE[torch.float32], rows=subset)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
def test_cuda_uniformity_and_cpu_parity():
    x = torch.randn(3000, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results = []
    for device in ("cpu", "cuda"):
        xd = x.to(device).requires_grad_()
        value = fused.pairwise_uniformity(xd, 2.0)
        results.append((value.cpu(), torch.autograd.grad(value, xd)[0].cpu()))
    torch.testing.assert_close(results[0], results[1], rtol=1e-10, atol=1e-12)
