"""The sparse loss steps of bench_scale.py at two catalog sizes, alternated in fresh processes: a
steadier ratio than one process's, where a step of tens of milliseconds varies by up to 25% from run
to run.

    python bench/alternate_sparse_steps.py [--items 100000 2000000] [--losses bpr dns preset pnn mf-sparse-adam]
                                           [--rounds 5]

Each round runs one child per catalog size, one thread, ``OMP_WAIT_POLICY=passive``; a child builds
bench_scale.py's power-law problem (B = 8192), then times each loss's ``sparse=True`` step (the
median of 5 after a warm-up). The table gives the median over rounds and the largest size's time over
the smallest's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from bench_scale import make_step, power_law_problem
problem = power_law_problem({items}, 8192)
out = {{}}
for name in {losses!r}:
    step = make_step(name, problem, sparse=True)
    step()
    times = []
    for _ in range(5):
        start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs=2, default=[100_000, 2_000_000])
    parser.add_argument("--losses", nargs="+", default=["bpr", "dns", "preset", "pnn", "mf-sparse-adam"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1")
    seconds = {(name, n): [] for name in args.losses for n in args.items}
    for round_ in range(1, args.rounds + 1):
        for n in args.items:
            code = CHILD.format(bench=str(BENCH), items=n, losses=args.losses)
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"alternate_sparse_steps: the child at {n:,} items failed:\n{done.stderr[-2000:]}")
            for name, s in json.loads(done.stdout.strip().splitlines()[-1]).items():
                seconds[(name, n)].append(s)
            print(f"round {round_}: {n:,} items done", flush=True)
    small, large = args.items
    print(f"\n| sparse step | {small:,} items (ms) | {large:,} items (ms) | ratio |\n|---|---|---|---|")
    for name in args.losses:
        a, b = (statistics.median(seconds[(name, n)]) * 1e3 for n in (small, large))
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
