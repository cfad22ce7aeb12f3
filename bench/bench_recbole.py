"""Issue 5: pnn_fast against RecBole 1.2.1 on ML-1M, CPU, side by side in one process.

Targets (asserted by ``test_speed_targets`` from the medians measured in the same run):

* our BPR-MF training epoch >= 5x faster than RecBole's BPR ``Trainer._train_epoch``
  (RecBole's own data loader and negative sampler included: they are part of its epoch);
* our full-ranking evaluation of all validation users >= 5x faster than RecBole's full-sort
  ``trainer.evaluate(valid_data, load_best_model=False)``;
* our PNN-MF epoch (backend "auto": the fused kernels where built) <= 1.5x our DNS-MF epoch;
* our LightGCN-BPR epoch >= 3x faster than RecBole's LightGCN ``Trainer._train_epoch`` (issue 12:
  2 layers, RecBole's default reg_weight 1e-5 on both sides, the rest as for BPR-MF).

Both sides get the same split (the LightGCN files of ``../shared/data/ml-1m``, written as
RecBole atomic files ``ml1m.{train,valid,test}.inter``), batch size 2048, embedding size 64,
Adam with lr 1e-3, one uniform negative per positive.  RecBole's evaluation is given the same
number of users per scoring batch as ours (``eval_batch_size = 1024 users x item_num``; its
default of 4096 would score one user at a time, a far slower and less fair baseline).

Correctness is checked before anything is timed: both splits hold the same interactions,
both trainers give finite first-epoch losses of the same size, and our evaluator reproduces
RecBole's Recall / MRR / NDCG / Hit / Precision @10 and @20 on the validation and test splits
for one set of embeddings loaded into both models.

RecBole is not a dependency of pnn_fast: the module is skipped where it cannot be imported.
Environment (outside the repository) and command: see ``bench/_recbole_setup.sh``.  Torch runs
with ``BENCH_THREADS`` threads (default 1: on a shared 2-core machine two OpenMP threads
oversubscribe the cores and the timings of both sides become mostly spin-wait noise).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("recbole")
torch = pytest.importorskip("torch")

from recbole.config import Config
from recbole.data import create_dataset, data_preparation
from recbole.data.dataloader import FullSortEvalDataLoader
from recbole.model.general_recommender import BPR, LightGCN
from recbole.trainer import Trainer as RecBoleTrainer
from recbole.utils import init_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import threads_fixture
from pnn_fast import build_info
from pnn_fast.data import default_data_dir, load_dataset
from pnn_fast.backends import select as select_backend
from pnn_fast.train import TrainConfig, Trainer

DATA = default_data_dir() / "ml-1m"
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
BATCH, DIM, LR, SEED = 2048, 64, 1e-3, 2020
EVAL_USERS_PER_BATCH = 1024  # ours: TrainConfig.eval_batch_size; RecBole: as many users per batch
KS = (10, 20)
LIGHTGCN_REG = 1e-5  # RecBole's LightGCN.yaml reg_weight, on both sides
METRIC_TOL = 1e-6

# Medians (seconds) of this run's benchmarks, for test_speed_targets.
MEDIANS: dict[str, float] = {}
LOADS: dict[str, tuple[float, float]] = {}  # 1-minute load average before and after each benchmark
NOTES: dict[str, str] = {}
RECBOLE_DEFAULT_EVAL_BATCH = 4096  # RecBole 1.2.1's eval_batch_size: one ML-1M user per scoring batch


def _pedantic(benchmark, key: str, fn, group: str):
    benchmark.group = group
    load_before = os.getloadavg()[0]
    benchmark.extra_info.update(threads=THREADS, torch=torch.__version__, load_before=load_before)
    result = benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    benchmark.extra_info["load_after"] = os.getloadavg()[0]
    MEDIANS[key] = benchmark.stats.stats.median
    LOADS[key] = (load_before, benchmark.extra_info["load_after"])
    return result


_threads = threads_fixture(THREADS)


@pytest.fixture(scope="module")
def data():
    if not (DATA / "train.txt").exists():
        pytest.skip(f"no ML-1M at {DATA} (set PNN_FAST_DATA)")
    return load_dataset(DATA)


def _ours(data, loss: str, tmp: Path, reg_weight: float = 1e-4, model: str = "mf", **loss_args) -> Trainer:
    """Our trainer with its defaults (incl. reg_weight 1e-4, backend "auto"; DNS: M = 8 uniform candidates;
    PNN: in-batch candidates, the paper's scheme), and the shared knobs set explicitly."""
    cfg = TrainConfig(model=model, loss=loss, dim=DIM, batch_size=BATCH, lr=LR, seed=SEED, device="cpu",
                      ks=KS, eval_batch_size=EVAL_USERS_PER_BATCH, reg_weight=reg_weight,
                      loss_args={**({"candidates": 8} if loss == "dns" else {}), **loss_args})
    return Trainer(data, cfg, tmp / f"ours-{model}-{loss}-{reg_weight}")


def _write_atomic(path: Path, split) -> None:
    users, items = (t.tolist() for t in split)
    with open(path, "w") as f:
        f.write("user_id:token\titem_id:token\n")
        f.writelines(f"{u}\t{i}\n" for u, i in zip(users, items))


def _recbole_config(data, tmp: Path, model: str, **extra) -> Config:
    """RecBole's config for ``model`` on our split, written under tmp (ids as tokens "0", "1", ...)."""
    if not (tmp / "ml1m").exists():
        (tmp / "ml1m").mkdir()
        for name in ("train", "valid", "test"):
            _write_atomic(tmp / "ml1m" / f"ml1m.{name}.inter", getattr(data, name))
    return Config(model=model, dataset="ml1m", config_dict={
        "data_path": str(tmp), "benchmark_filename": ["train", "valid", "test"],
        "load_col": {"inter": ["user_id", "item_id"]}, "USER_ID_FIELD": "user_id", "ITEM_ID_FIELD": "item_id",
        "embedding_size": DIM, "train_batch_size": BATCH, "learner": "adam", "learning_rate": LR,
        "train_neg_sample_args": {"distribution": "uniform", "sample_num": 1, "alpha": 1.0, "dynamic": False,
                                  "candidate_num": 0},
        "eval_args": {"group_by": "user", "order": "RO", "split": {"RS": [0.8, 0.1, 0.1]}, "mode": "full"},
        "metrics": ["Recall", "MRR", "NDCG", "Hit", "Precision"], "topk": list(KS), "valid_metric": "NDCG@20",
        "metric_decimal_place": 12,
        # item_num counts RecBole's padding item 0
        "eval_batch_size": EVAL_USERS_PER_BATCH * (data.num_items + 1),
        "gpu_id": "", "use_gpu": False, "worker": 0, "seed": SEED, "reproducibility": True,
        "show_progress": False, "checkpoint_dir": str(tmp / "saved"), "log_wandb": False, **extra,
    })


@contextlib.contextmanager
def _inside(folder: Path):
    """Run with ``folder`` as the working directory: RecBole's trainer opens a tensorboard writer
    under ./log_tensorboard."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def _recbole_epoch(side: SimpleNamespace) -> float:
    """One RecBole training epoch of a fixture's trainer (the sum of its batch means), advancing
    the fixture's epoch counter."""
    loss = side.trainer._train_epoch(side.train, side.epoch, show_progress=False)
    side.epoch += 1
    return loss


@pytest.fixture(scope="module")
def recbole(data, tmp_path_factory):
    """RecBole's dataset, loaders, BPR model and trainer on our split."""
    tmp = tmp_path_factory.mktemp("recbole")
    config = _recbole_config(data, tmp, "BPR")
    init_seed(config["seed"], config["reproducibility"])
    with _inside(tmp):
        dataset = create_dataset(config)
        train_data, valid_data, test_data = data_preparation(config, dataset)
        model = BPR(config, train_data.dataset).to(config["device"])
        trainer = RecBoleTrainer(config, model)
        # the validation loader again, with RecBole's default eval_batch_size (informational timing)
        config["eval_batch_size"] = RECBOLE_DEFAULT_EVAL_BATCH
        valid_default = FullSortEvalDataLoader(config, valid_data._dataset, valid_data._sampler, shuffle=False)
        config["eval_batch_size"] = EVAL_USERS_PER_BATCH * (data.num_items + 1)
    tokens = dataset.field2token_id
    user_map = torch.tensor([tokens["user_id"][str(u)] for u in range(data.num_users)])
    item_map = torch.tensor([tokens["item_id"][str(i)] for i in range(data.num_items)])
    return SimpleNamespace(config=config, dataset=dataset, train=train_data, valid=valid_data, test=test_data,
                           valid_default=valid_default, model=model, trainer=trainer, user_map=user_map,
                           item_map=item_map, epoch=0)


@pytest.fixture(scope="module")
def recbole_lightgcn(data, tmp_path_factory):
    """RecBole's LightGCN (2 layers, its default reg_weight 1e-5) and trainer on our split."""
    tmp = tmp_path_factory.mktemp("recbole-lightgcn")
    config = _recbole_config(data, tmp, "LightGCN", n_layers=2, reg_weight=LIGHTGCN_REG)
    init_seed(config["seed"], config["reproducibility"])
    with _inside(tmp):
        train_data, _, _ = data_preparation(config, create_dataset(config))
        trainer = RecBoleTrainer(config, LightGCN(config, train_data.dataset).to(config["device"]))
    return SimpleNamespace(train=train_data, trainer=trainer, epoch=0)


# ---- correctness, before any timing ------------------------------------------------------

def test_same_split(data, recbole):
    sizes = [split.dataset.inter_num for split in (recbole.train, recbole.valid, recbole.test)]
    assert sizes == [int(getattr(data, s)[0].numel()) for s in ("train", "valid", "test")]
    assert (recbole.dataset.user_num - 1, recbole.dataset.item_num - 1) == (data.num_users, data.num_items)
    # the same pairs, through the token maps
    for ours, theirs in ((data.train, recbole.train.dataset), (data.valid, recbole.valid.dataset)):
        inter = theirs.inter_feat
        keys_theirs = torch.sort(inter["user_id"].long() * (data.num_items + 1) + inter["item_id"].long()).values
        keys_ours = torch.sort(recbole.user_map[ours[0]] * (data.num_items + 1) + recbole.item_map[ours[1]]).values
        assert torch.equal(keys_ours, keys_theirs)


def test_first_epoch_losses(data, recbole, tmp_path):
    ours = _ours(data, "bpr", tmp_path).train_epoch(progress=False)
    theirs = _recbole_epoch(recbole) / len(recbole.train)  # RecBole returns the sum of the batch means
    NOTES["first-epoch loss"] = f"ours {ours:.4f} (BPR + 1e-4 EmbLoss), RecBole {theirs:.4f} (BPR)"
    assert math.isfinite(ours) and math.isfinite(theirs)
    # Same objective (up to our small L2 term), same init scheme, same optimiser: similar first epochs.
    assert 0 < ours < math.log(2) and 0 < theirs < math.log(2)
    assert abs(ours - theirs) < 0.05, NOTES["first-epoch loss"]


def test_metrics_agree_with_recbole(data, recbole, tmp_path):
    """Our evaluator on our MF and RecBole's on its BPR holding the same weights: same numbers."""
    ours = _ours(data, "bpr", tmp_path)
    for _ in range(2):  # some training, so the metrics are far from a random ranking's
        ours.train_epoch(progress=False)
    user_table, item_table = (t.detach() for t in ours.model.embeddings())
    with torch.no_grad():
        recbole.model.user_embedding.weight.zero_()
        recbole.model.item_embedding.weight.zero_()
        recbole.model.user_embedding.weight[recbole.user_map] = user_table
        recbole.model.item_embedding.weight[recbole.item_map] = item_table
    worst = 0.0
    for split, loader in (("valid", recbole.valid), ("test", recbole.test)):
        mine = ours.evaluate_split(split)
        theirs = recbole.trainer.evaluate(loader, load_best_model=False, show_progress=False)
        assert set(theirs) == set(mine)
        for name, value in mine.items():
            assert value == pytest.approx(theirs[name], abs=METRIC_TOL), (split, name, value, theirs[name])
            worst = max(worst, abs(value - theirs[name]))
        NOTES[f"{split} ndcg@10"] = f"ours {mine['ndcg@10']:.6f}, RecBole {theirs['ndcg@10']:.6f}"
    NOTES["metric agreement"] = f"max |ours - RecBole| over 10 metrics x 2 splits = {worst:.2e}"


# ---- timings --------------------------------------------------------------------------------

def test_bpr_epoch_recbole(benchmark, recbole):
    assert math.isfinite(_pedantic(benchmark, "recbole bpr epoch", lambda: _recbole_epoch(recbole), "bpr-epoch"))


def test_bpr_epoch_ours(benchmark, data, tmp_path):
    """The same objective as RecBole's BPR model, which has no L2 term (reg_weight 0)."""
    trainer = _ours(data, "bpr", tmp_path, reg_weight=0.0)
    assert math.isfinite(_pedantic(benchmark, "ours bpr epoch", lambda: trainer.train_epoch(progress=False),
                                   "bpr-epoch"))


def test_bpr_epoch_ours_with_l2(benchmark, data, tmp_path):
    """Informational: our default objective, BPR plus RecBole's EmbLoss at reg_weight 1e-4."""
    trainer = _ours(data, "bpr", tmp_path, reg_weight=1e-4)
    assert math.isfinite(_pedantic(benchmark, "ours bpr+l2 epoch", lambda: trainer.train_epoch(progress=False),
                                   "bpr-epoch"))


def test_lightgcn_first_epoch_losses(data, recbole_lightgcn, tmp_path):
    """Before timing: the same LightGCN-BPR objective on both sides gives first epochs of the same size."""
    ours = _ours(data, "bpr", tmp_path, reg_weight=LIGHTGCN_REG, model="lightgcn").train_epoch(progress=False)
    theirs = _recbole_epoch(recbole_lightgcn) / len(recbole_lightgcn.train)
    NOTES["lightgcn first-epoch loss"] = f"ours {ours:.4f}, RecBole {theirs:.4f} (BPR + 1e-5 EmbLoss)"
    assert 0 < ours < math.log(2) + 0.01 and 0 < theirs < math.log(2) + 0.01
    assert abs(ours - theirs) < 0.05, NOTES["lightgcn first-epoch loss"]


def test_lightgcn_epoch_recbole(benchmark, recbole_lightgcn):
    assert math.isfinite(_pedantic(benchmark, "recbole lightgcn epoch", lambda: _recbole_epoch(recbole_lightgcn),
                                   "lightgcn-epoch"))


def test_lightgcn_epoch_ours(benchmark, data, tmp_path):
    trainer = _ours(data, "bpr", tmp_path, reg_weight=LIGHTGCN_REG, model="lightgcn")
    assert math.isfinite(_pedantic(benchmark, "ours lightgcn epoch", lambda: trainer.train_epoch(progress=False),
                                   "lightgcn-epoch"))


def test_eval_recbole(benchmark, recbole):
    run = lambda: recbole.trainer.evaluate(recbole.valid, load_best_model=False, show_progress=False)
    assert 0 <= _pedantic(benchmark, "recbole eval", run, "full-sort-eval")["ndcg@10"] <= 1


def test_eval_recbole_default_batch(benchmark, recbole):
    """Informational (not a target): RecBole with its default eval_batch_size scores one user per batch."""
    expected = recbole.trainer.evaluate(recbole.valid, load_best_model=False, show_progress=False)
    run = lambda: recbole.trainer.evaluate(recbole.valid_default, load_best_model=False, show_progress=False)
    result = _pedantic(benchmark, "recbole eval, default batch", run, "full-sort-eval")
    assert result == pytest.approx(expected, abs=METRIC_TOL)


def test_eval_ours(benchmark, data, tmp_path):
    trainer = _ours(data, "bpr", tmp_path)
    trainer.train_epoch(progress=False)
    assert 0 <= _pedantic(benchmark, "ours eval", lambda: trainer.evaluate_split("valid"), "full-sort-eval")["ndcg@10"] <= 1


EXTRA = pytest.mark.skipif(os.environ.get("BENCH_EXTRA") != "1", reason="informational; set BENCH_EXTRA=1")


@pytest.mark.parametrize("name, loss, loss_args", [
    pytest.param("dns", "dns", {}, id="dns"),
    pytest.param("pnn", "pnn", {}, id="pnn"),
    # informational: the same candidate sets on both sides (all 2048 batch positives, or 8 uniform items)
    pytest.param("dns-inbatch", "dns", {"in_batch": True}, marks=EXTRA, id="dns-inbatch"),
    pytest.param("pnn-sampled8", "pnn", {"in_batch": False, "candidates": 8}, marks=EXTRA, id="pnn-sampled8"),
])
def test_loss_epoch_ours(benchmark, data, tmp_path, name, loss, loss_args):
    trainer = _ours(data, loss, tmp_path, **loss_args)
    NOTES[f"{name} backend"] = select_backend(trainer.objective.args["backend"], trainer.device).__name__
    benchmark.extra_info.update(backend=NOTES[f"{name} backend"], loss_args=trainer.objective.args)
    assert math.isfinite(_pedantic(benchmark, f"ours {name} epoch", lambda: trainer.train_epoch(progress=False),
                                   "ours-loss-epoch"))


def test_speed_targets(capsys):
    needed = ["recbole bpr epoch", "ours bpr epoch", "recbole eval", "ours eval", "ours dns epoch", "ours pnn epoch"]
    missing = [k for k in needed if k not in MEDIANS]
    if missing:
        pytest.skip(f"not measured in this run: {missing}")
    epoch_speedup = MEDIANS["recbole bpr epoch"] / MEDIANS["ours bpr epoch"]
    eval_speedup = MEDIANS["recbole eval"] / MEDIANS["ours eval"]
    pnn_over_dns = MEDIANS["ours pnn epoch"] / MEDIANS["ours dns epoch"]
    lightgcn_speedup = (MEDIANS["recbole lightgcn epoch"] / MEDIANS["ours lightgcn epoch"]
                        if {"recbole lightgcn epoch", "ours lightgcn epoch"} <= set(MEDIANS) else None)
    lines = [(f"ML-1M, CPU, torch {torch.__version__}, {THREADS} thread(s), {ROUNDS} rounds (median), "
              f"load average now {os.getloadavg()[0]:.1f}, kernels compiled: {build_info()['compiled']}"),
             *(f"  {k:<28} {MEDIANS[k]:8.3f} s   (load {LOADS[k][0]:.1f} -> {LOADS[k][1]:.1f})"
               for k in [*needed, *sorted(set(MEDIANS) - set(needed))]),
             f"  BPR epoch: speed-up of ours over RecBole {epoch_speedup:.2f}x (target >= 5)",
             (f"  eval     : speed-up of ours over RecBole {eval_speedup:.2f}x (target >= 5; RecBole scoring "
              f"{EVAL_USERS_PER_BATCH} users per batch like ours)"),
             *([(f"  eval     : speed-up {MEDIANS['recbole eval, default batch'] / MEDIANS['ours eval']:.2f}x over "
                 f"RecBole with its default eval_batch_size={RECBOLE_DEFAULT_EVAL_BATCH} (informational)")]
               if "recbole eval, default batch" in MEDIANS else []),
             f"  PNN/DNS epoch: {pnn_over_dns:.2f} (target <= 1.5)",
             *([f"  LightGCN epoch: speed-up of ours over RecBole {lightgcn_speedup:.2f}x (target >= 3)"]
               if lightgcn_speedup is not None else []),
             *(f"  {k}: {v}" for k, v in NOTES.items())]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert epoch_speedup >= 5, lines
    assert eval_speedup >= 5, lines
    assert pnn_over_dns <= 1.5, lines
    assert lightgcn_speedup is None or lightgcn_speedup >= 3, lines
