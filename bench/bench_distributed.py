"""The cost of one PNN training step (in-batch candidates gathered across ranks, MF, ML-100K, global
batch 2048) at 1 and 2 processes under torchrun, gloo on the CPU, side by side in one run.

    python bench/bench_distributed.py [--nproc 1 2] [--steps 20] [--threads 1]

Each setting runs as ``torchrun --nproc-per-node N bench/bench_distributed.py --worker``; rank 0
reports the median wall time of a step (forward, backward with DDP's gradient averaging, Adam)
after warm-up steps. Before timing, every setting checks that its first step's loss equals the
one-process loss on the same global batch (fixed lambda and noise, so only the sharding differs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pnn_fast import distributed  # noqa: E402
from pnn_fast.data import load_dataset  # noqa: E402
from pnn_fast.train import Trainer, TrainConfig  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "ml-100k"
LOSS_ARGS = {"candidates_across_ranks": True, "lambda_mode": "fixed", "fixed_lambda": 0.5, "noise_max": 0.0}


def worker(steps: int, out: Path) -> None:
    data = load_dataset(str(DATA), split="rs")
    trainer = Trainer(data, TrainConfig(loss="pnn", loss_args=LOSS_ARGS, batch_size=2048), tempfile.mkdtemp())
    users, items = trainer.train_users[:2048], trainer.train_items[:2048]
    lo, hi = distributed.shard(0, 2048)

    def step() -> float:
        start = time.perf_counter()
        loss = trainer._batch_loss(users[lo:hi], items[lo:hi])
        trainer.adam.zero_grad()
        loss.backward()
        trainer.adam.step()
        return loss.detach(), time.perf_counter() - start

    first_loss, _ = step()
    mean_loss = distributed.sum_over_ranks(first_loss.clone()) / trainer.world_size
    for _ in range(3):
        step()
    seconds = [step()[1] for _ in range(steps)]
    if trainer.rank == 0:
        out.write_text(json.dumps({"world_size": trainer.world_size, "first_loss": float(mean_loss),
                                   "median_step_s": statistics.median(seconds)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        worker(args.steps, Path(args.out))
        return
    torchrun = Path(sys.executable).with_name("torchrun")
    rows = []
    for nproc in args.nproc:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "rank0.json"
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run([str(torchrun), "--nproc-per-node", str(nproc), __file__, "--worker", "--steps",
                            str(args.steps), "--threads", str(args.threads), "--out", str(out)], check=True, env=env)
            rows.append(json.loads(out.read_text()))
    reference = rows[0]["first_loss"]
    for row in rows:  # correctness before timing is reported: the same global loss at every world size
        assert abs(row["first_loss"] - reference) <= 1e-5 * abs(reference), (row, reference)
    print("| processes | median step (s) | vs 1 process | first-step loss |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['world_size']} | {row['median_step_s']:.4f} | {rows[0]['median_step_s'] / row['median_step_s']:.2f}x "
              f"| {row['first_loss']:.6f} |")


if __name__ == "__main__":
    main()
