"""torch.use_deterministic_algorithms(True) and the fused backwards: the CPU kernels add in a fixed
order (the same bits on every run and thread count: tests/test_losses.py), so they run; the CUDA
kernels that scatter with float atomicAdd (an order that varies from run to run) refuse, as
torch's own index_add does on CUDA."""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, bpr_inputs, make_batch, requires_kernels
from pnn_fast import _extension

pytestmark = requires_kernels
if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def backward_passes(device: str) -> dict:
    """name -> a call that runs one fused op forward and backward on device."""
    user_table, item_table, users, pos, neg = bpr_inputs(device=device)
    batch = make_batch(16, 8, seed=3, device=device)

    def grad_of(fn, *leaves):
        leaves = [leaf.clone().requires_grad_() for leaf in leaves]
        fn(*leaves).sum().backward()

    def centroids(user_emb, item_table):
        k = torch.full((16,), 2, dtype=torch.int64, device=device)
        neutral, negative, *_ = ops.class_centroids(user_emb, item_table, batch["users"], batch["pos_items"],
                                                    batch["candidates"], batch["known"], k)
        return neutral + negative

    return {
        "embedding_bpr_bwd": lambda: grad_of(lambda u, i: ops.embedding_bpr(u, i, users, pos, neg), user_table,
                                             item_table),
        "gathered_dots_bwd": lambda: grad_of(lambda r, t: ops.gathered_dots(r, t, neg), user_table[users], item_table),
        "gathered_norm_bwd": lambda: grad_of(lambda t: ops.gathered_norm(t, pos), item_table),
        "class_centroids_bwd": lambda: grad_of(centroids, batch["user_emb"], batch["item_table"]),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode_runs_the_cpu_backwards_and_refuses_the_cuda_atomics(device):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for name, run in backward_passes(device).items():
            if device == "cpu":
                run()
            else:
                with pytest.raises(RuntimeError, match=f"pnn_fast::{name} does not have a deterministic"):
                    run()
    finally:
        torch.use_deterministic_algorithms(previous)
