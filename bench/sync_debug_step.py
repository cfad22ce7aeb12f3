"""One training step of each loss under ``torch.cuda.set_sync_debug_mode("error")``: which steps
make the host wait on the GPU, and at which call.

    python bench/sync_debug_step.py --device cuda [--losses bpr dns pnn pnn-dns-anchored sl-t02] [--sparse]

Each case builds a Trainer (MF, d = 64, batch 2048) on the built-in synthetic data, runs one warm-up
step (lazy initialisations may read back once), then one step of the loss, its backward and Adam
with the sync debug mode set to "error": a device-to-host read raises, and the case reports the call
that made it (the innermost frame in pnn_fast). On the CPU the mode does nothing, so the cases pass;
the dry run of bench/gpu_check.sh uses that to exercise this script.

Prints one line per case; exits 1 when any step synchronised.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from bench_epochs import CASES  # noqa: E402

from pnn_fast.data import synthetic_dataset  # noqa: E402
from pnn_fast.train import TrainConfig, Trainer  # noqa: E402


def one_step(trainer: Trainer, users: torch.Tensor, pos: torch.Tensor) -> None:
    trainer.adam.zero_grad()
    trainer._batch_loss(users, pos).backward()
    trainer.adam.step()


def where_it_synced(err: BaseException) -> str:
    """The innermost pnn_fast frame of the error's traceback, as file:line (function)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "pnn_fast" in f.filename]
    if not frames:
        return "outside pnn_fast"
    frame = frames[-1]
    return f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno} ({frame.name})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--losses", nargs="+", default=["bpr", "dns", "pnn", "pnn-dns-anchored", "sl-t02"],
                        choices=sorted(CASES))
    parser.add_argument("--sparse", action="store_true", help="the --sparse path (bpr, dns, pnn, sl)")
    args = parser.parse_args()
    data = synthetic_dataset(num_users=2000, num_items=1000, interactions_per_user=20, seed=0)
    synced = False
    for name in args.losses:
        loss, loss_args = CASES[name]
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(data, TrainConfig(loss=loss, loss_args=loss_args, device=args.device, dim=64,
                                                sparse=args.sparse), out)
            users, pos = (t[:2048] for t in (trainer.train_users, trainer.train_items))
            one_step(trainer, users, pos)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                one_step(trainer, users, pos)
                print(f"{name}: no synchronisation in a step")
            except RuntimeError as err:
                synced = True
                message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                print(f"{name}: synchronised at {where_it_synced(err)}: {message[:120]}")
            finally:
                if args.device.startswith("cuda"):
                    torch.cuda.set_sync_debug_mode("default")
    return 1 if synced else 0


if __name__ == "__main__":
    sys.exit(main())
