"""The CPU kernels' instruction-set variants give the same bits.

The score and distance chains (csrc/cpu/simd.h), masked_topk's and dot_topk's scans, masked_logsumexp's row
passes and csr_spmm's row sums are compiled for AVX-512,
AVX2 + FMA and the build's baseline and chosen at run time; several rows share a pass over the
candidate tiles on the wider sets.  Each lane runs the same chain of fused multiply-adds whichever variant runs, so the
outputs must be identical, not close.  PNN_FAST_SIMD_LEVEL caps the variant: each level this CPU
has runs in a subprocess on the same inputs, and every output and gradient is compared bit for bit
with the widest level's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batches import requires_kernels

pytestmark = requires_kernels

# Inputs cover the tile shapes: shared lists of 203 (three full tiles of 64 and a last one of 11)
# and 197 candidates (a last tile of 5, evaluated on 8 lanes), per-row lists of 70, odd dims (130:
# two of class_centroids' 64-column sum blocks and a tail), row
# counts that are not multiples of the 4 (AVX-512) or 2 (AVX2) rows scored together, and
# continuous embeddings.
OUTPUTS_SCRIPT = r"""
import sys
import torch
sys.path.insert(0, sys.argv[2])
from batches import make_batch, row_args
from pnn_fast import _extension, ops
from pnn_fast.csr import CSR

torch.set_num_threads(1)
out = {}
for name, rows, dim, per_row, dtype in (("shared203", 203, 37, None, torch.float32),
                                         ("shared197", 197, 64, None, torch.float64),
                                         ("shared150", 150, 130, None, torch.float32),
                                         ("per_row70", 61, 19, 70, torch.float32)):
    batch = make_batch(rows, dim, per_row=per_row, dtype=dtype, grid=False, num_items=600, seed=5)
    args = row_args(batch)
    user_emb = args[0].clone().requires_grad_()
    item_table = args[1].clone().requires_grad_()
    k = torch.randint(0, 40, (rows,), generator=torch.Generator().manual_seed(1))
    neutral, negative, *state = ops.class_centroids(user_emb, item_table, *args[2:], k)
    weights = torch.randn(neutral.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    grads = torch.autograd.grad((neutral * weights).sum() + (negative * weights.flip(0)).sum(), item_table)
    out[name + "/centroids"] = [neutral, negative, *state, *grads]
    out[name + "/hard"] = list(ops.hard_negative_argmax(*args))
for n, dim in ((203, 19), (130, 64)):
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(n), dtype=torch.float32).requires_grad_()
    value = ops.pairwise_uniformity(x, 2.0)
    out[f"uniformity{n}"] = [value, *torch.autograd.grad(value, x)]
table = torch.randn(300, 45, generator=torch.Generator().manual_seed(6)).requires_grad_()
rows = torch.randn(50, 45, generator=torch.Generator().manual_seed(7)).requires_grad_()
ids = torch.randint(0, 300, (50, 33), generator=torch.Generator().manual_seed(8))
for unit_table in (False, True):
    dots = ops.gathered_dots(rows, table, ids, unit_table=unit_table)
    out[f"gathered_dots{'_unit' if unit_table else ''}"] = [dots, *torch.autograd.grad((dots * dots).sum(), (rows, table))]
g = torch.Generator().manual_seed(9)
excluded = torch.rand(40, 3001, generator=g) < 0.1
scores = torch.randn(40, 3001, generator=g) + 2.0 * excluded  # excluded items on top, as when trained
scores[:, 5::8] = scores[:, 5::8].round(decimals=1)  # ties
exclude = CSR.from_pairs(*excluded.nonzero(as_tuple=True), 40, 3001)
for k in (1, 20, 300):
    out[f"masked_topk{k}"] = list(ops.masked_topk(scores, torch.arange(40), [exclude], k))
users = torch.randn(40, 16, generator=g)
items = torch.randn(3001, 16, generator=g)
items[::7] = items[3::7][:items[::7].shape[0]]  # tied items
for width in (0, 100):
    out[f"dot_topk{width}"] = list(ops.dot_topk(users, items, torch.arange(40), [exclude], 20, width))
logits = torch.randn(40, 3001, generator=g).requires_grad_()
shift = torch.rand(3001, generator=g)
for name, args in (("plain", (None, None)), ("masked", (shift, excluded))):
    lse = ops.masked_logsumexp(logits, 7.0, *args)
    out[f"masked_logsumexp_{name}"] = [lse, *torch.autograd.grad((lse * lse).sum(), logits)]
graph = CSR.from_pairs(*(torch.rand(500, 400, generator=g) < 0.05).nonzero(as_tuple=True), 500, 400)
weights = torch.rand(graph.indices.shape, generator=g)
for dim in (64, 37):
    x = torch.randn(400, dim, generator=g)
    out[f"csr_spmm{dim}"] = [ops.csr_spmm(graph.indptr, graph.indices, weights, x)]
torch.save({"level": _extension.cpu_simd_level(), "outputs": {k: [t.detach() for t in v] for k, v in out.items()}},
           sys.argv[1])
"""

ORDER = ("avx512", "avx2", "baseline")


def outputs_at(capability: str | None, path: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PNN_FAST_SIMD_LEVEL"}
    if capability is not None:
        env["PNN_FAST_SIMD_LEVEL"] = capability
    tests_dir = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", OUTPUTS_SCRIPT, str(path), tests_dir], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(path)


def test_every_instruction_set_gives_the_same_bits(tmp_path):
    widest = outputs_at(None, tmp_path / "widest.pt")
    capped = {cap: outputs_at(cap, tmp_path / f"{cap}.pt") for cap in ("avx2", "baseline")}
    assert capped["baseline"]["level"] == "baseline"
    levels = [widest["level"]] + [run["level"] for run in capped.values()]
    # each cap lowers the level or leaves a CPU without that set where it was
    assert [ORDER.index(level) for level in levels] == sorted(ORDER.index(level) for level in levels)
    for cap, run in capped.items():
        assert run["outputs"].keys() == widest["outputs"].keys()
        for name, tensors in widest["outputs"].items():
            for i, (want, got) in enumerate(zip(tensors, run["outputs"][name])):
                assert want.dtype == got.dtype and want.shape == got.shape, (cap, name, i)
                assert torch.equal(want, got), f"{name} output {i}: {run['level']} differs from {widest['level']}"
    if widest["level"] == "baseline":
        pytest.skip("this CPU has no AVX2: only the baseline variant ran")
