"""Where one training epoch's time goes, objective by objective: torch.profiler over
``Trainer.train_epoch()`` after a warm-up epoch, with the same trainer, data and settings as
bench_epochs.py (its CASES and its ``BENCH_DATASET``, ML-1M by default), printed as the top ops and
kernels. ``--model`` picks the base model (MF by default): with a graph model the propagation over
the whole graph, done on every step, shows beside the loss.

On the GPU the DNS and preset epochs are short (0.9 and 1.4 s on an H100) and made of many small
steps, so the question is whether kernels or launches and host work fill them: the table gives
both the device time and the CPU time of each op, and the number of calls.

    python bench/profile_epoch.py --device cuda --losses dns pnn-dns-anchored
    python bench/profile_epoch.py --device cpu --losses dns --rows 8
    BENCH_DATASET=gowalla OMP_NUM_THREADS=1 python bench/profile_epoch.py --model lightgcn --losses dns
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_epochs import CASES, DATA, DATASET  # noqa: E402  (the epoch table's objectives and data)
from pnn_fast.data import load_dataset  # noqa: E402
from pnn_fast.models import MODELS  # noqa: E402
from pnn_fast.train import TrainConfig, Trainer  # noqa: E402


def profile_epoch(data, name: str, model: str, device: str, rows: int) -> None:
    """Prints the epoch's wall time and torch.profiler's top ``rows`` ops of one epoch of ``name`` on ``model``."""
    loss, loss_args = CASES[name]
    cuda = device == "cuda"
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(data, TrainConfig(model=model, loss=loss, loss_args=loss_args, seed=2020, device=device), out)
        trainer.train_epoch(progress=False)  # warm-up: allocator, kernels' first launches
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            trainer.train_epoch(progress=False)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\n## {name} with {model} on {DATASET}, {device}: one epoch, {seconds:.3f} s under the profiler, by {sort_by}\n")
    print(prof.key_averages().table(sort_by=sort_by, row_limit=rows))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--losses", nargs="+", default=["dns", "pnn-dns-anchored"], choices=sorted(CASES),
                        metavar="LOSS", help="names of bench_epochs.py's CASES (default: dns pnn-dns-anchored)")
    parser.add_argument("--model", default="mf", choices=sorted(MODELS), help="the base model (default mf)")
    parser.add_argument("--rows", type=int, default=20, help="ops per table (default 20)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    if not (DATA / "train.txt").exists():
        parser.error(f"no {DATASET} at {DATA} (set PNN_FAST_DATA, or BENCH_DATASET)")
    data = load_dataset(DATA, split="rs", seed=2020)
    for name in args.losses:
        profile_epoch(data, name, args.model, args.device, args.rows)


if __name__ == "__main__":
    main()
