"""pnn_fast::lowest_k_mask, each row's k lowest scores: against a sort by (score, column) written
out in Python and against the reference's stable argsort, on continuous random rows, rows of few
distinct values (ties everywhere), rows with -0.0 beside +0.0 and with NaN, every k from 0 to K,
every dtype; empty shapes; bad input named; opcheck."""
from __future__ import annotations

import math

import pytest
import torch

from batches import DEVICES, requires_kernels, deferred_error
from pnn_fast import _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def by_definition(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Sort each row's columns by (score, column), NaN above every number and -0.0 equal to +0.0."""
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    for b, row in enumerate(scores.double().tolist()):
        order = sorted(range(len(row)), key=lambda j: (math.isnan(row[j]), 0.0 if math.isnan(row[j]) else row[j], j))
        mask[b, order[:int(k[b])]] = True
    return mask


def rows_of_every_kind(batch: int, count: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Continuous scores, with rows of few distinct values, signed zeros and NaN; k covering 0 to K."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, count, generator=g, dtype=torch.float64)
    scores[1::4] = torch.randint(-2, 3, (len(range(1, batch, 4)), count), generator=g).double() / 2  # ties
    if batch > 2:
        scores[2, ::2], scores[2, 1::2] = -0.0, 0.0
    if batch > 3 and count > 3:
        scores[3, ::3] = math.nan
    scores = scores.to(dtype)
    k = torch.randint(0, count + 1, (batch,), generator=g)
    k[0] = 0
    if batch > 1:
        k[-1] = count
    return scores, k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch,count", [(1, 1), (5, 2), (9, 17), (64, 300), (33, 2049)])
def test_matches_the_definition_and_the_reference(device, dtype, batch, count):
    scores, k = rows_of_every_kind(batch, count, dtype, seed=batch * count)
    got = ops.lowest_k_mask(scores.to(device), k.to(device)).cpu()
    want = by_definition(scores, k)
    assert got.dtype == torch.bool and got.shape == scores.shape
    assert torch.equal(got, want)
    assert torch.equal(reference.lowest_k_mask(scores, k), want)
    assert torch.equal(got.sum(dim=1), k)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    none = torch.zeros(0, dtype=torch.int64, device=device)
    assert ops.lowest_k_mask(torch.zeros(0, 5, device=device), none).shape == (0, 5)
    no_columns = ops.lowest_k_mask(torch.zeros(3, 0, device=device), torch.zeros(3, dtype=torch.int64, device=device))
    assert no_columns.shape == (3, 0)


def test_bad_input_is_a_clear_error():
    scores, k = torch.randn(4, 6), torch.tensor([0, 1, 6, 2])
    with pytest.raises(RuntimeError, match=r"scores must be a floating-point \[B, K\] tensor"):
        ops.lowest_k_mask(scores[0], k)
    with pytest.raises(RuntimeError, match=r"scores must be a floating-point \[B, K\] tensor"):
        ops.lowest_k_mask(scores.long(), k)
    with pytest.raises(RuntimeError, match=r"k must have shape \[4\]"):
        ops.lowest_k_mask(scores, k[:3])
    for bad_k in ([0, 1, 7, 2], [0, -1, 6, 2]):  # deferred (no read-back), clamped into [0, K] meanwhile
        with deferred_error(r"^pnn_fast::lowest_k_mask: k has values outside \[0, 7\)$"):
            mask = ops.lowest_k_mask(scores, torch.tensor(bad_k))
        assert torch.equal(mask.sum(1), torch.tensor(bad_k).clamp(0, 6))
    with pytest.raises(ValueError, match=r"k must lie in \[0, K\] = \[0, 6\], got values in \[0, 7\]"):
        reference.lowest_k_mask(scores, torch.tensor([0, 1, 7, 2]))
    with pytest.raises(ValueError, match="scores is on cpu but k is on meta"):
        ops.lowest_k_mask(scores, k.to("meta"))


def opcheck_cases(device: str) -> list:
    """(op, args) for the op's schema."""
    scores, k = rows_of_every_kind(6, 40, torch.float32, seed=7)
    return [(torch.ops.pnn_fast.lowest_k_mask.default, [scores.to(device), k.to(device)])]
