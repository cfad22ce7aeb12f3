"""Issues 4 and 11 (Table 5): one training epoch of every objective, MF, side by side in one run.

The per-epoch seconds of the ML-1M comparison table (studies/results-log.md): the same trainer,
data, split and model for every loss, so the column compares the methods' costs and nothing
else.  What is timed is ``Trainer.train_epoch()``: sampling, forward, backward and the Adam
step of every batch, plus the objective's per-epoch work (SRNS's candidate scoring, SimpleX's
history pooling).  Evaluation is not included.

Setup: ``../shared/data/ml-1m`` (``PNN_FAST_DATA`` moves the folder, ``BENCH_DATASET`` picks
another dataset in it: ``ml-1m-full`` and ``gowalla`` are the paper's) with RecBole's per-user random
8:1:1 split (``split="rs"``, seed 2020), MF with d = 64, batch 2048, Adam lr 1e-3, L2 1e-4 and
every objective's default arguments; the PNN variant of the table is added as ``pnn-sampled8``.
Before timing, one warm-up epoch must give a finite mean loss.

    python -m pytest bench/bench_epochs.py -p no:cacheprovider --benchmark-json /tmp/bench_epochs.json

``BENCH_THREADS`` (default 1), ``BENCH_ROUNDS`` (default 3), ``BENCH_LOSSES`` (a comma list,
default all), ``BENCH_DATASET`` (default ml-1m) and ``BENCH_DEVICE`` (default cpu; cuda times the
epochs on the GPU, synchronised before the clock stops) are the knobs.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import threads_fixture
from pnn_fast.data import default_data_dir, load_dataset
from pnn_fast.objectives import OBJECTIVES
from pnn_fast.train import TrainConfig, Trainer

DATASET = os.environ.get("BENCH_DATASET", "ml-1m")
DATA = default_data_dir() / DATASET
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")

# name -> (objective, its arguments): every registered objective with its defaults, the PNN
# variant of studies/results-log.md (8 sampled candidates, no uniformity term), and issue 14's leaders
# (docs/why-pnn.md): the dns-anchored preset, SL at temperature 0.2, and SL with PNN's classes
CASES = {**{name: (name, {}) for name in sorted(OBJECTIVES)},
         "pnn-sampled8": ("pnn", {"in_batch": False, "candidates": 8, "beta": 0.0}),
         "pnn-dns-anchored": ("pnn", {"preset": "dns-anchored"}),
         "sl-t02": ("sl", {"temperature": 0.2}),
         "sl-pnn-t02-w05": ("sl", {"temperature": 0.2, "neutral_weight": 0.5}),
         # SL's successors at SL's 800 draws, the loss's own cost apart from its authors' 1000;
         # SL@K refreshing its quantile every epoch: the cost of the epochs that refresh
         "psl-800": ("psl", {"num_negatives": 800}),
         "slatk-800": ("slatk", {"num_negatives": 800}),
         "slatk-800-refresh": ("slatk", {"num_negatives": 800, "quantile_every": 1}),
         # the negatives that large catalogs use (issue 69): one pool of 800 for the batch, and that pool
         # beside the batch's positives with the logQ correction, against SL's 800 draws a row
         "sl-pool": ("sl", {"shared_negatives": True}),
         "sl-mixed-logq": ("sl", {"shared_negatives": True, "in_batch_negatives": True, "logq": True})}
SELECTED = [name for name in os.environ.get("BENCH_LOSSES", ",".join(CASES)).split(",") if name]


_threads = threads_fixture(THREADS)


@pytest.fixture(scope="module")
def data():
    if not (DATA / "train.txt").exists():
        pytest.skip(f"no {DATASET} at {DATA} (set PNN_FAST_DATA)")
    return load_dataset(DATA, split="rs", seed=2020)


@pytest.mark.parametrize("name", SELECTED)
def test_epoch(benchmark, data, tmp_path, name):
    if name not in CASES:
        pytest.fail(f"BENCH_LOSSES names {name!r}; known: {sorted(CASES)}")
    loss, loss_args = CASES[name]
    trainer = Trainer(data, TrainConfig(model="mf", loss=loss, loss_args=loss_args, seed=2020, device=DEVICE), tmp_path)
    assert math.isfinite(trainer.train_epoch(progress=False))  # warm-up, and the check before timing
    benchmark.group = f"{DATASET} mf epoch"
    benchmark.extra_info.update(threads=THREADS, loss=loss, loss_args=trainer.objective.args,
                                load_before=os.getloadavg()[0])
    result = benchmark.pedantic(lambda: trainer.train_epoch(progress=False), rounds=ROUNDS, iterations=1)
    benchmark.extra_info["load_after"] = os.getloadavg()[0]
    assert math.isfinite(result)
