"""pnn_fast.backends: select(), which implementation runs; the fused backend's per-row functions
(pnn_row_terms, hard_negative_bpr) against the reference backend's on the inputs of
tests/batches.py (exact grids and continuous float64; float32, float64 and half precision;
shared and per-row candidates; CPU and CUDA); and the reference's own tie rule."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from batches import DEVICES, TOLERANCE, make_batch, requires_kernels
from pnn_fast import _extension, backends
from pnn_fast.backends import reference
from pnn_fast.backends.rows import ClassTerms, HardNegativeBPR, TopK
from pnn_fast.csr import CSR
from pnn_fast.sampling import sample_unknown

if _extension.has_kernels("cpu"):
    from pnn_fast.backends import fused

CUDA = "cuda" in DEVICES
NEG_SIZES = ("proportional", "count", 3)


def test_select_names_the_implementation_for_the_device():
    assert backends.select("reference", torch.device("cpu")) is reference
    assert backends.select("auto", torch.device("cpu")) is (fused if _extension.has_kernels("cpu") else reference)
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.select("gpu", torch.device("cpu"))
    with pytest.raises(ValueError, match="backend='cuda' but the inputs are on cpu"):
        backends.select("cuda", torch.device("cpu"))


@requires_kernels
def test_select_gives_the_fused_kernels_for_their_device_type():
    assert backends.select("cpu", torch.device("cpu")) is fused
    assert backends.select("auto", "cuda:0") is (fused if _extension.has_kernels("cuda") else reference)


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


@requires_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("neg_size", NEG_SIZES)
@pytest.mark.parametrize("rows,dim,per_row", [(1, 8, None), (1, 3, 5), (7, 67, None), (64, 67, None),
                                              (64, 67, 9), (300, 33, None), (300, 5, 40)])
def test_row_terms_match_reference(rows, dim, per_row, neg_size, dtype):
    batch = make_batch(rows, dim, per_row=per_row, dtype=dtype, seed=rows + dim)
    check_row_terms(batch, neg_size, TOLERANCE[dtype])


@requires_kernels
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


@requires_kernels
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


@requires_kernels
def test_repeated_items_tie_break_by_candidate_index():
    # 3 items for 50 rows: every candidate item repeats, so ties are everywhere (grid inputs: exact)
    for dtype in (torch.float32, torch.float64):
        batch = make_batch(50, 4, num_users=30, num_items=3, known_per_user=1, dtype=dtype, grid=True, seed=5)
        for neg_size in NEG_SIZES:
            check_row_terms(batch, neg_size, TOLERANCE[dtype])


@requires_kernels
@pytest.mark.parametrize("per_row", [None, 16])
def test_large_batch(per_row):
    # B = 8192; with shared candidates the reference ([B, B] matrices) runs on 64 of the rows
    batch = make_batch(8192, 19, per_row=per_row, dtype=torch.float32, num_users=3000, num_items=5000,
                       known_per_user=20, seed=7)
    rows = None if per_row is not None else torch.randperm(8192, generator=torch.Generator().manual_seed(0))[:64]
    check_row_terms(batch, "proportional", TOLERANCE[torch.float32], rows=rows)


@requires_kernels
@pytest.mark.parametrize("per_row", [None, 6])
@pytest.mark.parametrize("grid", [False, True])
def test_hard_negative_bpr_matches_reference(per_row, grid):
    batch = make_batch(97, 67, per_row=per_row, grid=grid, num_items=120, seed=11)
    args = [batch[name] for name in ("users", "pos_items", "candidates", "known")]
    outs = {}
    for module in (fused, reference):
        user_emb = batch["user_emb"].clone().requires_grad_()
        item_table = batch["item_table"].clone().requires_grad_()
        found = module.hard_negative_bpr(user_emb, item_table, *args)
        assert isinstance(found, HardNegativeBPR)
        bpr = found.bpr
        grads = torch.autograd.grad((bpr * torch.linspace(0.5, 2, bpr.numel(), dtype=bpr.dtype)).sum(),
                                    [user_emb, item_table])
        outs[module] = (bpr, found.hard, found.num_unlabeled) + grads
    for got, want in zip(outs[fused], outs[reference]):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])


@requires_kernels
@pytest.mark.parametrize("hard", [False, True])
def test_candidates_drawn_from_unknown_items_skip_the_lookups_and_change_nothing(hard):
    """PNNLoss promises candidates_unknown for the candidates it draws itself (sample_unknown), and
    the fused backend then looks up no known item: its terms and gradients must be bit-identical to
    the looked-up ones, and match the reference (which always looks up)."""
    batch = make_batch(300, 9, per_row=None, num_items=4000, seed=11)
    gen = torch.Generator().manual_seed(12)
    batch["candidates"] = sample_unknown(batch["known"], batch["users"], 6, gen)
    hard_candidates = sample_unknown(batch["known"], batch["users"], 5, gen) if hard else None
    # draws are with replacement; a row holding one item twice has a tie that the reference's matmul
    # may break either way (tests/batches.py), so those rows weigh nothing and are compared only here
    def distinct(ids):
        return ids.sort(dim=1).values.diff(dim=1).ne(0).all(dim=1)
    kept = distinct(batch["candidates"]) & (distinct(hard_candidates) if hard else True)
    assert kept.float().mean() > 0.9
    weights = torch.rand(300, 3, dtype=torch.float64, generator=gen) * kept[:, None]
    results = []
    for module, promise in ((fused, True), (fused, False), (reference, True)):
        user_emb = batch["user_emb"].clone().requires_grad_()
        item_table = batch["item_table"].clone().requires_grad_()
        terms = module.pnn_row_terms(user_emb, item_table, batch["users"], batch["pos_items"], batch["candidates"],
                                     batch["known"], "proportional", batch["noise_pos"], batch["noise_neg"],
                                     hard_candidates=hard_candidates, candidates_unknown=promise)
        floats = torch.stack([terms["bpr"], terms["rank"], terms["constrain"]], dim=1)
        results.append((terms, torch.autograd.grad((floats * weights).sum(), [user_emb, item_table])))
    (promised, promised_grads), (looked_up, looked_up_grads), (want, want_grads) = results
    for name, value in looked_up.items():
        assert torch.equal(promised[name], value), name
    assert all(torch.equal(a, b) for a, b in zip(promised_grads, looked_up_grads))
    assert_terms_equal({name: value[kept] for name, value in promised.items()},
                       {name: value[kept] for name, value in want.items()}, promised_grads, want_grads,
                       **TOLERANCE[torch.float64])
    assert (promised["num_negative"] + promised["num_neutral"] == 6).all()  # every drawn candidate is in U_b


@requires_kernels
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


@requires_kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    """Against the float32 reference, within tolerances derived from ``dtype``'s epsilon and the
    magnitudes that get rounded: a few times what the kernels reach, and for constrain far below its
    values (an atol of 0.05, as this test had, exceeds the largest value constrain can take)."""
    # grid inputs are exact in both formats, so classes match; outputs are rounded to `dtype`
    batch = make_batch(64, 16, dtype=torch.float32, seed=19)
    half = {n: (x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for n, x in batch.items()}
    weights = torch.ones(64, 3)
    want, _ = row_terms(reference, batch, "proportional", weights)
    got, got_grads = row_terms(fused, half, "proportional", weights.to(dtype))
    assert got["bpr"].dtype == dtype and got_grads[1].dtype == dtype
    for name in ("hard_negative", "num_negative", "num_neutral", "valid"):
        assert torch.equal(got[name], want[name]), name
    got, want = ({name: value.detach() for name, value in terms.items()} for terms in (got, want))
    eps = torch.finfo(dtype).eps
    # bpr and rank are softplus (1-Lipschitz) of differences of scores; every score (and centroid
    # score) of row b is a dot product rounded to `dtype`, off by at most about eps * S_b, S_b the
    # largest |u_b| . |e_j| of the row; the result is rounded once more (eps/2 of its value)
    largest_score = (batch["user_emb"].abs() @ batch["item_table"].abs().T).max(dim=1).values
    # constrain = ||n_pos * u - n_neg * v||^2 <= (2 noise_max)^2 = 0.04 with unit u, v: rounding moves it by
    # a fraction of eps times that bound
    noise_max = float(torch.maximum(batch["noise_pos"], batch["noise_neg"]).max())
    tolerance = {"bpr": eps * (want["bpr"].abs() + 2 * largest_score),
                 "rank": eps * (want["rank"].abs() + 2 * largest_score),
                 "constrain": torch.full_like(want["constrain"], eps * 4 * noise_max ** 2)}
    for name, tol in tolerance.items():
        error = (got[name].float() - want[name]).abs()
        assert torch.all(error <= tol), (name, float((error / tol).max()))
    assert float(want["constrain"].max()) > 10 * float(tolerance["constrain"][0])  # the bound is not vacuous
    value = fused.pairwise_uniformity(batch["item_table"].to(dtype), 2.0)
    assert value.dtype == dtype
    # the log of a mean of exp's computed in float32: the output rounding, eps/2 of the value, dominates
    torch.testing.assert_close(value.float(), reference.pairwise_uniformity(batch["item_table"], 2.0),
                               rtol=2 * eps, atol=0)


def largest_allocation(step) -> int:
    """The largest single CPU allocation (bytes) while ``step()`` runs, from torch.profiler, which
    records every allocation of ATen and of the kernels."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return max(event.cpu_memory_usage for event in prof.events())


@requires_kernels
def test_no_batch_by_batch_buffer(monkeypatch):
    """At B = 2048 (shared candidates) no single allocation of the row terms reaches a B x B bool
    matrix.  The uniformity's only quadratic buffer is the forward's saved exponentials, n (n - 1) / 2
    float32 within their budget; without them (past the budget) it stays below B x B too."""
    rows = 2048
    batch = make_batch(rows, 64, dtype=torch.float32, num_users=1000, num_items=4000, known_per_user=20, seed=23)
    largest = largest_allocation(lambda: row_terms(fused, batch, "proportional", torch.ones(rows, 3)))
    assert 0 < largest < rows * rows, f"an op allocated {largest} bytes"

    def uniformity_step():
        x = batch["item_table"][:rows].clone().requires_grad_()
        fused.pairwise_uniformity(x, 2.0).backward()

    # the profiler counts an op's net allocations: the forward's outputs, float32 exponentials
    # [n (n - 1) / 2] and row maxima [n], the loss (4 bytes) and the float64 total (8)
    assert largest_allocation(uniformity_step) == 4 * rows * (rows - 1) // 2 + 4 * rows + 4 + 8
    monkeypatch.setattr(importlib.import_module("pnn_fast.ops.pairwise_uniformity"), "SAVED_PAIRS_BUDGET", 0)
    largest = largest_allocation(uniformity_step)
    assert 0 < largest < rows * rows, f"an op allocated {largest} bytes"


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
@pytest.mark.parametrize("rows", [8192, 60000])
def test_cuda_large_batch_takes_the_slow_path_correctly(rows):
    # 60,000 shared float32 candidates need 240 KB of keys, above the 227 KB of shared memory an H100
    # block may use (the cached path holds up to 57,826): class_centroids takes its multi-pass path
    batch = make_batch(rows, 64, dtype=torch.float32, num_users=5000, num_items=70000, known_per_user=30,
                       seed=37, device="cuda")
    subset = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[:48].cuda()
    for neg_size in ("proportional", "count"):
        check_row_terms(batch, neg_size, TOLERANCE[torch.float32], rows=subset)


@pytest.mark.parametrize("per_row", [False, True])
def test_repeated_candidates_tie_exactly_and_smallest_index_wins(per_row):
    """A repeated item must get bit-identical scores wherever it stands, so ties follow the rule."""
    g = torch.Generator().manual_seed(7)
    user_emb, item_table = torch.randn(64, 67, generator=g, dtype=torch.float64), torch.randn(40, 67, generator=g, dtype=torch.float64)
    candidates = torch.randint(0, 40, (64, 50) if per_row else (200,), generator=g)
    scores = reference.row_scores(user_emb, item_table, candidates)
    cands = candidates.expand(64, -1)
    same_item = cands[:, :, None] == cands[:, None, :]
    assert torch.equal(scores[:, :, None].expand_as(same_item)[same_item], scores[:, None, :].expand_as(same_item)[same_item])
    hard = reference.hard_negative(scores, torch.ones_like(scores, dtype=torch.bool))
    first = (cands == cands.gather(1, hard[:, None])).long().argmax(dim=1)
    assert torch.equal(hard, first)  # the first occurrence of the winning item


@pytest.mark.parametrize("module", ["reference", "fused"])
def test_multi_output_functions_return_named_results(module):
    """Issue 68, item 5: no caller unpacks an op's outputs by position; each multi-output function
    of both backends returns a NamedTuple whose fields say what each output is."""
    if module == "fused" and not _extension.has_kernels("cpu"):
        pytest.skip("the fused kernels are not built")
    impl = fused if module == "fused" else reference
    g = torch.Generator().manual_seed(0)
    user_rows, item_table = torch.randn(3, 4, generator=g), torch.randn(7, 4, generator=g)
    users = torch.arange(3)
    exclude = CSR(torch.tensor([0, 1, 1, 3]), torch.tensor([2, 0, 5]), 3, 7)
    top = impl.masked_topk(user_rows @ item_table.T, users, [exclude], 4)
    assert isinstance(top, TopK) and top.values.shape == top.indices.shape == (3, 4)
    assert top.indices.dtype == torch.int64 and bool((top.indices[0] != 2).all())
    if module == "fused":
        ranked = impl.dot_topk(user_rows, item_table, users, [exclude], 4)
        assert isinstance(ranked, TopK)
        torch.testing.assert_close(ranked.values, top.values)
        assert torch.equal(ranked.indices, top.indices)
    rows = [torch.randn(3, 4, generator=g) for _ in range(6)]
    class_terms = fused.ops.class_terms if module == "fused" else reference.class_terms
    terms = class_terms(*rows, torch.tensor([True, True, False]), torch.tensor([1, 0, 1]))
    assert isinstance(terms, ClassTerms) and terms.rank.shape == terms.constrain.shape == (3,)
    assert float(terms.rank[2]) == 0 and float(terms.constrain[1]) == 0  # not valid; no negative class
