"""pnn_fast.integrations.recbole under the real RecBole 1.2.1 (collected only where it imports: conftest.py).

(a) Each model's ``calculate_loss`` equals pnn_fast's loss called directly, on the embeddings of RecBole's
    own BPR / LightGCN holding the same weights, with the known items built here from the training
    interactions and the same random draws.
(b) ``run_recbole`` trains each model on ml-100k with RecBole's Trainer and evaluator, and beats
    RecBole's Pop model, run the same way, on test NDCG@20 (PNNMF through the guide's example, as
    written); our ``run_recbole`` gives exactly the results of RecBole's own for a model RecBole knows
    by name.
"""
import contextlib
import hashlib
import math
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from recbole.config import Config
from recbole.data import create_dataset, data_preparation
from recbole.data.interaction import Interaction
from recbole.model.general_recommender import BPR, LightGCN
from recbole.model.loss import EmbLoss
from recbole.trainer import Trainer

from pnn_fast import DNSLoss, KnownPositives, PNNLoss, sample_unknown
from pnn_fast.data import default_data_dir
from pnn_fast.integrations.recbole import DNSLightGCN, DNSMF, PNNLightGCN, PNNMF, run_recbole

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = default_data_dir()
EPOCHS, BATCH = 3, 1024  # of each model in (b); Pop needs one epoch. PNN needs the 3rd epoch to pass Pop
LEARNING_RATE = 1e-2      # RecBole's default 1e-3 needs far more epochs
GUIDE = ROOT / "docs" / "guide.md"


def base_config(workdir: Path, **overrides) -> dict:
    """One CPU config for everything here; RecBole reads ml-100k from ``data_path`` (see test_ml100k_is_the_shared_copy)."""
    return {"data_path": str(DATA_DIR), "use_gpu": False, "gpu_id": "", "worker": 0, "seed": 2020,
            "reproducibility": True, "show_progress": False, "state": "WARNING", "log_wandb": False,
            "checkpoint_dir": str(workdir / "saved"), "metrics": ["NDCG", "Recall"], "topk": [20],
            "valid_metric": "NDCG@20", "learning_rate": LEARNING_RATE, **overrides}


@pytest.fixture(scope="module")
def ml100k():
    if not (DATA_DIR / "ml-100k" / "ml-100k.inter").exists():
        pytest.skip(f"no ml-100k under {DATA_DIR} (set PNN_FAST_DATA)")
    return DATA_DIR / "ml-100k" / "ml-100k.inter"


@pytest.fixture(scope="module")
def recbole_data(ml100k, tmp_path_factory):
    """RecBole's ml-100k, split 8:1:1, and its training loader (no RecBole negatives: the models' setting)."""
    workdir = tmp_path_factory.mktemp("recbole-data")
    config = Config(model=PNNMF, dataset="ml-100k",
                    config_dict=base_config(workdir, train_neg_sample_args=None, train_batch_size=512))
    dataset = create_dataset(config)
    train, valid, test = data_preparation(config, dataset)
    return types.SimpleNamespace(config=config, dataset=dataset, train=train, workdir=workdir)


def model_config(data, model_class, **overrides) -> Config:
    return Config(model=model_class, dataset="ml-100k",
                  config_dict=base_config(data.workdir, train_neg_sample_args=None, **overrides))


def a_batch(data) -> Interaction:
    torch.manual_seed(0)
    return next(iter(data.train))


def known_from_inter(data) -> KnownPositives:
    """The training pairs, straight from RecBole's interaction table; items shifted past RecBole's padding id 0."""
    train = data.train._dataset
    inter = train.inter_feat
    return KnownPositives.from_pairs(inter[train.uid_field].long(), inter[train.iid_field].long() - 1,
                                     train.user_num, train.item_num - 1)


def same_weights(source, target_class, config, data):
    target = target_class(config, data.train._dataset)
    target.load_state_dict({k: v for k, v in source.state_dict().items() if k in target.state_dict()}, strict=True)
    return target


def rows_and_table(reference, users):
    """The batch's user rows and the whole item table as RecBole's own model computes them: MF's
    embeddings as they are, LightGCN's after propagation (item row 0 is RecBole's padding)."""
    if isinstance(reference, LightGCN):
        user_all, item_all = reference.forward()
        return user_all[users], item_all
    return reference.get_user_embedding(users), reference.item_embedding.weight


# ---- (a) the models' loss is pnn_fast's loss ------------------------------------------------------

def test_models_are_recboles_with_only_the_loss_replaced():
    for model_class, base in ((PNNMF, BPR), (DNSMF, BPR), (PNNLightGCN, LightGCN), (DNSLightGCN, LightGCN)):
        assert issubclass(model_class, base)
        for name in ("forward", "predict", "full_sort_predict"):  # reused, not copied
            assert getattr(model_class, name) is getattr(base, name), (model_class, name)
        assert model_class.calculate_loss is not base.calculate_loss
    assert PNNLightGCN.get_norm_adj_mat is LightGCN.get_norm_adj_mat


def test_known_positives_are_the_training_interactions(recbole_data):
    model = PNNMF(model_config(recbole_data, PNNMF), recbole_data.train._dataset)
    expected = known_from_inter(recbole_data)
    assert torch.equal(model.known.indptr, expected.indptr) and torch.equal(model.known.indices, expected.indices)
    assert (model.known.num_users, model.known.num_items) == (recbole_data.dataset.user_num,
                                                              recbole_data.dataset.item_num - 1)
    assert model.known.nnz == len(recbole_data.train._dataset)  # ml-100k has no repeated (user, item)


@pytest.mark.parametrize("reg_weight", [0.0, 1e-3])
@pytest.mark.parametrize("model_class, base", [(PNNMF, BPR), (PNNLightGCN, LightGCN)], ids=["mf", "lightgcn"])
def test_pnn_calculate_loss_is_pnnloss(recbole_data, model_class, base, reg_weight, tmp_path, monkeypatch):
    hyper = {"pnn_alpha": 0.7, "pnn_beta": 0.5, "pnn_noise_max": 0.05, "pnn_history_len": 20}  # not the defaults
    config = model_config(recbole_data, model_class, reg_weight=reg_weight, **hyper)
    model = model_class(config, recbole_data.train._dataset)
    assert (model.pnn_loss.alpha, model.pnn_loss.beta, model.pnn_loss.noise_max) == (0.7, 0.5, 0.05)
    reference = same_weights(model, base, config, recbole_data)  # RecBole's own model, same weights
    batch = a_batch(recbole_data)
    users, items = batch[model.USER_ID], batch[model.ITEM_ID]

    loss_fn = PNNLoss(known_from_inter(recbole_data), config["embedding_size"], alpha=0.7, beta=0.5,
                      noise_max=0.05, history_len=20)
    loss_fn.load_state_dict(model.pnn_loss.state_dict())  # the attention's weights
    user_rows, item_table = rows_and_table(reference, users)
    torch.manual_seed(7)
    expected = loss_fn(user_rows, item_table[1:], users, items - 1)  # item ids past RecBole's padding 0
    if base is LightGCN and reg_weight:  # LightGCN's own L2 term, on the users' and positives' ego embeddings
        expected = expected + reg_weight * EmbLoss()(reference.user_embedding(users), reference.item_embedding(items))
    torch.manual_seed(7)  # the same noise and history draws
    got = model.calculate_loss(batch)
    torch.testing.assert_close(got.reshape(()), expected.reshape(()), rtol=1e-6, atol=1e-7)

    # the attention is part of the model, so RecBole's optimiser trains it
    attention = list(model.pnn_loss.parameters())
    assert attention and {id(p) for p in attention} <= {id(p) for p in model.parameters()}
    monkeypatch.chdir(tmp_path)  # RecBole's Trainer opens ./log_tensorboard
    trainer = Trainer(config, model)
    assert {id(p) for p in attention} <= {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    before = [p.detach().clone() for p in attention]
    trainer.optimizer.zero_grad()
    got.sum().backward()
    trainer.optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, attention))


@pytest.mark.parametrize("model_class, base", [(DNSMF, BPR), (DNSLightGCN, LightGCN)], ids=["mf", "lightgcn"])
def test_dns_calculate_loss_is_dnsloss(recbole_data, model_class, base):
    config = model_config(recbole_data, model_class, dns_candidates=5, reg_weight=0.0)
    model = model_class(config, recbole_data.train._dataset)
    reference = same_weights(model, base, config, recbole_data)
    batch = a_batch(recbole_data)
    users, items = batch[model.USER_ID], batch[model.ITEM_ID]
    known = known_from_inter(recbole_data)
    user_rows, item_table = rows_and_table(reference, users)
    torch.manual_seed(7)
    neg = sample_unknown(known, users, 5)  # 5 uniform unknown items per row (never RecBole's padding item)
    assert neg.shape == (len(users), 5) and not known.contains(users[:, None], neg).any()
    expected = DNSLoss(known)(user_rows, item_table[1:], users, items - 1, neg)
    torch.manual_seed(7)
    torch.testing.assert_close(model.calculate_loss(batch), expected, rtol=1e-6, atol=1e-7)


def test_recbole_negatives_are_left_out(recbole_data):
    """Had RecBole drawn point-wise negatives (label 0 rows), the loss sees the positive rows only."""
    config = model_config(recbole_data, PNNMF)
    model = PNNMF(config, recbole_data.train._dataset)
    batch = a_batch(recbole_data)
    n = len(batch)
    fake_negatives = Interaction({model.USER_ID: batch[model.USER_ID], model.ITEM_ID: torch.randint(1, 100, (n,))})
    positives = Interaction({model.USER_ID: batch[model.USER_ID], model.ITEM_ID: batch[model.ITEM_ID]})
    mixed = Interaction({model.USER_ID: torch.cat([positives[model.USER_ID], fake_negatives[model.USER_ID]]),
                         model.ITEM_ID: torch.cat([positives[model.ITEM_ID], fake_negatives[model.ITEM_ID]]),
                         model.LABEL: torch.cat([torch.ones(n), torch.zeros(n)])})
    torch.manual_seed(3)
    expected = model.calculate_loss(positives)
    torch.manual_seed(3)
    torch.testing.assert_close(model.calculate_loss(mixed), expected)


def test_importing_pnn_fast_never_imports_recbole_and_a_missing_recbole_says_what_to_install():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = ("import sys; import pnn_fast, pnn_fast.integrations; assert 'recbole' not in sys.modules; "
             "sys.modules['recbole'] = None; import pnn_fast.integrations.recbole")  # None: as if not installed
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: pnn_fast.integrations.recbole needs RecBole: pip install recbole==1.2.1")


# ---- (b) RecBole's pipeline end to end ------------------------------------------------------------

@contextlib.contextmanager
def train_losses():
    """Records each epoch's loss from RecBole's own Trainer._train_epoch (which still runs as is)."""
    losses, original = [], Trainer._train_epoch

    def spy(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        losses.append(loss)
        return loss

    Trainer._train_epoch = spy
    try:
        yield losses
    finally:
        Trainer._train_epoch = original


def run_in(workdir: Path, model, **overrides):
    with contextlib.chdir(workdir):  # RecBole writes ./log and ./log_tensorboard
        return run_recbole(model=model, dataset="ml-100k", config_dict=base_config(workdir, **overrides))


@pytest.fixture(scope="module")
def pop_ndcg(ml100k, tmp_path_factory):
    """RecBole's most-popular model, run the same way."""
    result = run_in(tmp_path_factory.mktemp("pop"), "Pop", epochs=1)
    return result["test_result"]["ndcg@20"]


def test_ml100k_is_the_shared_copy(ml100k, tmp_path):
    """For the name "ml-100k" RecBole 1.2.1 reads the copy inside its package whatever data_path says
    (Config._set_default_parameters), so nothing is downloaded; it is byte for byte ../shared/data's."""
    config = Config(model=PNNMF, dataset="ml-100k", config_dict=base_config(tmp_path))
    read = Path(config["data_path"]) / "ml-100k.inter"
    assert hashlib.sha256(read.read_bytes()).digest() == hashlib.sha256(ml100k.read_bytes()).digest()


def readme_example() -> str:
    """The python code block of the guide's section "With RecBole"."""
    section = GUIDE.read_text().split("## With RecBole\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_example_runs_as_written_and_beats_most_popular(pop_ndcg, tmp_path, capsys):
    """PNNMF's end-to-end run: the guide's example, as written (RecBole's defaults otherwise)."""
    namespace = {}
    with train_losses() as losses, contextlib.chdir(tmp_path):
        exec(compile(readme_example(), "docs/guide.md", "exec"), namespace)
    assert namespace["PNNMF"] is PNNMF
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    ndcg = namespace["result"]["test_result"]["ndcg@20"]
    with capsys.disabled():
        print(f"\n  README (PNNMF): test NDCG@20 {ndcg:.4f} vs Pop {pop_ndcg:.4f}")
    assert ndcg > pop_ndcg


@pytest.mark.parametrize("model_class", [PNNLightGCN, DNSMF, DNSLightGCN], ids=lambda c: c.__name__)
def test_run_recbole_trains_evaluates_and_beats_most_popular(model_class, pop_ndcg, tmp_path, capsys):
    start = time.perf_counter()
    with train_losses() as losses:
        result = run_in(tmp_path, model_class, epochs=EPOCHS, train_batch_size=BATCH, eval_step=1)
    seconds = time.perf_counter() - start
    assert len(losses) == EPOCHS and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses  # it trains
    assert set(result["best_valid_result"]) == set(result["test_result"]) == {"ndcg@20", "recall@20"}
    assert list((tmp_path / "saved").glob(f"{model_class.__name__}-*.pth"))  # RecBole's checkpoint, reloaded for test
    ndcg = result["test_result"]["ndcg@20"]
    with capsys.disabled():
        print(f"\n  {model_class.__name__}: test NDCG@20 {ndcg:.4f} vs Pop {pop_ndcg:.4f} "
              f"({EPOCHS} epochs, batch {BATCH}, lr {LEARNING_RATE}, {seconds:.0f} s)")
    assert ndcg > pop_ndcg


def test_our_run_recbole_is_recboles(ml100k, tmp_path, monkeypatch):
    """For a model RecBole knows by name, RecBole's own quick_start.run_recbole (ray, which it imports for
    hyper-parameter tuning only, stubbed where absent) and ours give the same results, by name and by class."""
    try:
        import ray  # noqa: F401
    except ImportError:
        ray = types.ModuleType("ray")
        ray.tune = types.ModuleType("ray.tune")
        monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # RecBole's reload of its checkpoint (torch >= 2.6)
    from recbole.quick_start import run_recbole as recboles_run_recbole

    settings = {"epochs": 1, "train_batch_size": 4096}
    results = []
    for name, runner, model in (("recbole", recboles_run_recbole, "BPR"), ("ours-name", run_recbole, "BPR"),
                                ("ours-class", run_recbole, BPR)):
        (tmp_path / name).mkdir()
        with contextlib.chdir(tmp_path / name):
            results.append(runner(model=model, dataset="ml-100k", config_dict=base_config(tmp_path / name, **settings)))
    assert results[0] == results[1] == results[2]
