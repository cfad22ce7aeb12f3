"""Every registered kernel of ``pnn_fast::`` once, forward and backward, on one device: the
workload that ``bench/gpu_check.sh`` runs under compute-sanitizer (memcheck, racecheck).

Small problems keep the sanitizers' run short; one shared candidate list of ``LARGE_C`` items
per op that keeps a row's candidates in shared memory on CUDA pushes the row past the 227 KB an
H100 block can hold, so the uncached (multi-pass) path of those kernels runs too.  Each call is
checked against the reference backend, so a kernel that runs clean but computes garbage fails.

    python bench/gpu_smoke.py --device cuda            # what the sanitizers run
    python bench/gpu_smoke.py --device cuda --compile  # also torch.compile(PNNLoss) vs eager

Exits non-zero, naming the op, on a mismatch; prints one line per op otherwise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from batches import make_batch  # noqa: E402  (the test suite's problem builder)

from pnn_fast import check_kernel_inputs, ops  # noqa: E402
from pnn_fast.backends import reference  # noqa: E402
from pnn_fast.csr import CSR  # noqa: E402
from pnn_fast.losses import PNNLoss  # noqa: E402
from pnn_fast.models.graph import layer_mean  # noqa: E402

#: above the largest shared candidate list a CUDA block caches (57,826 float32 keys and indices on
#: an H100, see the shared-memory budget in csrc/cuda)
LARGE_C = 60_000


def registered_ops(device: str) -> set:
    """The op names (schemas without _fwd/_bwd) with a kernel for ``device``'s dispatch key."""
    key = "CUDA" if device == "cuda" else "CPU"
    names = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("pnn_fast::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            names.add(name.removeprefix("pnn_fast::").removesuffix("_fwd").removesuffix("_bwd"))
    return names


def close(name: str, got, want, **tol) -> None:
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as err:
        raise SystemExit(f"gpu_smoke: {name}: the fused result differs from the reference: "
                         f"{str(err).splitlines()[0]}") from None


def problems(device: str) -> dict:
    """Grid-valued problems (exact scores, so ties resolve alike on every backend): shared and
    per-row candidates, and 3 rows sharing a list of LARGE_C candidates (the uncached path)."""
    shared = make_batch(200, 32, dtype=torch.float32, grid=True, seed=7, device=device)
    per_row = make_batch(200, 32, per_row=37, dtype=torch.float32, grid=True, seed=8, device=device)
    large = make_batch(3, 32, dtype=torch.float32, grid=True, num_items=LARGE_C + 100, seed=9, device=device)
    gen = torch.Generator().manual_seed(9)
    large["candidates"] = torch.randint(0, LARGE_C + 100, (LARGE_C,), generator=gen).to(device)
    return {"shared": shared, "per-row": per_row, "shared, uncached": large}


def row_ops(batch: dict) -> None:
    """count_unlabeled, hard_negative_argmax, class_centroids and class_terms (fwd + bwd) on one problem."""
    args = (batch["user_emb"], batch["item_table"], batch["users"], batch["pos_items"], batch["candidates"],
            batch["known"])
    count = ops.count_unlabeled(*args)
    hard, unlabeled = ops.hard_negative_argmax(*args)
    scores = reference.row_scores(batch["user_emb"], batch["item_table"], batch["candidates"])
    mask = reference.unlabeled_mask(batch["known"], batch["users"], batch["pos_items"], batch["candidates"])
    close("count_unlabeled", count, mask.sum(1))
    close("hard_negative_argmax", hard, reference.hard_negative(scores, mask))
    close("hard_negative_argmax (|U_b|)", unlabeled, mask.sum(1))
    k = (count // 3).clamp_min(0)
    item_table = batch["item_table"].detach().requires_grad_()
    neutral, negative, *_ = ops.class_centroids(batch["user_emb"], item_table, batch["users"], batch["pos_items"],
                                                batch["candidates"], batch["known"], k)
    (neutral.sum() + 2 * negative.sum()).backward()
    table = batch["item_table"].detach().requires_grad_()
    emb = reference.candidate_embeddings(table, batch["candidates"])
    negative_mask = reference.bottom_k_mask(scores, mask, k)
    neutral_mask = mask & ~negative_mask

    def mean(member):
        weights = member.to(table.dtype)
        return reference.class_sum(weights, emb) / weights.sum(1, keepdim=True).clamp_min(1)

    want_neutral, want_negative = mean(neutral_mask), mean(negative_mask)
    (want_neutral.sum() + 2 * want_negative.sum()).backward()
    close("class_centroids (neutral)", neutral, want_neutral)
    close("class_centroids (negative)", negative, want_negative)
    close("class_centroids (backward)", item_table.grad, table.grad)

    # class_terms on those centroids, values and the four gradients
    results = []
    for terms in (ops.class_terms, reference.class_terms):
        leaves = [x.detach().clone().requires_grad_() for x in
                  (batch["user_emb"], batch["item_table"][batch["pos_items"]], want_neutral, want_negative)]
        rank, constrain = terms(*leaves, batch["noise_pos"], batch["noise_neg"], mask.any(1), negative_mask.sum(1))
        (rank.sum() + 3 * constrain.sum()).backward()
        results.append((rank.detach(), constrain.detach(), *(leaf.grad for leaf in leaves)))
    close("class_terms (values and gradients)", results[0], results[1], rtol=1e-5, atol=1e-5)


def table_ops(device: str) -> None:
    """embedding_bpr, gathered_dots, gathered_norm (fwd + bwd), pairwise_uniformity (fwd + bwd), unit_rows
    (fwd + bwd), masked_logsumexp (fwd + bwd), csr_spmm (LightGCN's layer mean, fwd + bwd), unknown_items and history_sample, each
    against its definition in plain torch."""
    gen = torch.Generator().manual_seed(3)
    users_n, items_n, d, rows, k = 50, 80, 24, 64, 5
    user_table = torch.randn(users_n, d, generator=gen).to(device).requires_grad_()
    item_table = torch.randn(items_n, d, generator=gen).to(device).requires_grad_()
    users = torch.randint(0, users_n, (rows,), generator=gen).to(device)
    pos = torch.randint(0, items_n, (rows,), generator=gen).to(device)
    neg = torch.randint(0, items_n, (rows, k), generator=gen).to(device)

    def grads(value):
        user_table.grad = item_table.grad = None
        value.backward()
        return value.detach(), *(torch.zeros_like(t) if t.grad is None else t.grad.clone()
                                 for t in (user_table, item_table))

    u, p, n = user_table[users], item_table[pos], item_table[neg]
    want = torch.nn.functional.softplus((u[:, None] * n).sum(-1) - (u * p).sum(-1, keepdim=True)).mean()
    want = want + 1e-3 * (u.norm() + p.norm() + n.norm()) / rows
    want = grads(want)
    close("embedding_bpr", grads(ops.embedding_bpr(user_table, item_table, users, pos, neg, 1e-3)), want,
          rtol=1e-4, atol=1e-5)
    want = grads(((user_table[users][:, None] * item_table[neg]).sum(-1) ** 2).sum())
    close("gathered_dots", grads((ops.gathered_dots(user_table[users], item_table, neg) ** 2).sum()), want,
          rtol=1e-4, atol=1e-4)
    want = grads(item_table[neg.reshape(-1)].norm())
    close("gathered_norm", grads(ops.gathered_norm(item_table, neg.reshape(-1))), want, rtol=1e-4, atol=1e-5)
    x = item_table[:40]
    distances = torch.cdist(x, x).pow(2)
    off_diagonal = ~torch.eye(40, dtype=torch.bool, device=device)
    want = grads(torch.logsumexp(-2 * distances[off_diagonal], 0) - torch.log(torch.tensor(40.0 * 39)))
    close("pairwise_uniformity", grads(ops.pairwise_uniformity(x, 2.0)), want, rtol=1e-4, atol=1e-5)
    weights = torch.randn(items_n, d, generator=gen).to(device)
    want = grads((torch.nn.functional.normalize(item_table, dim=-1) * weights).sum())
    close("unit_rows", grads((ops.unit_rows(item_table) * weights).sum()), want, rtol=1e-4, atol=1e-5)
    def scores():  # [rows, items_n]: a pool of every item (a new graph for each backward)
        return user_table[users] @ item_table.T

    shift = torch.rand(items_n, generator=gen).to(device)  # logQ-like
    excluded = (torch.rand(rows, items_n, generator=gen) < 0.3).to(device)
    row_weights = torch.randn(rows, generator=gen).to(device)
    want = grads((torch.logsumexp((scores() * 5 - shift).masked_fill(excluded, float("-inf")), 1) * row_weights).sum())
    close("masked_logsumexp", grads((ops.masked_logsumexp(scores(), 5.0, shift, excluded) * row_weights).sum()), want,
          rtol=1e-4, atol=1e-5)
    half = (torch.rand(items_n, items_n, generator=gen) < 0.1) * torch.rand(items_n, items_n, generator=gen)
    symmetric = ((half + half.T) / items_n).to(device)  # the rows of a normalised adjacency sum to about 1
    want = grads((sum(torch.linalg.matrix_power(symmetric, p) for p in range(3)) @ item_table / 3 * weights).sum())
    got = grads((layer_mean(symmetric.to_sparse_csr(), item_table, 2, backend=device) * weights).sum())
    close("csr_spmm (layer_mean)", got, want, rtol=1e-4, atol=1e-5)

    batch = make_batch(rows, 8, dtype=torch.float32, num_items=items_n, seed=5, device=device)
    known, uniform = batch["known"], torch.rand(rows, 16, generator=gen).to(device)
    drawn = ops.unknown_items(known, batch["users"], uniform)
    if known.contains(batch["users"][:, None].expand_as(drawn), drawn).any():
        raise SystemExit("gpu_smoke: unknown_items drew a known item")
    history = ops.history_sample(known, batch["users"], uniform)
    valid = history >= 0
    if not known.contains(batch["users"][:, None].expand_as(history)[valid], history[valid]).all():
        raise SystemExit("gpu_smoke: history_sample drew an item the user does not know")


def compiled_loss(device: str) -> None:
    """torch.compile of PNNLoss on the fused backend, forward and backward, against eager."""
    batch = make_batch(256, 32, dtype=torch.float32, grid=True, seed=11, device=device)
    loss_fn = PNNLoss(batch["known"], 32, backend=device, validate=False).to(device)
    compiled = torch.compile(loss_fn)
    results = []
    for fn in (loss_fn, compiled):
        user_emb = batch["user_emb"].detach().requires_grad_()
        item_table = batch["item_table"].detach().requires_grad_()
        torch.manual_seed(0)  # the attention's history draws
        loss = fn(user_emb, item_table, batch["users"], batch["pos_items"], noise=(batch["noise_pos"], batch["noise_neg"]))
        loss.backward()
        results.append((loss.detach(), user_emb.grad, item_table.grad))
    close("torch.compile(PNNLoss)", results[1], results[0], rtol=1e-5, atol=1e-6)


def ranking_ops(device: str) -> None:
    """masked_topk (and on the CPU dot_topk) against the reference: continuous scores with copied (tied) columns, two
    exclusion sets, k from 1 to past the shared-memory buffers (the global-scratch path on CUDA);
    rows_contain of its ranked columns in an exclusion set against the reference's; lowest_k_mask of
    the same rows' first 800 columns against the reference's stable argsort."""
    gen = torch.Generator().manual_seed(4)
    rows, cols = 300, 5000
    scores = torch.randn(rows, cols, generator=gen)
    scores[:, 1::7] = scores[:, ::7][:, : scores[:, 1::7].shape[1]]  # ties across columns
    users = torch.randint(0, 40, (rows,), generator=gen)
    exclude = []
    for share in (0.2, 0.01):
        pairs = (torch.rand(40, cols, generator=gen) < share).nonzero(as_tuple=True)
        exclude.append(CSR.from_pairs(*pairs, 40, cols))
    for k in (1, 20, 100, 1500):
        got = ops.masked_topk(scores.to(device), users.to(device), [e.to(device) for e in exclude], k)
        want = reference.masked_topk(scores, users, exclude, k)
        close(f"masked_topk (k {k}, columns)", got[1].cpu(), want[1], rtol=0, atol=0)
        close(f"masked_topk (k {k}, values)", got[0].cpu(), want[0], rtol=0, atol=0)
        found = ops.rows_contain(exclude[0].to(device), users.to(device), got[1])
        close(f"rows_contain (k {k})", found.cpu(), reference.rows_contain(exclude[0], users, got[1].cpu()), rtol=0, atol=0)
    if device == "cpu":  # dot_topk, a CPU kernel only: on small-integer tables every product is exact
        user_rows = torch.randint(-3, 4, (rows, 8), generator=gen).float()
        item_table = torch.randint(-3, 4, (cols, 8), generator=gen).float()
        got = ops.dot_topk(user_rows, item_table, users, exclude, 20, 700)
        want = reference.masked_topk(user_rows @ item_table.T, users, exclude, 20)
        close("dot_topk (columns)", got[1], want[1], rtol=0, atol=0)
        close("dot_topk (values)", got[0], want[0], rtol=0, atol=0)
    # lowest_k_mask on rows of those tied scores (SL's rows are a few hundred long), every k from 0 to K
    rows_of_k = scores[:, :800].contiguous()
    k = torch.randint(0, 801, (rows,), generator=gen)
    close("lowest_k_mask", ops.lowest_k_mask(rows_of_k.to(device), k.to(device)).cpu(),
          reference.lowest_k_mask(rows_of_k, k), rtol=0, atol=0)


def deferred_input_errors(device: str) -> None:
    """The deferred input errors: a bad id given to an op of a step is clamped and recorded on the
    device with no read-back (ids_in_range inside gathered_norm, and the op itself), the flag reads
    back the first error once (take_input_error), and the device is still usable after it."""
    check_kernel_inputs(device)
    table = torch.randn(10, 4, device=device)
    clamped = torch.ops.pnn_fast.ids_in_range(torch.tensor([3, 12, -1], device=device), 10, "smoke", "ids")
    close("ids_in_range", clamped.cpu(), torch.tensor([3, 9, 0]), rtol=0, atol=0)
    ops.gathered_norm(table, torch.tensor([0, 99], device=device))  # a second error: the first is kept
    try:
        check_kernel_inputs(device)
    except ValueError as err:
        if str(err) != "smoke: ids has ids outside [0, 10)":
            raise SystemExit(f"gpu_smoke: deferred input error reads {err!r}")
    else:
        raise SystemExit("gpu_smoke: no deferred input error was recorded")
    check_kernel_inputs(device)  # cleared
    close("gathered_norm after the errors", ops.gathered_norm(table, torch.tensor([1, 2], device=device)).cpu(),
          reference.gathered_norm(table.cpu(), torch.tensor([1, 2])), rtol=1e-5, atol=1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="also torch.compile(PNNLoss) against eager")
    args = parser.parse_args()
    called = {"count_unlabeled", "hard_negative_argmax", "class_centroids", "class_terms", "embedding_bpr",
              "gathered_dots", "gathered_norm", "pairwise_uniformity", "unit_rows", "masked_logsumexp", "csr_spmm", "unknown_items",
              "history_sample",
              "masked_topk", "dot_topk", "rows_contain", "lowest_k_mask", "ids_in_range", "take_input_error"}
    missing = registered_ops(args.device) - called
    if missing:
        raise SystemExit(f"gpu_smoke: registered ops not exercised here: {sorted(missing)}; add them")
    for label, batch in problems(args.device).items():
        row_ops(batch)
        print(f"gpu_smoke: row ops ({label}) ok on {args.device}", flush=True)
    table_ops(args.device)
    print(f"gpu_smoke: table ops ok on {args.device}", flush=True)
    ranking_ops(args.device)
    print(f"gpu_smoke: masked_topk, rows_contain and lowest_k_mask ok on {args.device}", flush=True)
    deferred_input_errors(args.device)
    print(f"gpu_smoke: deferred input errors (ids_in_range, take_input_error) ok on {args.device}", flush=True)
    if args.compile:
        compiled_loss(args.device)
        print(f"gpu_smoke: torch.compile(PNNLoss) matches eager on {args.device}", flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
