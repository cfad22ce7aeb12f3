"""SimpleX's training step with the authors' Gowalla configuration (the ``simplex-gowalla`` cells of
studies/confirm-gowalla.toml and studies/fig3-false-negatives.toml: MF, d 64, batch 256, 2,000 negatives,
the user-attention tower over each user's whole history, Adam lr 1e-4, L2 1e-7), on clean Gowalla
(RecBole's per-user random 8:1:1 split, seed 2020), one thread.

A step is the trainer's: the objective's loss, ``backward()`` and the fused dense Adam over both
tables. Prints the median over ``--rounds`` of the mean milliseconds of ``--steps`` steps, after a
warm-up, and the loss of the first batch under a fixed seed (equal across revisions that compute
the same thing). To compare two checkouts, run it from each in turn (the pnn_fast it imports is the
one beside it):

    python bench/simplex_steps.py [--steps 40] [--rounds 4]
    git worktree add /tmp/base <rev> && cp bench/simplex_steps.py /tmp/base/bench/ && (build there)
    for r in 1 2 3; do python bench/simplex_steps.py; python /tmp/base/bench/simplex_steps.py; done
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from pnn_fast.data import default_data_dir, load_dataset  # noqa: E402
from pnn_fast.train import TrainConfig, Trainer  # noqa: E402

#: the authors' Gowalla configuration, as the study plans give it
LOSS_ARGS = {"num_negatives": 2000, "margin": 0.9, "negative_weight": 250, "gamma": 0.8,
             "aggregator": "user_attention", "dropout": 0.1, "history_len": 1_000_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps a round (default 40)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--data", type=Path, default=default_data_dir() / "gowalla")
    args = parser.parse_args()
    if not (args.data / "train.txt").exists():
        parser.error(f"no Gowalla at {args.data}")
    torch.set_num_threads(1)
    data = load_dataset(args.data, split="rs", seed=2020)
    config = TrainConfig(model="mf", loss="simplex", loss_args=LOSS_ARGS, seed=1, lr=1e-4, batch_size=256,
                         reg_weight=1e-7)
    trainer = Trainer(data, config, Path(tempfile.mkdtemp(prefix="simplex_steps_")))
    order = torch.randperm(trainer.train_users.numel(), generator=torch.Generator().manual_seed(0))
    users, items = trainer.train_users[order], trainer.train_items[order]
    trainer.model.train()
    trainer.objective.train()
    trainer.generator.manual_seed(5)
    first = float(trainer._batch_loss(users[:256], items[:256]).detach())

    def steps(count: int, batch: int) -> float:
        start = time.perf_counter()
        for b in range(batch, batch + count):
            loss = trainer._batch_loss(users[b * 256:(b + 1) * 256], items[b * 256:(b + 1) * 256])
            trainer.adam.zero_grad()
            loss.backward()
            trainer.adam.step()
        return (time.perf_counter() - start) / count * 1e3

    steps(10, 1)  # warm-up
    times = [steps(args.steps, 11 + args.steps * r) for r in range(args.rounds)]
    print(f"{Path(__file__).resolve().parents[1]}: {statistics.median(times):.1f} ms a step "
          f"(rounds {', '.join(f'{t:.1f}' for t in times)}); first batch's loss {first:.10f}")


if __name__ == "__main__":
    main()
