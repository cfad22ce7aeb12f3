"""Forward + backward of the whole PNNLoss (in-batch candidates, d = 64, float32): the reference
backend against the fused kernels, and on CUDA also torch.compile of the reference.

    pytest bench/bench_pnn_loss.py                         # pytest-benchmark, one row per case
    python bench/bench_pnn_loss.py [--batches 2048 8192] [--threads 2] [--shape ml-1m] [--devices cuda]
                                   [--json rows.json]
    python bench/bench_pnn_loss.py --profile --devices cuda --batches 8192   # where the fused step's time goes

The script prints one table with the median time (p20-p80), the speed-up over the reference, the
ratio to the step's arithmetic floor (``floor_step``: the bare score and uniformity products and
one pass over the scores, timed in the same run) and the memory of one step: on CUDA torch.cuda.max_memory_allocated above the step's inputs, on CPU
the rise of the process's resident-set high-water mark (VmHWM) in a fresh process, plus the
largest allocation torch.profiler attributes to one op (a [B, B] float32 matrix is 4 B^2 bytes).
Every case first checks that its loss equals the reference's.

On a machine shared with other jobs, run with OMP_WAIT_POLICY=passive: OpenMP threads otherwise
spin between parallel regions and, oversubscribed, time each other's spinning rather than the
kernels (both backends suffer, the one with more, smaller regions more).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    cpu_peak_bytes,
    cuda_peak_bytes,
    environment,
    make_step,
    synchronize,
    synthetic_problem,
    time_step,
)

from pnn_fast import build_info

BATCHES = (2048, 8192)
#: "floor": the step's unavoidable arithmetic as bare torch ops (floor_step), timed beside the others
PROVIDERS = {"cpu": ("reference", "cpu", "floor"), "cuda": ("reference", "reference+compile", "cuda", "floor")}
#: synthetic problem shapes: the historical default, and ML-1M's (6,040 users, 3,706 items, 165 per user)
SHAPES = {"default": {}, "ml-1m": {"num_users": 6040, "num_items": 3706, "per_user": 165}}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rounds_for(device: str, provider: str, batch: int) -> int:
    slow = device == "cpu" and provider == "reference" and batch > 4096  # ~30 s a step on 2 threads
    return 2 if slow else 5


def floor_step(problem: dict):
    """The arithmetic no in-batch PNN step can avoid, as bare ops on the problem's sizes: the
    [B, d] x [d, B] score product, one pass over its B^2 scores (a row max), and L_uniform's
    n^2 d products over the batch's n distinct items, forward (x x^T) and backward (G x)."""
    user_emb = problem["user_table"][problem["users"]]
    cand_emb = problem["item_table"][problem["pos_items"]]
    distinct = problem["item_table"][torch.unique(problem["pos_items"])]

    def step():
        scores = user_emb @ cand_emb.T
        row_max = scores.amax(dim=1)
        gram = distinct @ distinct.T
        return row_max.sum() + (gram @ distinct).sum()

    return step


def step_for(problem: dict, device: str, provider: str):
    if provider == "floor":
        return floor_step(problem)
    backend = device if provider == device else "reference"
    return make_step(problem, backend, compiled=provider.endswith("+compile"))


def checked_step(device: str, provider: str, batch: int, reference_loss: dict, shape: str = "default"):
    """The provider's step, after checking its loss against the reference's (cached per case); the
    floor computes no loss, so it has nothing to check."""
    problem = synthetic_problem(batch, device=device, **SHAPES[shape])
    step = step_for(problem, device, provider)
    if provider not in ("reference", "floor"):
        key = (device, batch, shape)
        if key not in reference_loss:
            reference_loss[key] = make_step(problem, "reference")()
        torch.testing.assert_close(step(), reference_loss[key], rtol=1e-4, atol=1e-6)
    return step


CASES = [(device, provider) for device in DEVICES for provider in PROVIDERS[device]]
_REFERENCE_LOSS: dict = {}


@pytest.mark.skipif(not build_info()["compiled"], reason="pnn_fast._C is not built")
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("device,provider", CASES)
def test_pnn_loss_step(benchmark, device, provider, batch):
    torch.manual_seed(0)
    step = checked_step(device, provider, batch, _REFERENCE_LOSS)
    benchmark.extra_info.update(environment(), device=device, provider=provider, batch=batch)

    def synced():
        step()
        synchronize(torch.device(device))

    benchmark.pedantic(synced, rounds=rounds_for(device, provider, batch), iterations=1, warmup_rounds=1)


def run_table(batches, threads: int, shape: str = "default", devices=DEVICES) -> list:
    """One row per (device, batch, provider): median time, speed-up over the reference, the
    provider's time over the floor's (measured in the same run), and memory."""
    torch.set_num_threads(threads)
    rows, reference_loss = [], {}
    for device in devices:
        for batch in batches:
            steps, timings = {}, {}
            for provider in PROVIDERS[device]:
                steps[provider] = checked_step(device, provider, batch, reference_loss, shape)
                timings[provider] = time_step(steps[provider], torch.device(device),
                                              rounds_for(device, provider, batch))
            for provider, timing in timings.items():
                if device == "cuda":
                    memory = {"peak_bytes": cuda_peak_bytes(steps[provider], torch.device(device))}
                elif provider == "floor":
                    memory = {}
                else:
                    memory = cpu_peak_bytes(batch, "reference" if provider == "reference" else "cpu", threads)
                rows.append({"device": device, "provider": provider, "batch": batch, "shape": shape, **timing,
                             **memory, "speedup": timings["reference"]["median_s"] / timing["median_s"],
                             "over_floor": timing["median_s"] / timings["floor"]["median_s"], **environment()})
                print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict) -> str:
    if "peak_bytes" in row:
        memory = f"peak {row['peak_bytes'] / 2**20:9.1f} MiB"
    elif "peak_rss_delta" in row:
        memory = (f"RSS +{row['peak_rss_delta'] / 2**20:8.1f} MiB, "
                  f"largest op {row['largest_op_alloc'] / 2**20:7.1f} MiB")
    else:
        memory = "-"
    return (f"| {row['device']:4} | {row['provider']:17} | {row['batch']:5} | {row['median_s'] * 1e3:9.1f} ms "
            f"({row['p20_s'] * 1e3:.0f}-{row['p80_s'] * 1e3:.0f}) | x{row['speedup']:6.2f} | "
            f"{row['over_floor']:6.2f} | {memory} |")


def profile_fused(batches, devices, shape: str = "default", rows: int = 15) -> None:
    """Where the fused step's time goes: torch.profiler over 3 steps after a warm-up, the ops and
    kernels with the most self time on the device (CUDA kernels on a GPU, ops on the CPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if "cuda" in devices:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for device in devices:
        for batch in batches:
            torch.manual_seed(0)
            step = checked_step(device, device, batch, _REFERENCE_LOSS, shape)
            step()
            synchronize(torch.device(device))
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(3):
                    step()
                synchronize(torch.device(device))
            sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
            print(f"\n## fused step on {device}, B = {batch}, shape {shape}: 3 steps, by {sort_by}\n")
            print(prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default",
                        help="users, items and items per user of the synthetic problem")
    parser.add_argument("--devices", nargs="+", choices=DEVICES, default=DEVICES,
                        help=f"devices to time (default: {' '.join(DEVICES)})")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the table: torch.profiler's top ops and kernels of the fused step")
    args = parser.parse_args()
    if args.profile:
        torch.set_num_threads(args.threads)
        profile_fused(args.batches, args.devices, args.shape)
        return
    print("| dev  | provider          | B     | median (p20-p80)        | speed-up | / floor | memory of one step |")
    rows = run_table(args.batches, args.threads, args.shape, args.devices)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
