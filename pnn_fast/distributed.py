"""Data-parallel training across processes (``torchrun``): the process group, a rank's share of a
batch, checks that every rank agrees, and in-batch candidates gathered from every rank.

Every rank holds the whole model (embedding tables included): DistributedDataParallel averages the
gradients, so the replicas stay identical. A rank trains on its slice of each global batch. In-batch
losses (PNN's default) then see every rank's positives as candidates through :func:`gather_ids`: the
candidates are item ids, and each rank scores them on its own replica of the item table, so their
gradients reach every replica through DDP's averaging.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_environment(device: torch.device) -> tuple[int, int]:
    """Join the process group that ``torchrun`` describes in the environment (WORLD_SIZE > 1): NCCL
    on CUDA devices, gloo on the CPU. Returns :func:`world`; nothing to do for a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return world()


def device_of_rank(device: torch.device) -> torch.device:
    """The device this rank trains on: its own GPU (LOCAL_RANK) under torchrun with CUDA."""
    if device.type == "cuda" and world()[1] > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def require_same_on_every_rank(name: str, value: int, device: torch.device) -> None:
    """ValueError, on every rank, unless all ranks hold the same ``value`` (e.g. the number of items)."""
    rank, size = world()
    if size == 1:
        return
    mine = torch.tensor([int(value)], dtype=torch.int64, device=device)
    values = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(values, mine)
    seen = [int(v) for v in values]
    if len(set(seen)) > 1:
        raise ValueError(f"the ranks disagree on {name}: {', '.join(f'rank {r}: {v}' for r, v in enumerate(seen))}")


def gather_ids(ids: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D id tensor, concatenated in rank order (lengths may differ); ids only, so
    nothing to differentiate. ``ids`` itself outside a process group."""
    if world()[1] == 1:
        return ids
    return gather_values(ids.reshape(-1).long())


def gather_values(values: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D tensor (one dtype everywhere), concatenated in rank order (lengths may
    differ); no gradient. ``values`` itself outside a process group."""
    rank, size = world()
    if size == 1:
        return values
    values = values.reshape(-1)
    lengths = [torch.zeros(1, dtype=torch.int64, device=values.device) for _ in range(size)]
    dist.all_gather(lengths, torch.tensor([values.numel()], dtype=torch.int64, device=values.device))
    longest = max(int(n) for n in lengths)
    padded = torch.zeros((longest,), dtype=values.dtype, device=values.device)
    padded[:values.numel()] = values
    pieces = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:int(n)] for piece, n in zip(pieces, lengths)])


def shard(start: int, stop: int) -> tuple[int, int]:
    """This rank's contiguous part ``[lo, hi)`` of rows ``[start, stop)``, split as evenly as possible."""
    rank, size = world()
    count = stop - start
    lo = start + (count * rank) // size
    hi = start + (count * (rank + 1)) // size
    return lo, hi


def broadcast_from_first(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as rank 0 holds it, on every rank (in place)."""
    if world()[1] > 1:
        dist.broadcast(tensor, src=0)
    return tensor


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over all ranks (in place)."""
    if world()[1] > 1:
        dist.all_reduce(tensor)
    return tensor


__all__ = ["broadcast_from_first", "device_of_rank", "gather_ids", "init_from_environment",
           "require_same_on_every_rank", "shard", "sum_over_ranks", "world"]
