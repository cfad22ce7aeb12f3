"""Two objectives' epochs (ML-1M unless ``BENCH_DATASET`` names another) alternated in one
process: the ratio of their costs on a machine whose speed drifts.

bench_epochs.py times every round of one objective before the next objective starts, so a change
in the machine's speed between them (other jobs, memory bandwidth taken by a neighbour) enters the
ratio. Here epoch i of A runs right before epoch i of B, each pair gives one ratio of process CPU
times (threads fixed at 1, so CPU time is the epoch's own work), and the median of the pairs is
reported beside the medians of each. Same setup as bench_epochs.py: ``../shared/data/ml-1m``
(``PNN_FAST_DATA`` and ``BENCH_DATASET`` as there), RecBole's per-user random 8:1:1 split (seed
2020), MF with d = 64, batch 2048, Adam lr 1e-3, L2 1e-4; one warm-up epoch each, which must give a
finite loss.

    python bench/paired_epochs.py dns pnn-dns-anchored --rounds 5

The names are bench_epochs.py's CASES.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_epochs import CASES, DATA, DATASET

from pnn_fast.data import load_dataset
from pnn_fast.train import TrainConfig, Trainer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", choices=sorted(CASES), help="the baseline (the ratio's denominator)")
    parser.add_argument("second", choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=5, help="timed pairs of epochs (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not (DATA / "train.txt").exists():
        parser.error(f"no {DATASET} at {DATA} (set PNN_FAST_DATA)")
    torch.set_num_threads(1)
    data = load_dataset(DATA, split="rs", seed=2020)
    trainers = {}
    for name in (args.first, args.second):
        loss, loss_args = CASES[name]
        config = TrainConfig(model="mf", loss=loss, loss_args=loss_args, seed=2020)
        trainers[name] = Trainer(data, config, Path(tempfile.mkdtemp(prefix="paired_epochs_")))
        warm_up = trainers[name].train_epoch(progress=False)
        if not math.isfinite(warm_up):
            raise SystemExit(f"{name}: the warm-up epoch's loss is {warm_up}")
    seconds = {name: [] for name in trainers}
    for _ in range(args.rounds):
        for name, trainer in trainers.items():
            start = time.process_time()
            trainer.train_epoch(progress=False)
            seconds[name].append(time.process_time() - start)
    ratios = [b / a for a, b in zip(seconds[args.first], seconds[args.second])]
    for name, values in seconds.items():
        print(f"{name}: CPU s per epoch {' '.join(f'{x:.2f}' for x in values)}; median {statistics.median(values):.3f}")
    print(f"{args.second} / {args.first}: per pair {' '.join(f'{x:.2f}' for x in ratios)}; "
          f"median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
