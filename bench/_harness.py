"""Shared pieces of the benchmarks: a synthetic problem, one training step, timing and memory.

Embeddings are multiples of 1/64 (|x| < 1, d <= 64): every score is then exact in float32, so the
reference and the fused backends select the same classes and their losses agree to rounding, which
the benchmarks check before timing anything.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pnn_fast.known import KnownPositives
from pnn_fast.losses import PNNLoss


def synthetic_problem(batch: int, dim: int = 64, device: str = "cpu", num_users: int = 20000,
                      num_items: int = 10000, per_user: int = 50, seed: int = 0) -> dict:
    """A batch of `batch` (user, positive) interactions drawn from `num_users * per_user` random ones."""
    gen = torch.Generator().manual_seed(seed)
    users = torch.arange(num_users).repeat_interleave(per_user)
    items = torch.randint(0, num_items, (users.numel(),), generator=gen)
    known = KnownPositives.from_pairs(users, items, num_users, num_items)
    pick = torch.randint(0, users.numel(), (batch,), generator=gen)

    def table(rows):
        return ((torch.randn(rows, dim, generator=gen) * 0.1 * 64).round().clamp(-63, 63) / 64).to(device)

    return {
        "known": known.to(device), "users": users[pick].to(device), "pos_items": items[pick].to(device),
        "user_table": table(num_users), "item_table": table(num_items),
        "noise": tuple(torch.rand(batch, dim, generator=gen).mul(0.1).to(device) for _ in range(2)),
    }


def make_step(problem: dict, backend: str, compiled: bool = False):
    """A closure running forward + backward of PNNLoss on `problem`; returns the loss (detached)."""
    device = problem["item_table"].device
    user_table = torch.nn.Parameter(problem["user_table"].clone())
    item_table = torch.nn.Parameter(problem["item_table"].clone())
    torch.manual_seed(0)  # the attention's initial weights: the same for every backend
    loss_fn = PNNLoss(problem["known"], item_table.shape[1], backend=backend, validate=False).to(device)

    def loss_of(users, pos_items, noise):
        return loss_fn(user_table[users], item_table, users, pos_items, noise=noise)

    loss_of = torch.compile(loss_of) if compiled else loss_of

    def step():
        torch.manual_seed(0)  # the attention samples histories: same draws for every backend
        user_table.grad = item_table.grad = None
        loss = loss_of(problem["users"], problem["pos_items"], problem["noise"])
        loss.backward()
        return loss.detach()

    return step


def threads_fixture(threads: int):
    """A module-scoped autouse fixture that runs a benchmark module on ``threads`` torch threads
    (assign it to a module-level name), restoring the count afterwards."""
    import pytest

    @pytest.fixture(scope="module", autouse=True)
    def _threads():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        yield
        torch.set_num_threads(before)

    return _threads


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step, device: torch.device, rounds: int, warmup: int = 1) -> dict:
    """Wall seconds per call: median and 20/80 % quantiles, synchronising CUDA around each call."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    qs = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return {"median_s": statistics.median(times), "p20_s": qs[1], "p80_s": qs[7], "rounds": rounds}


def cuda_peak_bytes(step, device: torch.device) -> int:
    """torch.cuda.max_memory_allocated during one step, above what was allocated before it."""
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def cpu_peak_bytes(batch: int, backend: str, threads: int) -> dict:
    """CPU memory of one step, measured in a fresh process (see _cpu_peak_child).

    Returns ``peak_rss_delta``: the rise of the resident-set high-water mark (VmHWM, reset through
    /proc/self/clear_refs after the setup and a warm-up step) during one step, and
    ``largest_op_alloc``: the largest allocation torch.profiler attributes to a single op.
    """
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import _harness; " \
           f"_harness._cpu_peak_child({batch}, {backend!r}, {threads})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _cpu_peak_child(batch: int, backend: str, threads: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    step = make_step(synthetic_problem(batch), backend)
    step()  # warm-up: lazy initialisations are not the step's memory
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    baseline = _status_kib("VmRSS")
    step()
    peak = _status_kib("VmHWM")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    largest = max(event.cpu_memory_usage for event in prof.events())
    print(json.dumps({"peak_rss_delta": (peak - baseline) * 1024, "largest_op_alloc": largest}))


def environment() -> dict:
    """Device, versions and git revision for the result rows."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = "unknown"
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "git": sha, "cpu_threads": torch.get_num_threads(), "cuda_device": cuda,
            "load_average": os.getloadavg()[0]}
