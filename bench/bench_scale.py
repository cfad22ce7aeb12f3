"""How a step's cost grows with the catalog: every loss, dense and ``sparse=True``, at 100k, 1M and
2M items with the same batch, beside a plain-PyTorch step that gathers the same rows.

    python bench/bench_scale.py [--items 100000 1000000 2000000] [--batch 8192] [--threads 1]
                                [--losses bpr dns sl sl-pool pnn preset] [--eval-users 512] [--json rows.json]
                                [--interacted-items 100000]  # the same batch at every size: only the table grows
    pytest bench/bench_scale.py                      # pytest-benchmark rows at 100k and 2M items

The problem: 100k users holding 2M interactions whose items follow a power law (item i drawn with
probability proportional to (i + 1)^-0.8), d = 64, float32. Only the number of items changes, so
what a step adds from one catalog to the next is table-sized work.

Each row is forward + backward of one loss on the batch's users and positives, with its negatives
drawn once before timing (SL's 800 uniform unknown items a row, or one pool of 800 uniform catalog items
shared by the batch for ``sl-pool`` and for ``sl-mixed-logq``, which adds the batch's positives with the
logQ correction; DNS's and BPR's 8 and 1; DNS is
told they are unknown items, ``candidates_unknown=True``, as its trainer objective does; the preset
draws its own 8 + 8 in the step, as it does in training). ``plain`` is the floor a loss
cannot go below on the dense path: ``index_select`` of the users' rows and of each row's positive
and 8 uniform negatives, their dot products, a log-sum-exp and ``backward()``, whose item gradient
is a dense [I, d] table; ``plain-sl`` is the same step with SL's 800 draws a row, the floor of the
rows that SL reads (a [B, 801, d] gather, which SL's fused path never builds), and ``plain-pnn`` with
each row's positive and 50 of its user's known items, the rows that in-batch PNN reads (its
candidates are the batch's positives, and its attention reads 50 known items of each row's user). ``mf-adam`` and ``mf-sparse-adam`` are a whole MF training step with BPR
(loss, backward, optimiser): dense ``torch.optim.Adam`` over both tables against
``torch.optim.SparseAdam`` with ``sparse=True`` gradients, which update only the rows the step read.

``eval`` is full-ranking evaluation (:func:`pnn_fast.eval.evaluate`, top 20 of every item, the users'
known items excluded) of ``--eval-users`` users holding 5 held-out items each, in users per second,
beside its floor: the users x items x d multiply-adds at the rate a cache-resident product
([128, 64] x [64, 4,096], float32) runs at in the same process.

Before timing, every loss's sparse step is checked against its dense step (the loss and the
densified gradient). The table gives the median of ``--rounds`` steps and, per catalog, the
milliseconds each row adds over the smallest catalog, and each step's peak memory: the resident
memory one more step takes above what the process held before it (:func:`peak_memory_mb`, Linux),
measured in a child process per catalog (:func:`peaks`), so that the timed steps run with glibc's
own settings.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import environment, time_step  # noqa: E402

from pnn_fast import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss, embedding_bpr  # noqa: E402
from pnn_fast.eval import evaluate  # noqa: E402
from pnn_fast.csr import CSR  # noqa: E402
from pnn_fast.known import KnownPositives  # noqa: E402
from pnn_fast.sampling import sample_history, sample_unknown  # noqa: E402

NUM_USERS, NUM_PAIRS, DIM = 100_000, 2_000_000, 64
LOSSES = ("plain", "plain-sl", "plain-pnn", "bpr", "dns", "sl", "sl-pool", "sl-mixed-logq", "pnn", "preset", "mf-adam",
          "mf-sparse-adam")
#: the negatives drawn before the step, per row
NEGATIVES = {"plain": 8, "plain-sl": 800, "bpr": 1, "dns": 8, "sl": 800, "mf-adam": 1, "mf-sparse-adam": 1}
#: the uniform catalog items of the pool that SL's shared-pool rows share (SampledSoftmaxLoss's num_negatives)
SL_POOL = 800
#: the known items a row of plain-pnn gathers: PNNLoss's default history_len, the attention's history a row
PNN_HISTORY = 50
#: the plain step that gathers the rows a loss reads, whose growth with the catalog is the loss's floor
FLOOR = {"sl": "plain-sl", "plain-sl": "plain-sl", "pnn": "plain-pnn", "plain-pnn": "plain-pnn"}
PLAIN = ("plain", "plain-sl", "plain-pnn")
DENSE_ONLY = PLAIN + ("mf-adam", "mf-sparse-adam")


def power_law_problem(num_items: int, batch: int, seed: int = 0, interacted_items: int | None = None) -> dict:
    """The users' interactions, a batch of them and the two tables (see the module docstring).

    ``interacted_items``: draw the interactions over the first that many items only, so that every
    catalog holds the same interactions and batch and only the table (and uniform draws) grows."""
    gen = torch.Generator().manual_seed(seed)
    users = torch.randint(0, NUM_USERS, (NUM_PAIRS,), generator=gen)
    weights = torch.arange(1, min(num_items, interacted_items or num_items) + 1, dtype=torch.float64).pow(-0.8)
    items = torch.multinomial(weights, NUM_PAIRS, replacement=True, generator=gen)
    known = KnownPositives.from_pairs(users, items, NUM_USERS, num_items)
    pick = torch.randint(0, NUM_PAIRS, (batch,), generator=gen)
    return {"known": known, "users": users[pick], "pos_items": items[pick],
            "user_table": torch.randn(NUM_USERS, DIM, generator=gen) * 0.1,
            "item_table": torch.randn(num_items, DIM, generator=gen) * 0.1}


def make_step(name: str, p: dict, sparse: bool):
    """A closure running one step of ``name`` (see LOSSES); returns the loss and the item gradient."""
    known, users, pos = p["known"], p["users"], p["pos_items"]
    user_table = torch.nn.Parameter(p["user_table"].clone())
    item_table = torch.nn.Parameter(p["item_table"].clone())
    gen = torch.Generator().manual_seed(1)
    # PNN's in-batch candidates are the positives; the preset draws its own in the step
    neg = sample_unknown(known, users, NEGATIVES[name], gen) if name in NEGATIVES else None
    if name == "plain-pnn":  # the attention's history of each row's user: known items, popular ones more often
        torch.manual_seed(3)
        neg = sample_history(known, users, PNN_HISTORY)[0]
    if name in ("sl-pool", "sl-mixed-logq"):
        neg = torch.randint(0, item_table.shape[0], (SL_POOL,), generator=gen)
    torch.manual_seed(0)
    loss_fn = {
        "bpr": lambda: BPRLoss(validate=False, sparse=sparse),
        "dns": lambda: DNSLoss(known, validate=False, sparse=sparse),
        "sl": lambda: SampledSoftmaxLoss(known, validate=False, sparse=sparse),
        "sl-pool": lambda: SampledSoftmaxLoss(known, validate=False, sparse=sparse, shared_negatives=True),
        "sl-mixed-logq": lambda: SampledSoftmaxLoss(known, validate=False, sparse=sparse, shared_negatives=True,
                                                    in_batch_negatives=True, logq=True),
        "pnn": lambda: PNNLoss(known, DIM, validate=False, sparse=sparse),
        "preset": lambda: PNNLoss.from_preset("dns-anchored", known, DIM, validate=False, sparse=sparse),
    }.get(name, lambda: None)()
    if name in ("mf-adam", "mf-sparse-adam"):
        sparse = name == "mf-sparse-adam"
        optimizer = (torch.optim.SparseAdam if sparse else torch.optim.Adam)([user_table, item_table], lr=1e-3)

    def release():
        user_table.grad = item_table.grad = None

    def step():
        release()
        torch.manual_seed(2)  # the preset's draws and PNN's noise and history: the same in every mode
        if name in PLAIN:
            rows = torch.cat([pos[:, None], neg], 1)
            scores = (user_table.index_select(0, users)[:, None, :]
                      * item_table.index_select(0, rows.reshape(-1)).view(*rows.shape, DIM)).sum(-1)
            loss = scores.logsumexp(1).mean()
        elif name in ("mf-adam", "mf-sparse-adam"):
            loss = embedding_bpr(user_table, item_table, users, pos, neg, validate=False, sparse=sparse)
        else:
            user_emb = user_table.index_select(0, users)
            args = (user_emb, item_table, pos, neg) if name == "bpr" else (user_emb, item_table, users, pos, neg)
            args = args[:-1] if neg is None else args
            # DNS's candidates were drawn from the unknown items, as its trainer objective says
            loss = loss_fn(*args, candidates_unknown=True) if name == "dns" else loss_fn(*args)
        loss.backward()
        if name in ("mf-adam", "mf-sparse-adam"):
            optimizer.step()
        return loss.detach(), item_table.grad

    step.release = release  # drops the last step's gradients: what a peak is measured above
    return step


def check_sparse_matches_dense(name: str, p: dict) -> None:
    """The sparse step's loss and densified item gradient equal the dense step's (before any timing)."""
    dense_loss, dense_grad = make_step(name, p, sparse=False)()
    loss, grad = make_step(name, p, sparse=True)()
    if not grad.is_sparse:
        raise AssertionError(f"{name}: sparse=True gave a dense gradient")
    torch.testing.assert_close(loss, dense_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.to_dense(), dense_grad, rtol=1e-4, atol=1e-7)


def _return_freed_blocks() -> None:
    """Make glibc serve every block above 128 KB with its own mapping, returned on free, so that the
    resident set follows the live tensors (by default glibc raises that threshold after the first
    large free, and a step's buffers then stay resident between steps: every later peak reads 0).
    Called before the process allocates anything large: freed blocks already in the heap are reused."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD, fixed
    except (OSError, AttributeError):
        pass


def peak_memory_mb(fn, release=None) -> float | None:
    """MB of resident memory ``fn()`` took at its peak above what the process held before it: Linux's
    high-water mark (VmHWM) reset through /proc/self/clear_refs, then read after the call;
    ``release()`` first drops what the last call left alive (its gradients). None where the kernel
    does not offer it."""
    def status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(field)

    if release is not None:
        release()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size
        before = status("VmRSS")
    except (OSError, KeyError):
        return None
    fn()
    return (status("VmHWM") - before) / 2**20


def gemm_rate(rounds: int = 200) -> float:
    """Multiply-adds per second of a cache-resident float32 product, [128, 64] x [64, 4096]."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(128, DIM, generator=gen), torch.randn(DIM, 4096, generator=gen)
    out = torch.empty(128, 4096)
    torch.mm(a, b, out=out)
    start = time.perf_counter()
    for _ in range(rounds):
        torch.mm(a, b, out=out)
    return rounds * 128 * 4096 * DIM / (time.perf_counter() - start)


def evaluation(p: dict, num_users: int):
    """A call of full-ranking evaluation over the whole catalog for ``num_users`` users."""
    gen = torch.Generator().manual_seed(4)
    num_items = p["item_table"].shape[0]
    users = torch.arange(num_users).repeat_interleave(5)
    truth = CSR.from_pairs(users, torch.randint(0, num_items, (users.numel(),), generator=gen), NUM_USERS, num_items)
    return lambda: evaluate(p["user_table"], p["item_table"], truth, [p["known"]], ks=(20,))


def eval_throughput(p: dict, num_users: int, rounds: int) -> dict:
    """Users per second of full-ranking evaluation over the whole catalog, and its floor."""
    timing = time_step(evaluation(p, num_users), torch.device("cpu"), rounds)
    floor = gemm_rate() / (p["item_table"].shape[0] * DIM)
    return {**timing, "users_per_s": num_users / timing["median_s"], "floor_users_per_s": floor}


def cases(losses: list[str]) -> list[tuple[str, bool]]:
    """(loss, sparse) of every row: both gradients where a loss has both."""
    return [(name, sparse) for name in losses for sparse in ((False,) if name in DENSE_ONLY else (False, True))]


def peaks(num_items: int, batch: int, losses: list[str], eval_users: int, interacted_items: int | None) -> dict:
    """Each case's peak MB (:func:`peak_memory_mb`) after one warm-up call, keyed "loss/dense|sparse"
    and "eval". Run in a process of its own (``--peaks-of``): the fixed mmap threshold that makes the
    resident set follow the live tensors also gives every large buffer fresh pages, which would slow
    the timed steps."""
    _return_freed_blocks()
    p = power_law_problem(num_items, batch, interacted_items=interacted_items)
    out = {}
    if eval_users:
        run = evaluation(p, eval_users)
        run()
        out["eval"] = peak_memory_mb(run)
    for name, sparse in cases(losses):
        step = make_step(name, p, sparse)
        step()
        out[f"{name}/{'sparse' if sparse else 'dense'}"] = peak_memory_mb(step, step.release)
    return out


def peaks_in_a_child(num_items: int, batch: int, losses: list[str], eval_users: int,
                     interacted_items: int | None) -> dict:
    command = [sys.executable, __file__, "--peaks-of", str(num_items), "--batch", str(batch),
               "--eval-users", str(eval_users), "--losses", *losses]
    if interacted_items:
        command += ["--interacted-items", str(interacted_items)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench_scale: the peak-memory child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(items: list[int], batch: int, losses: list[str], rounds: int, eval_users: int,
            interacted_items: int | None = None) -> list[dict]:
    """The timed rows in this process (glibc's own allocator settings, as in training), then each
    catalog's peaks from a child (:func:`peaks`)."""
    rows = []
    for num_items in items:
        p = power_law_problem(num_items, batch, interacted_items=interacted_items)
        if eval_users:
            result = eval_throughput(p, eval_users, rounds)
            rows.append({"items": num_items, "loss": "eval", "sparse": False, **result})
            print(f"{num_items:>9,} eval: {result['users_per_s']:.1f} users/s, floor "
                  f"{result['floor_users_per_s']:.1f} users/s", flush=True)
        for name, sparse in cases(losses):
            if sparse:
                check_sparse_matches_dense(name, p)
            timing = time_step(make_step(name, p, sparse), torch.device("cpu"), rounds)
            rows.append({"items": num_items, "loss": name, "sparse": sparse, "batch": batch, **timing})
            print(f"{num_items:>9,} {name:<15} {'sparse' if sparse else 'dense':<6} "
                  f"{timing['median_s'] * 1e3:9.1f} ms", flush=True)
        del p
        peak = peaks_in_a_child(num_items, batch, losses, eval_users, interacted_items)
        for row in rows:
            if row["items"] == num_items:
                row["peak_mb"] = peak.get("eval" if row["loss"] == "eval" else
                                          f"{row['loss']}/{'sparse' if row['sparse'] else 'dense'}")
    return rows


def _mb(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def table(rows: list[dict]) -> str:
    """Markdown: ms per step at each catalog size, and from the reference size (100k items where it
    was measured, else the smallest) to the largest: the growth and the ms added, beside its floor's
    (FLOOR: the plain step that gathers the same rows)."""
    sizes = sorted({r["items"] for r in rows})
    reference = 100_000 if 100_000 in sizes else sizes[0]
    evals = {r["items"]: r for r in rows if r["loss"] == "eval"}
    rows = [r for r in rows if r["loss"] != "eval"]
    keys = list(dict.fromkeys((r["loss"], r["sparse"]) for r in rows))
    ms = {(r["loss"], r["sparse"], r["items"]): r["median_s"] * 1e3 for r in rows}

    def added_by(loss, sparse):
        return ms.get((loss, sparse, sizes[-1]), float("nan")) - ms.get((loss, sparse, reference), float("nan"))
    peaks = {(r["loss"], r["sparse"], r["items"]): r.get("peak_mb") for r in rows}
    head = ["step", "gradient"] + [f"{n:,} items (ms)" for n in sizes] + [
        f"{sizes[-1]:,} / {reference:,}", "ms added", "floor", "added / floor's added"] + [
        f"peak MB at {n:,}" for n in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for loss, sparse in keys:
        times = [ms[(loss, sparse, n)] for n in sizes]
        base = ms[(loss, sparse, reference)]
        added = times[-1] - base
        floor = FLOOR.get(loss, "plain")
        floor_added = added_by(floor, False)
        ratio = added / floor_added if floor_added > 0 else float("nan")
        grad = "sparse" if sparse or loss == "mf-sparse-adam" else "dense"
        lines.append(f"| {loss} | {grad} | " + " | ".join(f"{t:,.1f}" for t in times)
                     + f" | {times[-1] / base:.2f} | {added:,.0f} | {floor} | {ratio:.2f} | "
                     + " | ".join(_mb(peaks[(loss, sparse, n)]) for n in sizes) + " |")
    if evals:
        lines += ["", "| items | eval users/s | floor users/s | floor / measured | peak MB |", "|---|---|---|---|---|"]
        lines += [f"| {n:,} | {r['users_per_s']:.1f} | {r['floor_users_per_s']:.1f} | "
                  f"{r['floor_users_per_s'] / r['users_per_s']:.2f} | {_mb(r.get('peak_mb'))} |"
                  for n, r in sorted(evals.items())]
    return "\n".join(lines)


# pytest-benchmark: one row per (catalog, loss, gradient), checked before timing
@pytest.fixture(scope="module", params=[100_000, 2_000_000], ids=lambda n: f"{n // 1000}k-items")
def scale_problem(request):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield power_law_problem(request.param, 8192)
    torch.set_num_threads(before)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", ["bpr", "dns", "sl", "sl-pool", "pnn", "preset"])
def test_step(benchmark, scale_problem, name, sparse):
    check_sparse_matches_dense(name, scale_problem)
    benchmark.pedantic(make_step(name, scale_problem, sparse), rounds=3, warmup_rounds=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[100_000, 1_000_000, 2_000_000])
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--losses", nargs="*", choices=LOSSES, default=list(LOSSES))
    parser.add_argument("--eval-users", type=int, default=512, help="users evaluated (0: no evaluation row)")
    parser.add_argument("--interacted-items", type=int, metavar="N",
                        help="draw the interactions over the first N items at every catalog size, so that only "
                             "the table grows (default: over the whole catalog)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table-of", type=Path, metavar="JSON", help="print the table of a saved --json; run nothing")
    parser.add_argument("--peaks-of", type=int, metavar="ITEMS", help=argparse.SUPPRESS)  # the peak-memory child
    args = parser.parse_args()
    if args.peaks_of:
        torch.set_num_threads(args.threads)
        print(json.dumps(peaks(args.peaks_of, args.batch, args.losses, args.eval_users, args.interacted_items)))
        return
    if args.table_of:
        print(table(json.loads(args.table_of.read_text())["rows"]))
        return
    torch.set_num_threads(args.threads)
    rows = measure(args.items, args.batch, args.losses, args.rounds, args.eval_users, args.interacted_items)
    print(json.dumps(environment()))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
