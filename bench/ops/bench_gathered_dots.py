"""gathered_dots, out[b, k] = <rows[b], table[ids[b, k]]>: reference against fused.

reference: ``reference.gathered_dots``, a [2048, 8, 64] gather, products and a sum; fused:
``ops.gathered_dots``, no gather. Inputs: rows float32 [2048, 64] (the users' embeddings), table float32
[3706, 64] (the items'), ids int64 [2048, K] (unknown items per row: K = 8 as DNS, 800 as SL). Result:
float32 [2048, K], to rounding; forward, and forward + backward to rows and table (dense gradient).
``test_gathered_dots_gowalla_table``: SL's draws from Gowalla's 40,981 items instead (a 10 MB table,
beyond this CPU's L2, where the rows' loads miss and their prefetching shows).
``test_gathered_dots_behind_a_hinge``: SimpleX's Gowalla step, relu(cos - m) over 2,000 negatives of
256 unit rows in the unit Gowalla table, m set so that about 1 in 10,000 cosines lies above it (as
in a trained SimpleX cell): the backward gets exact zeros almost everywhere, which the CPU kernel skips.
"""
import pytest
import torch
import torch.nn.functional as F
from _op_bench import (BACKENDS, BATCH, DEVICES, DIM, GOWALLA_ITEMS, PASSES, PER_ROW, SL_PER_ROW, check_then_time,
                       ml1m_batch, ops)

from pnn_fast.backends import reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("per_row", [PER_ROW, SL_PER_ROW])
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots(benchmark, device, per_row, passes, backend):
    batch = ml1m_batch(device)
    _, ids = batch.draws(per_row)
    check_then_time(benchmark, device, backend, reference.gathered_dots, ops.gathered_dots,
                    (batch.user_emb, batch.item_table, ids), passes=passes, wrt=(0, 1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots_gowalla_table(benchmark, device, passes, backend):
    generator = torch.Generator().manual_seed(2)
    # values on the harness's 1/64 grid, as the ML-1M batch's: every product and sum is exact
    table = (torch.randint(-64, 65, (GOWALLA_ITEMS, DIM), generator=generator) / 64).to(device)
    ids = torch.randint(0, GOWALLA_ITEMS, (BATCH, SL_PER_ROW), generator=generator).to(device)
    check_then_time(benchmark, device, backend, reference.gathered_dots, ops.gathered_dots,
                    (ml1m_batch(device).user_emb, table, ids), passes=passes, wrt=(0, 1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_gathered_dots_behind_a_hinge(benchmark, device, backend):
    generator = torch.Generator().manual_seed(3)
    rows = F.normalize(torch.randn(256, DIM, generator=generator), dim=1).to(device)
    table = F.normalize(torch.randn(GOWALLA_ITEMS, DIM, generator=generator), dim=1).to(device)
    ids = torch.randint(0, GOWALLA_ITEMS, (256, 2000), generator=generator).to(device)
    margin = 0.465  # cos of random unit vectors in 64 dimensions: about N(0, 1/64), 3.7 sd above 0

    def hinge(fn):
        return lambda r, t, i: torch.relu(fn(r, t, i) - margin)

    check_then_time(benchmark, device, backend, hinge(reference.gathered_dots), hinge(ops.gathered_dots),
                    (rows, table, ids), passes="forward+backward", wrt=(0, 1))
