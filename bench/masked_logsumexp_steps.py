"""Whole sampled-softmax steps with the fused ``masked_logsumexp`` against the same steps with the
reference's composition (the temperature's division, the shift, the masked fills and
``torch.logsumexp``, as the losses ran before the op) in its place, alternated in one process.

    python bench/masked_logsumexp_steps.py --items 100000 --batch 2048 --losses sl sl-pool sl-mixed-logq

A step is bench_scale.py's dense loss step (forward + backward, the power-law catalog, one thread).
Each round runs both variants once; the first round is a warm-up; the two variants' losses and item
gradients must agree before the medians are printed as a markdown row.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import LOSSES, make_step, power_law_problem  # noqa: E402

from pnn_fast.backends import fused, reference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--losses", nargs="+", choices=LOSSES, default=["sl", "sl-pool", "sl-mixed-logq"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    problem = power_law_problem(args.items, args.batch)
    variants = {"composition": reference.masked_logsumexp, "fused": fused.masked_logsumexp}
    print("| step | B | composition (ms) | `masked_logsumexp` (ms) | ratio |\n|---|---|---|---|---|")
    try:
        for name in args.losses:
            step = make_step(name, problem, sparse=False)
            times = {variant: [] for variant in variants}
            results = {}
            for round_ in range(args.rounds + 1):
                for variant, function in variants.items():
                    fused.masked_logsumexp = function  # what the losses' backend calls
                    start = time.perf_counter()
                    loss, grad = step()
                    if round_:
                        times[variant].append(time.perf_counter() - start)
                    results[variant] = (loss, grad)
            torch.testing.assert_close(results["fused"][0], results["composition"][0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(results["fused"][1], results["composition"][1], rtol=1e-4, atol=1e-7)
            before, after = (statistics.median(times[v]) for v in ("composition", "fused"))
            print(f"| {name} | {args.batch:,} | {before * 1e3:,.1f} | {after * 1e3:,.1f} | {after / before:.2f} |",
                  flush=True)
    finally:
        fused.masked_logsumexp = variants["fused"]


if __name__ == "__main__":
    main()
