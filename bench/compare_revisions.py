"""Two checkouts' dense steps and ML-1M epochs, alternated round by round: did a change make
anything slower where it was fast?

    git worktree add /tmp/base <rev> && cp pnn_fast/_C*.so /tmp/base/pnn_fast/   # when csrc/ is unchanged
    python bench/compare_revisions.py --base /tmp/base [--steps bpr dns sl pnn preset] [--items 100000]
                                      [--epochs dns pnn-dns-anchored] [--rounds 3]

Each round runs every case once in this checkout and once in ``--base``, each in a fresh process on
one thread (``OMP_WAIT_POLICY=passive``), so a drift of the machine's speed falls on both. A step is
bench_scale.py's dense loss step (forward + backward, B = 8192, d = 64, the power-law catalog of
``--items`` items), timed as the median of 5 calls after a warm-up; an epoch is one ML-1M training
epoch of bench_epochs.py's case (MF, batch 2048), after a warm-up epoch; an evaluation is
bench_scale.py's (256 users over the whole catalog, the median of 2 after a warm-up). The table gives the median
over rounds and this checkout's time over the base's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pnn_fast.data import default_data_dir  # noqa: E402

# Runs in a child whose sys.path starts at the checkout under test. The step is written against the
# API both revisions share (no sparse=), so the same code times both.
STEP_CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from bench_scale import power_law_problem
from pnn_fast import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss
from pnn_fast.sampling import sample_unknown
name, items = {name!r}, {items}
p = power_law_problem(items, 8192)
known, users, pos = p["known"], p["users"], p["pos_items"]
user_table = torch.nn.Parameter(p["user_table"]); item_table = torch.nn.Parameter(p["item_table"])
negatives = {{"bpr": 1, "dns": 8, "sl": 800}}
neg = sample_unknown(known, users, negatives[name], torch.Generator().manual_seed(1)) if name in negatives else None
torch.manual_seed(0)
loss_fn = {{"bpr": lambda: BPRLoss(validate=False), "dns": lambda: DNSLoss(known, validate=False),
           "sl": lambda: SampledSoftmaxLoss(known, validate=False), "pnn": lambda: PNNLoss(known, 64, validate=False),
           "preset": lambda: PNNLoss.from_preset("dns-anchored", known, 64, validate=False)}}[name]()
def step():
    user_table.grad = item_table.grad = None
    torch.manual_seed(2)
    u = user_table.index_select(0, users)
    args = (u, item_table, pos, neg) if name == "bpr" else (u, item_table, users, pos) + ((neg,) if neg is not None else ())
    loss = loss_fn(*args)
    loss.backward()
    return float(loss)
step()
times = []
for _ in range(5):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
print(json.dumps({{"seconds": statistics.median(times)}}))
"""

EVAL_CHILD = r"""
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from bench_scale import eval_throughput, power_law_problem
print(json.dumps({{"seconds": eval_throughput(power_law_problem({items}, 8192), 256, 2)["median_s"]}}))
"""

EPOCH_CHILD = r"""
import json, sys, tempfile, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from bench_epochs import CASES, DATA
from pnn_fast.data import load_dataset
from pnn_fast.train import TrainConfig, Trainer
loss, args = CASES[{name!r}]
data = load_dataset(DATA, split="rs", seed=2020)
with tempfile.TemporaryDirectory() as out:
    trainer = Trainer(data, TrainConfig(loss=loss, loss_args=args, epochs=2), out)
    trainer.train_epoch(progress=False)
    start = time.process_time()
    trainer.train_epoch(progress=False)
    print(json.dumps({{"seconds": time.process_time() - start}}))
"""


def run_child(checkout: Path, code: str) -> float:
    # both read this checkout's data folder: the base's default would be beside the base
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1", PYTHONPATH=str(checkout),
               PNN_FAST_DATA=str(default_data_dir()))
    # the package under test must be the checkout's, not an installed one
    guard = (f"import pnn_fast, pathlib; assert pathlib.Path(pnn_fast.__file__).resolve().is_relative_to("
             f"{str(checkout.resolve())!r}), pnn_fast.__file__\n")
    out = subprocess.run([sys.executable, "-c", guard + code], cwd=checkout, env=env, capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"compare_revisions: a child failed in {checkout}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout, with its kernels built")
    parser.add_argument("--steps", nargs="*", default=["bpr", "dns", "sl", "pnn", "preset"])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--epochs", nargs="*", default=["dns", "pnn-dns-anchored"],
                        help="bench_epochs.py cases timed as one ML-1M epoch")
    parser.add_argument("--eval-items", type=int, nargs="*", default=[],
                        help="catalog sizes at which to time full-ranking evaluation of 256 users")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench = str(ROOT / "bench")  # this checkout's harness times both
    cases = [(f"step {name} @ {args.items:,} items", STEP_CHILD.format(bench=bench, name=name, items=args.items))
             for name in args.steps]
    cases += [(f"ML-1M epoch {name}", EPOCH_CHILD.format(bench=bench, name=name)) for name in args.epochs]
    cases += [(f"evaluate 256 users @ {items:,} items", EVAL_CHILD.format(bench=bench, items=items))
              for items in args.eval_items]
    times = {label: {"base": [], "this": []} for label, _ in cases}
    for round_ in range(args.rounds):
        for label, code in cases:
            for side, checkout in (("base", args.base), ("this", ROOT)):
                times[label][side].append(run_child(checkout, code))
            print(f"round {round_ + 1}: {label}: base {times[label]['base'][-1] * 1e3:.1f} ms, "
                  f"this {times[label]['this'][-1] * 1e3:.1f} ms", flush=True)
    print(f"\n| case | base (ms) | this checkout (ms) | this / base |\n|---|---|---|---|")
    for label, _ in cases:
        base, this = (statistics.median(times[label][s]) for s in ("base", "this"))
        print(f"| {label} | {base * 1e3:,.1f} | {this * 1e3:,.1f} | {this / base:.3f} |")


if __name__ == "__main__":
    main()
