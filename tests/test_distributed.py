"""pnn_fast.distributed and training under torchrun: two CPU processes on gloo."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pnn_fast import KnownPositives, PNNLoss, build_info
from pnn_fast.backends.rows import gather_rows
from pnn_fast.distributed import gather_ids, require_same_on_every_rank, shard

WORLD = 2
BACKENDS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not build_info()["compiled"],
                                                                       reason="pnn_fast._C is not built"))]


def pnn_problem(batch=24, num_users=10, num_items=30, dim=6):
    """A seeded batch: known items, a user and an item table (float64), users, positives and noise."""
    g = torch.Generator().manual_seed(3)
    known = KnownPositives.from_pairs(torch.randint(0, num_users, (60,), generator=g),
                                      torch.randint(0, num_items, (60,), generator=g), num_users, num_items)
    return dict(known=known, user_table=torch.randn(num_users, dim, generator=g, dtype=torch.float64),
                item_table=torch.randn(num_items, dim, generator=g, dtype=torch.float64),
                users=torch.randint(0, num_users, (batch,), generator=g),
                pos=torch.randint(0, num_items, (batch,), generator=g),
                noise=(torch.rand(batch, dim, generator=g, dtype=torch.float64) * 0.1,
                       torch.rand(batch, dim, generator=g, dtype=torch.float64) * 0.1), dim=dim)


def loss_and_grads(p, rows, backend, across_ranks):
    """PNNLoss (fixed lambda, given noise) of ``rows`` of the batch; the loss and both tables' gradients."""
    user_table = p["user_table"].clone().requires_grad_()
    item_table = p["item_table"].clone().requires_grad_()
    loss_fn = PNNLoss(p["known"], p["dim"], lambda_mode="fixed", fixed_lambda=0.4, candidates_across_ranks=across_ranks,
                      backend=backend)
    users, pos = p["users"][rows], p["pos"][rows]
    loss = loss_fn(gather_rows(user_table, users), item_table, users, pos, noise=(p["noise"][0][rows], p["noise"][1][rows]))
    loss.backward()
    return loss.detach(), user_table.grad, item_table.grad


def _rank_of_two(rank, rendezvous, out, backend):
    """One rank: its half of the batch with candidates from both ranks; gradients averaged as DDP does."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        p = pnn_problem()
        lo, hi = shard(0, p["users"].numel())
        loss, user_grad, item_grad = loss_and_grads(p, slice(lo, hi), backend, across_ranks=True)
        for tensor in (loss, user_grad, item_grad):
            dist.all_reduce(tensor)
            tensor /= WORLD
        if rank == 0:
            torch.save({"loss": loss, "user_grad": user_grad, "item_grad": item_grad}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_with_gathered_candidates_equal_one_process_with_the_whole_batch(tmp_path, backend):
    mp.spawn(_rank_of_two, args=(str(tmp_path / "rendezvous"), str(tmp_path / "ranks.pt"), backend), nprocs=WORLD)
    ranks = torch.load(tmp_path / "ranks.pt")
    loss, user_grad, item_grad = loss_and_grads(pnn_problem(), slice(None), backend, across_ranks=False)
    torch.testing.assert_close(ranks["loss"], loss)
    torch.testing.assert_close(ranks["user_grad"], user_grad)
    torch.testing.assert_close(ranks["item_grad"], item_grad)


def _disagreeing_rank(rank, rendezvous, out):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        gathered = gather_ids(torch.arange(rank + 2) + 10 * rank)  # lengths 2 and 3
        try:
            require_same_on_every_rank("the number of items", 100 + rank, torch.device("cpu"))
            error = None
        except ValueError as err:
            error = str(err)
        Path(f"{out}.{rank}").write_text(json.dumps({"error": error, "gathered": gathered.tolist()}))
    finally:
        dist.destroy_process_group()


def test_ranks_that_disagree_fail_on_every_rank_and_ids_gather_in_rank_order(tmp_path):
    out = tmp_path / "rank"
    mp.spawn(_disagreeing_rank, args=(str(tmp_path / "rendezvous"), str(out)), nprocs=WORLD)
    for rank in range(WORLD):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["error"] == "the ranks disagree on the number of items: rank 0: 100, rank 1: 101"
        assert seen["gathered"] == [0, 1, 10, 11, 12]


def test_outside_a_process_group_everything_is_local():
    ids = torch.tensor([4, 2])
    assert gather_ids(ids) is ids and shard(3, 10) == (3, 10)
    require_same_on_every_rank("anything", 1, torch.device("cpu"))


def test_pnn_fast_train_under_torchrun(tmp_path):
    """`torchrun --nproc-per-node 2 -m pnn_fast train`: DDP on gloo, one rank writes the results."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([torchrun, "--nproc-per-node", str(WORLD), "-m", "pnn_fast", "train", "--epochs", "2",
                          "--dim", "8", "--loss", "pnn", "--loss-arg", "candidates_across_ranks=true", "--no-progress",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["world_size"] == WORLD and len(results["epochs"]) == 2
    assert results["test"]["ndcg@20"] > 0
    assert run.stdout.count("results: ") == 1  # one rank reports


def mixed_softmax(p, rows, logq):
    """SL with mixed negatives (the batch's positives and a pool of 7) of ``rows``: loss and gradients,
    and SL@K's quantile refreshed from those rows."""
    from pnn_fast import SampledSoftmaxLoss, SoftmaxLossAtK

    user_table = p["user_table"].clone().requires_grad_()
    item_table = p["item_table"].clone().requires_grad_()
    pool = torch.arange(3, 24, 3)
    loss_fn = SampledSoftmaxLoss(p["known"], num_negatives=7, temperature=0.3, shared_negatives=True,
                                 in_batch_negatives=True, logq=logq)
    users, pos = p["users"][rows], p["pos"][rows]
    loss = loss_fn(gather_rows(user_table, users), item_table, users, pos, pool)
    loss.backward()
    slatk = SoftmaxLossAtK(p["known"], k=3, num_negatives=7)
    slatk.refresh_quantile(p["user_table"][users], p["item_table"], users, pool)
    return loss.detach(), user_table.grad, item_table.grad, slatk.quantile


def _mixed_rank(rank, rendezvous, out, logq):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        lo, hi = shard(0, 24)
        loss, user_grad, item_grad, quantile = mixed_softmax(pnn_problem(), slice(lo, hi), logq)
        for tensor in (loss, user_grad, item_grad):
            dist.all_reduce(tensor)
            tensor /= WORLD
        torch.save({"loss": loss, "user_grad": user_grad, "item_grad": item_grad, "quantile": quantile},
                   f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("logq", [False, True])
def test_two_ranks_mix_in_every_ranks_positives_and_share_slatk_quantiles(tmp_path, logq):
    """Mixed negatives under torchrun: each rank's rows see both ranks' positives, so two ranks with half
    the batch each equal one process with all of it; SL@K's quantile refresh reaches every replica."""
    mp.spawn(_mixed_rank, args=(str(tmp_path / "rendezvous"), str(tmp_path / "ranks.pt"), logq), nprocs=WORLD)
    whole = mixed_softmax(pnn_problem(), slice(None), logq)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"ranks.pt.{rank}")
        for key, want in zip(("loss", "user_grad", "item_grad", "quantile"), whole):
            torch.testing.assert_close(got[key], want)
