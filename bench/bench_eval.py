"""Full-ranking evaluation against its floor, the bare score product, on real datasets (issue 12).

For each dataset every validation user is ranked against all items, training items excluded,
ks (10, 20), users in batches of 1024 (TrainConfig's eval_batch_size).  Providers, timed in one
run on the same tables:

* ``floor``: the score products ``table[users] @ items.T`` of the same batches and nothing else;
* ``tile floor`` (CPU): the same products in tiles of ``CPU_SCORE_TILE`` users, which run faster
  than whole batches (their output stays in cache);
* ``fused``: :func:`pnn_fast.eval.evaluate` with the compiled kernels (backend cpu / cuda): on the
  CPU ``dot_topk`` ranks each batch in one pass, on a GPU ``masked_topk`` ranks the products;
* ``reference``: the same with ``backend="reference"`` (a masked copy and ``torch.topk``);
* ``rank dot_topk`` and ``rank masked_topk tiles`` (CPU): the ranking alone, no metrics, of the same
  batches by the two compiled paths: ``dot_topk`` (what ``evaluate`` runs) and the products in tiles
  of ``CPU_SCORE_TILE`` users through ``masked_topk`` (what it ran before ``dot_topk``).

The tables are Gaussian (seed 0, d 64); before timing, the fused metrics must equal the
reference's, and the two rankings must agree (values to rounding; items but for near-ties that
rounding may swap).  On the CPU a last column sets each time against the arithmetic floor: the
products' multiply-adds at the rate of a cache-resident product (``bench_scale.gemm_rate``) measured
in the same process; ``dot_topk`` never writes its scores out, so it can beat the two product floors.

Run as a script for the markdown rows of bench/README.md, or under pytest-benchmark:

    python bench/bench_eval.py --datasets ml-1m gowalla --threads 1
    pytest bench/bench_eval.py
"""
from __future__ import annotations

import argparse
import math

import pytest
import torch

from _harness import environment, synchronize, time_step
from bench_scale import gemm_rate
from pnn_fast import _extension, backends
from pnn_fast.csr import CSR
from pnn_fast.data import default_data_dir, load_dataset
from pnn_fast.eval import CPU_SCORE_TILE, evaluate, ranked_in_tiles, ranked_items

DATA = default_data_dir()
DATASETS = ("ml-1m", "gowalla")
USERS_PER_BATCH = 1024
KS = (10, 20)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _extension.has_kernels("cuda") else [])
ROUNDS = {"floor": 5, "tile floor": 5, "fused": 5, "reference": 3, "rank dot_topk": 5, "rank masked_topk tiles": 5}
CPU_ONLY = ("tile floor", "rank dot_topk", "rank masked_topk tiles")


def problem(name: str, device: str) -> dict:
    """The dataset's validation truth and training exclusions as CSR, and Gaussian tables."""
    path = DATA / name
    if not path.is_dir():
        pytest.skip(f"{path} is missing (set PNN_FAST_DATA)")
    data = load_dataset(path)
    g = torch.Generator().manual_seed(0)
    return {
        "name": name,
        "valid": CSR.from_pairs(*data.valid, data.num_users, data.num_items).to(device),
        "train": CSR.from_pairs(*data.train, data.num_users, data.num_items).to(device),
        "user_table": torch.randn(data.num_users, 64, generator=g).to(device),
        "item_table": torch.randn(data.num_items, 64, generator=g).to(device),
    }


def runs(p: dict, device: str) -> dict:
    """provider -> a closure doing one full evaluation pass (or its floor)."""
    truth = p["valid"]
    evaluated = ((truth.indptr[1:] - truth.indptr[:-1]) > 0).nonzero().squeeze(1)

    def products(users_per_product):
        def run():
            for begin in range(0, evaluated.numel(), users_per_product):
                p["user_table"][evaluated[begin:begin + users_per_product]] @ p["item_table"].T
        return run

    def ranked(backend):
        return lambda: evaluate(p["user_table"], p["item_table"], truth, p["train"], ks=KS,
                                batch_size=USERS_PER_BATCH, backend=backend)

    def rankings(rank):
        def run():
            return [rank(backends.fused, p["user_table"][users], users, p["item_table"], [p["train"]], max(KS))
                    for users in evaluated.split(USERS_PER_BATCH)]
        return run

    closures = {"floor": products(USERS_PER_BATCH), "tile floor": products(CPU_SCORE_TILE),
                "fused": ranked(device), "reference": ranked("reference"),
                "rank dot_topk": rankings(ranked_items), "rank masked_topk tiles": rankings(ranked_in_tiles)}
    if device != "cpu":  # evaluate scores a whole batch at once there, with masked_topk
        closures = {provider: run for provider, run in closures.items() if provider not in CPU_ONLY}
    return closures


def checked_runs(name: str, device: str) -> tuple[dict, int]:
    """The providers' closures, checked against each other, and the multiply-adds of a pass's products."""
    p = problem(name, device)
    closures = runs(p, device)
    fused, reference = closures["fused"](), closures["reference"]()
    assert fused == pytest.approx(reference, abs=1e-12), (fused, reference)
    if "rank dot_topk" in closures:
        for (values, items), (tiled_values, tiled_items) in zip(closures["rank dot_topk"](),
                                                                closures["rank masked_topk tiles"]()):
            torch.testing.assert_close(values, tiled_values, rtol=1e-5, atol=1e-5)
            swapped = (items != tiled_items)[values > -float("inf")].float().mean().item()
            assert swapped < 1e-3, f"the rankings differ at {swapped:.2%} of their ranked items"
    evaluated = int(((p["valid"].indptr[1:] - p["valid"].indptr[:-1]) > 0).sum())
    return closures, evaluated * p["item_table"].shape[0] * p["item_table"].shape[1]


@pytest.mark.skipif(not _extension.has_kernels("cpu"), reason="pnn_fast._C is not built")
@pytest.mark.parametrize("provider", list(ROUNDS))
@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("device", DEVICES)
def test_full_ranking(benchmark, device, name, provider):
    closures, _ = checked_runs(name, device)
    if provider not in closures:
        pytest.skip(f"no {provider!r} on {device}")
    run = closures[provider]
    benchmark.extra_info.update(environment(), device=device, dataset=name, provider=provider)

    def synced():
        run()
        synchronize(torch.device(device))

    benchmark.pedantic(synced, rounds=ROUNDS[provider], iterations=1, warmup_rounds=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--devices", nargs="+", choices=DEVICES, default=DEVICES)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| device | dataset | provider | median (p20-p80) | / floor | / tile floor | / arithmetic floor |")
    print("|---|---|---|---|---|---|---|")
    for device in args.devices:
        for name in args.datasets:
            closures, multiply_adds = checked_runs(name, device)
            timings = {provider: time_step(run, torch.device(device), ROUNDS[provider])
                       for provider, run in closures.items()}
            tile_floor = timings.get("tile floor", timings["floor"])["median_s"]
            # the products' multiply-adds at a cache-resident product's rate (CPU): what no ranking
            # that scores every item can beat, where the floors above also write their scores out
            arithmetic_floor = multiply_adds / gemm_rate() if device == "cpu" else math.nan
            for provider, timing in timings.items():
                print(f"| {device} | {name} | {provider} | {timing['median_s'] * 1e3:.1f} ms "
                      f"({timing['p20_s'] * 1e3:.0f}-{timing['p80_s'] * 1e3:.0f}) | "
                      f"{timing['median_s'] / timings['floor']['median_s']:.2f} | "
                      f"{timing['median_s'] / tile_floor:.2f} | "
                      f"{timing['median_s'] / arithmetic_floor:.2f} |", flush=True)


if __name__ == "__main__":
    main()
