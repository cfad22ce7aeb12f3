"""Trainer and CLI: resume equals an uninterrupted run, real data beats popularity and nearly BPR, CLI errors
and the CLI's mapping of its flags."""
import dataclasses
import json
import math
import operator
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import pnn_fast
from conftest import data_path
from pnn_fast import _version
from pnn_fast.cli import _config, build_parser, main
from pnn_fast.data import load_dataset, synthetic_dataset
from pnn_fast.eval import evaluate
from pnn_fast.train import TrainConfig, Trainer, run


@pytest.fixture
def two_threads():
    """Two torch threads, so that resume also checks that multi-threaded steps are reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def small_data():
    return synthetic_dataset(num_users=120, num_items=60, interactions_per_user=12, seed=1)


@pytest.mark.parametrize("loss", ["bpr", "dns", "pnn"])
def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path, loss, two_threads):
    data = small_data()
    config = dict(loss=loss, epochs=3, batch_size=256, dim=8, patience=100)
    straight = run(data, TrainConfig(**config), tmp_path / "a", progress=False, log=lambda *_: None)
    run(data, TrainConfig(**dict(config, epochs=2)), tmp_path / "b", progress=False, log=lambda *_: None)
    resumed = run(data, TrainConfig(**config), tmp_path / "b", resume=True, progress=False, log=lambda *_: None)
    assert [h["loss"] for h in resumed["epochs"]] == [h["loss"] for h in straight["epochs"]]
    assert resumed["test"] == straight["test"]
    assert (tmp_path / "b" / "curves.png").stat().st_size > 0


def test_resume_refuses_other_settings(tmp_path):
    data = small_data()
    run(data, TrainConfig(loss="bpr", epochs=1, dim=8), tmp_path, progress=False, log=lambda *_: None)
    with pytest.raises(ValueError, match="lr"):
        run(data, TrainConfig(loss="bpr", epochs=2, dim=8, lr=0.5), tmp_path, resume=True, progress=False)


def test_eval_every_validates_every_nth_epoch_and_the_last(tmp_path):
    data = small_data()
    config = dict(loss="bpr", epochs=5, batch_size=256, dim=8, patience=100, lr=0.05)
    every = run(data, TrainConfig(**config, eval_every=2), tmp_path / "every2", progress=False, log=lambda *_: None)
    assert [h["epoch"] for h in every["epochs"] if h["valid"]] == [2, 4, 5]
    assert every["best_epoch"] in (2, 4, 5)
    # the same training (the validation draws no random numbers): the same losses, the metrics of
    # the validated epochs, and the test score of the best one
    each = run(data, TrainConfig(**config), tmp_path / "every1", progress=False, log=lambda *_: None)
    assert [h["loss"] for h in every["epochs"]] == [h["loss"] for h in each["epochs"]]
    for mine, theirs in zip(every["epochs"], each["epochs"]):
        assert not mine["valid"] or mine["valid"] == theirs["valid"]
    validated = {h["epoch"]: h["valid"]["ndcg@20"] for h in each["epochs"] if h["epoch"] in (2, 4, 5)}
    assert every["best_epoch"] == max(validated, key=lambda e: (validated[e], -e))


def test_patience_counts_validations(tmp_path):
    """patience 1, eval_every 3: the run stops at the second validation without improvement, the
    6th epoch after the best (with eval_every 1 it would be the 2nd)."""
    data = small_data()
    result = run(data, TrainConfig(loss="bpr", epochs=60, batch_size=256, dim=8, patience=1, lr=0.5, eval_every=3),
                 tmp_path, progress=False, log=lambda *_: None)
    assert len(result["epochs"]) == result["best_epoch"] + 6 < 60


def popularity_ndcg(data):
    pop = torch.bincount(data.train[1], minlength=data.num_items).double()[:, None]
    return evaluate(torch.ones(data.num_users, 1, dtype=torch.float64), pop, data.test, [data.train, data.valid],
                    ks=(20,))["ndcg@20"]


#: the least share of BPR's test NDCG@20 that a method's short run must reach, BPR trained the same
#: way (data, model, epochs, optimiser): beating most-popular alone would pass a method 30% under BPR
BPR_FLOOR = 0.9


class BelowBPR(AssertionError):
    """A short run under BPR_FLOOR x BPR's NDCG@20. The known cases are marked
    ``xfail(raises=BelowBPR, strict=True)``: any other failure still fails, and reaching the floor
    fails too, so that the mark goes."""


def bpr_twin_ndcg(data, config: TrainConfig, out) -> float:
    """Test NDCG@20 of BPR trained like ``config``: the same data, model, epochs and optimiser."""
    twin = dataclasses.replace(config, loss="bpr", loss_args={})
    return run(data, twin, out, progress=False, log=lambda *_: None)["test"]["ndcg@20"]


def assert_reaches_bpr(ndcg: float, bpr_ndcg: float) -> None:
    if ndcg < BPR_FLOOR * bpr_ndcg:
        raise BelowBPR(f"test NDCG@20 {ndcg:.4f} is under {BPR_FLOOR} x BPR's {bpr_ndcg:.4f} "
                       f"({ndcg / bpr_ndcg:.2f} x)")


SHORT_RUN = dict(epochs=4, batch_size=1024, lr=0.01, reg_weight=0.0, dim=32, patience=100)


@pytest.fixture(scope="module")
def ml100k():
    return load_dataset(data_path("ml-100k"), split="rs", seed=2020)


@pytest.fixture(scope="module")
def short_bpr_run(ml100k, tmp_path_factory):
    """BPR's short run on ml-100k: (results, output folder)."""
    out = tmp_path_factory.mktemp("bpr")
    return run(ml100k, TrainConfig(loss="bpr", **SHORT_RUN), out, progress=False, log=lambda *_: None), out


@pytest.mark.parametrize("loss, loss_args", [
    ("bpr", {}),
    pytest.param("pnn", {}, id="pnn-paper", marks=pytest.mark.xfail(
        raises=BelowBPR, strict=True, reason="the paper's PNN (in-batch candidates, learned lambda) reaches 0.70 x "
        "BPR here (NDCG@20 0.175 against 0.249), as in studies/why-pnn-log.md's screening (-19% against BPR)")),
    pytest.param("pnn", {"preset": "dns-anchored"}, id="pnn-dns-anchored"),
])
def test_short_run_on_ml100k_beats_most_popular_and_nearly_bpr(tmp_path, ml100k, short_bpr_run, loss, loss_args):
    bpr, out = short_bpr_run
    if loss != "bpr":
        out = tmp_path
        results = run(ml100k, TrainConfig(loss=loss, loss_args=loss_args, **SHORT_RUN), out, progress=False,
                      log=lambda *_: None)
    else:
        results = bpr
    ndcg, baseline = results["test"]["ndcg@20"], popularity_ndcg(ml100k)
    assert ndcg > baseline, (ndcg, baseline)
    saved = json.loads((out / "results.json").read_text())
    assert saved["best_epoch"] >= 1 and len(saved["epochs"]) == 4 and "torch" in saved["versions"]
    assert_reaches_bpr(ndcg, bpr["test"]["ndcg@20"])


def test_cli_help_lists_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--data", "--model", "--loss", "--resume", "--no-rank", "--fixed-lambda", "--pnn-sampled"):
        assert option in text


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--model", "transformer"], "--model"),
    (["train", "--epochs", "many"], "--epochs"),
    (["train", "--epochs", "0"], "epochs"),
    (["train", "--data", "/nonexistent/folder"], "nonexistent"),
    (["train", "--model-arg", "n_layers"], "KEY=VALUE"),
    (["train", "--loss-arg", "gamma=2", "--epochs", "1"], "gamma"),
    # PNN's weights: negative or not finite would train a loss unbounded below, or NaN
    (["train", "--alpha", "-1", "--epochs", "1"], "argument --alpha: alpha must be a finite number >= 0, got -1.0"),
    (["train", "--beta", "nan", "--epochs", "1"], "argument --beta: beta must be a finite number >= 0, got nan"),
    (["train", "--fixed-lambda", "1.5", "--epochs", "1"], "argument --fixed-lambda"),
    (["train", "--loss-arg", "noise_max=-0.1", "--epochs", "1"], "noise_max must be a finite number >= 0"),
    (["train", "--loss-arg", "rank_weight=Infinity", "--epochs", "1"], "rank_weight must be a finite number"),
    (["train", "--history-len", "0", "--epochs", "1"], "argument --history-len: history_len must be an int >= 1"),
    (["train", "--pnn-sampled", "--pnn-candidates", "4", "--neg-size", "4", "--epochs", "1"],
     "neg_size must be 'proportional', 'count' or an int in [0, num_candidates) = [0, 4), got 4"),
    (["train", "--loss", "sl", "--loss-arg", "num_negatives=8", "--loss-arg", "neg_size=8", "--epochs", "1"],
     "neg_size"),
    (["train", "--patience", "-1", "--epochs", "1"], "patience must be a positive int, got -1"),
    (["train", "--eval-every", "0", "--epochs", "1"], "eval_every must be a positive int, got 0"),
    (["train", "--lr", "nan", "--epochs", "1"], "lr must be a finite number > 0"),
    # an unknown key is an error that lists the valid ones, never dropped
    (["train", "--model-arg", "reg_weight=1e-4", "--epochs", "1"],
     "has no hyper-parameter(s) ['reg_weight']; valid: []"),
    (["train", "--model", "lightgcn", "--model-arg", "n_layer=3", "--epochs", "1"], "valid: ['n_layers']"),
    (["train", "--loss", "pnn", "--alpha", "0.3", "--loss-arg", "preset=dns-anchored", "--epochs", "1"],
     "drop the flags that set ['alpha']"),
    (["train", "--loss", "dns", "--loss-arg", "candidate=4", "--epochs", "1"],
     "has no argument(s) ['candidate']; valid: ['backend', 'candidates', 'in_batch']"),
    # issue 67's bad inputs: tests/test_hostile_inputs.py
])
def test_cli_bad_options_give_one_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # were a bad option accepted, its run would write runs/ here
    try:
        code = main(argv)
    except SystemExit as err:
        code = err.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()  # refused before anything trained


@pytest.mark.parametrize("flags, settings", [
    ([], dict(lambda_mode="attention", use_rank=True, num_candidates=None, alpha=0.8, beta=0.6,
              neg_size="proportional")),
    (["--no-warmup"], dict(lambda_mode="fixed", fixed_lambda=1.0, attention=None)),
    (["--no-warmup", "--fixed-lambda", "0.3"], dict(lambda_mode="fixed", fixed_lambda=1.0)),  # no warm-up wins
    (["--fixed-lambda", "0.3"], dict(lambda_mode="fixed", fixed_lambda=0.3, attention=None)),
    (["--no-rank"], dict(use_rank=False, lambda_mode="attention")),
    (["--pnn-sampled"], dict(num_candidates=8)),
    (["--pnn-sampled", "--pnn-candidates", "5", "--neg-size", "2"], dict(num_candidates=5, neg_size=2)),
    (["--alpha", "0", "--beta", "0.25", "--neg-size", "count"], dict(alpha=0.0, beta=0.25, neg_size="count")),
    (["--history-len", "7", "--backend", "reference"], {"attention.history_len": 7, "backend": "reference"}),
    # a preset replaces the flags' defaults (only the backend may be set beside it)
    (["--loss-arg", "preset=dns-anchored", "--backend", "reference"],
     dict(num_candidates=8, beta=0.0, lambda_mode="fixed", fixed_lambda=0.1, backend="reference")),
])
def test_cli_pnn_flags_set_the_loss(flags, settings):
    """The paper's ablation switches of ``pnn-fast train`` reach the PNNLoss the trainer builds."""
    args = build_parser().parse_args(["train", "--loss", "pnn", "--dim", "8", *flags])
    loss_fn = Trainer(small_data(), _config(args, "pnn"), "/tmp/unused").objective.loss_fn
    for name, value in settings.items():
        assert operator.attrgetter(name)(loss_fn) == value, name


def test_cli_dns_flags_set_the_loss():
    args = build_parser().parse_args(["train", "--loss", "dns", "--dns-candidates", "3", "--dns-in-batch",
                                      "--dim", "8"])
    objective = Trainer(small_data(), _config(args, "dns"), "/tmp/unused").objective
    assert objective.args == {"candidates": 3, "in_batch": True, "backend": "auto"}


def test_cli_key_values_parse_python_and_json_words():
    from pnn_fast.cli import _parse_pairs

    parsed = _parse_pairs("--loss-arg", ["in_batch=False", "a=true", "b=None", "c=0.5", "d=[1, 2]", "e=mean"])
    assert parsed == {"in_batch": False, "a": True, "b": None, "c": 0.5, "d": [1, 2], "e": "mean"}


def test_module_entry_point_trains_on_builtin_data(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pnn_fast", "train", "--epochs", "1", "--dim", "8",
                           "--no-progress", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "best epoch 1" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["loss"] == "pnn" and 0 <= results["test"]["ndcg@20"] <= 1
    trainer_out = subprocess.run([sys.executable, "-m", "pnn_fast", "evaluate", "--checkpoint", str(out / "checkpoint.pt")],
                                 capture_output=True, text=True, timeout=600)
    assert trainer_out.returncode == 0, trainer_out.stderr
    assert json.loads(trainer_out.stdout)["ndcg@20"] == pytest.approx(results["test"]["ndcg@20"])


def test_evaluate_refuses_data_with_other_id_spaces_than_the_checkpoint(tmp_path, capsys):
    """The checkpoint's tables declare its users and items; other data is one line, not a state-dict dump."""
    run(small_data(), TrainConfig(loss="bpr", epochs=1, dim=8), tmp_path, progress=False, log=lambda *_: None)
    other = tmp_path / "other.csv"
    other.write_text("user,item\n" + "".join(f"{u},{i}\n" for u in range(4) for i in range(5) if (u + i) % 2))
    code = main(["evaluate", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--data", str(other)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "was trained on 120 users and 60 items, but --data gives 4 and 5" in err, err
    assert "\n" not in err


def test_trainer_rejects_bad_config():
    with pytest.raises(ValueError, match="softmax"):
        Trainer(small_data(), TrainConfig(loss="softmax"), "/tmp/unused")
    with pytest.raises(ValueError, match="temperature"):
        Trainer(small_data(), TrainConfig(loss="pnn", loss_args={"temperature": 2}), "/tmp/unused")
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match="valid_metric"):
        TrainConfig(valid_metric="auc")
    with pytest.raises(ValueError, match="model"):
        Trainer(small_data(), TrainConfig(model="gru"), "/tmp/unused")


def test_compare_always_includes_bpr_dns_pnn(tmp_path, capsys):
    code = main(["compare", "--losses", "bpr", "--epochs", "1", "--dim", "8", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    table = (tmp_path / "comparison.md").read_text()
    assert all(f"| {loss} |" in table for loss in ("bpr", "dns", "pnn"))


def test_embedding_l2_is_recbole_embloss_of_the_three_gathered_matrices():
    from pnn_fast.models import build_model
    from pnn_fast.objectives import embedding_l2

    users, items = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3])
    model = build_model("mf", 5, 6, users, items, dim=4).double()
    U, I = model.user_embedding.weight, model.item_embedding.weight
    b_users, pos, neg = torch.tensor([1, 1, 4]), torch.tensor([0, 5, 2]), torch.tensor([[3, 4], [1, 1], [0, 2]])
    want = (U[b_users].norm() + I[pos].norm() + I[neg].norm()) / 3  # RecBole: reg_loss(u, pos, neg) / B
    torch.testing.assert_close(embedding_l2(model, b_users, pos, neg), want, rtol=1e-12, atol=0)
    torch.testing.assert_close(embedding_l2(model, b_users, pos), (U[b_users].norm() + I[pos].norm()) / 3,
                               rtol=1e-12, atol=0)


def test_bpr_objective_fuses_the_l2_term_with_the_same_value_and_gradients(tmp_path):
    """MF + bpr: the trainer's loss with the L2 term inside the BPR op equals BPR + embedding_l2."""
    from pnn_fast.objectives import embedding_l2

    data = synthetic_dataset(num_users=40, num_items=30, seed=1)
    trainer = Trainer(data, TrainConfig(model="mf", loss="bpr", reg_weight=0.05, dim=8), tmp_path)
    users, pos = trainer.train_users[:64], trainer.train_items[:64]
    trainer.generator.manual_seed(7)
    assert trainer.objective(trainer.model, users, pos, trainer.generator, reg_weight=0.05).l2_included
    trainer.generator.manual_seed(7)
    fused = trainer._batch_loss(users, pos)
    fused.backward()
    fused_grads = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.adam.zero_grad()
    trainer.generator.manual_seed(7)  # BPR alone (no weight offered), then the trainer's L2 term on the same rows
    out = trainer.objective(trainer.model, users, pos, trainer.generator)
    separate = out.loss + 0.05 * embedding_l2(trainer.model, out.users, out.pos_items, out.neg_items)
    separate.backward()
    torch.testing.assert_close(fused, separate, rtol=1e-5, atol=1e-7)
    for got, want in zip(fused_grads, (p.grad for p in trainer.model.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-8)

    # a graph model scores propagated tables: the L2 term (on layer-0 rows) is then the trainer's
    graph = Trainer(data, TrainConfig(model="lightgcn", loss="bpr", reg_weight=0.05, dim=8), tmp_path / "lightgcn")
    assert not graph.objective(graph.model, users, pos, graph.generator, reg_weight=0.05).l2_included


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lean_adam_step_equals_optimizer_step(weight_decay):
    from pnn_fast.train import LeanAdamStep

    def run(lean: bool):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(50, 8, generator=gen)),
                  torch.nn.Parameter(torch.randn(7, generator=gen))]
        opt = torch.optim.Adam(params, lr=0.01, weight_decay=weight_decay, fused=True)
        stepper = LeanAdamStep(opt)
        full_steps = []
        full_step = opt.step
        opt.step = lambda: (full_steps.append(1), full_step())  # counts the calls that take the full route
        for step in range(5):
            (stepper.zero_grad if lean else lambda: opt.zero_grad(set_to_none=True))()
            loss = (params[0] ** 3).sum() + (params[1].sin() * torch.arange(7.0)).sum()
            if step != 2:  # one step where a parameter has no gradient: that one keeps its value
                loss = loss + params[1].sum()
            else:
                loss = (params[0] ** 3).sum()
            loss.backward()
            (stepper.step if lean else opt.step)()
        return params, opt.state_dict(), len(full_steps)

    (p_lean, s_lean, full_lean), (p_ref, s_ref, full_ref) = run(True), run(False)
    assert (full_lean, full_ref) == (2, 5)  # the lean route skips all but the first step and the one without a grad
    assert LeanAdamStep(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], fused=True)).lean
    for a, b in zip(p_lean, p_ref):
        assert torch.equal(a, b)
    for key in s_ref["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s_lean["state"][key][name], s_ref["state"][key][name]), (key, name)


def test_each_epoch_records_the_source_revision_that_trained_it(tmp_path):
    """A study runs for hours while the code under it may change: each epoch carries the revision that
    trained it, and results.json lists them; a resumed run adds its own after the earlier ones."""
    source_revision = _version.source_revision
    data = small_data()
    config = dict(loss="bpr", epochs=3, batch_size=256, dim=8, patience=100)
    run(data, TrainConfig(**dict(config, epochs=2)), tmp_path, progress=False, log=lambda *_: None)
    checkpoint = tmp_path / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=False)
    assert [h["source"] for h in state["history"]] == [source_revision()] * 2
    # as if the first two epochs had been trained by another revision
    for entry in state["history"]:
        entry["source"] = "0123456789ab"
    torch.save(state, checkpoint)
    results = run(data, TrainConfig(**config), tmp_path, resume=True, progress=False, log=lambda *_: None)
    assert [h["source"] for h in results["epochs"]] == ["0123456789ab"] * 2 + [source_revision()]
    assert results["versions"]["source"] == ["0123456789ab", source_revision()]


def test_source_revision_is_this_checkouts_commit(tmp_path):
    """The commit of the checkout the package is imported from (None outside a git checkout), and None
    for a copy of the package that sits inside some other repository."""
    root = Path(pnn_fast.__file__).resolve().parent.parent

    def git(*args, cwd=root):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)

    top = git("rev-parse", "--show-toplevel")
    revision = _version.source_revision()
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
        assert revision is None
    else:
        head = git("rev-parse", "--short=12", "HEAD").stdout.strip()
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *_version.SOURCE_PATHS).stdout.strip()
        assert revision == head + ("+dirty" if dirty else "")

    # the package copied two folders below the top of another repository: not that repository's source
    other = tmp_path / "project"
    package = other / "venv" / "site" / "pnn_fast"
    package.mkdir(parents=True)
    shutil.copy(Path(_version.__file__), package / "_version.py")
    git("init", "-q", cwd=other)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "other", cwd=other)
    assert git("rev-parse", "HEAD", cwd=other).returncode == 0  # that repository has a commit to misreport
    copy = {"__file__": str(package / "_version.py"), "__name__": "pnn_fast_copy"}
    exec(compile((package / "_version.py").read_text(), str(package / "_version.py"), "exec"), copy)
    assert copy["source_revision"]() is None


@pytest.mark.parametrize("loss, loss_args", [("bpr", {}), ("dns", {}), ("pnn", {}), ("pnn", {"preset": "dns-anchored"}),
                                             ("sl", {"num_negatives": 16})])
def test_sparse_step_gives_the_dense_loss_and_gradients_as_sparse_rows(tmp_path, loss, loss_args):
    """--sparse: the trainer's whole batch loss (L2 term included) equals the dense one, and the
    tables' gradients are sparse COO tensors holding the dense gradients' nonzero rows."""
    data = synthetic_dataset(num_users=120, num_items=3000, interactions_per_user=12, seed=1)
    grads = {}
    for sparse in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(data, TrainConfig(loss=loss, dim=8, reg_weight=0.05, sparse=sparse, loss_args=loss_args),
                          tmp_path / str(sparse))
        users, pos = trainer.train_users[:96], trainer.train_items[:96]
        trainer.generator.manual_seed(7)
        torch.manual_seed(3)  # PNN's noise and history draws
        loss_value = trainer._batch_loss(users, pos)
        loss_value.backward()
        grads[sparse] = (loss_value.detach(), trainer.model.user_embedding.weight.grad,
                         trainer.model.item_embedding.weight.grad)
    (dense_loss, *dense), (sparse_loss, *sparse) = grads[False], grads[True]
    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-5, atol=1e-7)
    for got, want in zip(sparse, dense):
        assert got.is_sparse and not want.is_sparse
        torch.testing.assert_close(got.to_dense(), want, rtol=1e-4, atol=1e-8)
        assert got.coalesce().indices().numel() < want.shape[0]  # fewer rows than the table


def test_sparse_training_updates_only_the_rows_read_and_resumes_exactly(tmp_path, two_threads):
    data = small_data()
    config = dict(loss="sl", epochs=3, batch_size=256, dim=8, patience=100, sparse=True,
                  loss_args={"num_negatives": 4})
    straight = run(data, TrainConfig(**config), tmp_path / "a", progress=False, log=lambda *_: None)
    run(data, TrainConfig(**dict(config, epochs=2)), tmp_path / "b", progress=False, log=lambda *_: None)
    resumed = run(data, TrainConfig(**config), tmp_path / "b", resume=True, progress=False, log=lambda *_: None)
    assert [h["loss"] for h in resumed["epochs"]] == [h["loss"] for h in straight["epochs"]]
    assert resumed["test"] == straight["test"]

    trainer = Trainer(data, TrainConfig(**dict(config, epochs=1)), tmp_path / "c")
    assert isinstance(trainer.optimizer.tables, torch.optim.SparseAdam)
    before = trainer.model.item_embedding.weight.detach().clone()
    users, pos = trainer.train_users[:4], trainer.train_items[:4]
    trainer.adam.zero_grad()
    trainer._batch_loss(users, pos).backward()
    read = trainer.model.item_embedding.weight.grad.coalesce().indices()[0]
    trainer.adam.step()
    changed = (trainer.model.item_embedding.weight.detach() != before).any(dim=1).nonzero().squeeze(1)
    assert torch.equal(changed, read.sort().values) and changed.numel() < before.shape[0]


@pytest.mark.parametrize("config, fragment", [
    (dict(loss="simplex"), "--sparse: loss 'simplex' has no sparse path; these do: bpr, bsl, dns, pnn, psl, sl, slatk"),
    (dict(model="lightgcn", loss="bpr"), "--sparse needs a model that scores with its embedding tables (mf)"),
])
def test_sparse_refuses_what_has_no_sparse_path(tmp_path, config, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Trainer(small_data(), TrainConfig(dim=8, sparse=True, **config), tmp_path)


@pytest.fixture(scope="module")
def named_run(tmp_path_factory):
    """A short run on a CSV whose ids are words: (folder, data file, the interactions by user)."""
    folder = tmp_path_factory.mktemp("named")
    gen = torch.Generator().manual_seed(5)
    pairs = sorted({(int(u), int(i)) for u, i in zip(torch.randint(0, 40, (600,), generator=gen),
                                                     torch.randint(0, 30, (600,), generator=gen))})
    data = folder / "pairs.csv"
    data.write_text("user,item\n" + "".join(f"u{u},item-{i}\n" for u, i in pairs))
    out = folder / "run"
    assert main(["train", "--data", str(data), "--loss", "bpr", "--epochs", "2", "--dim", "8", "--out", str(out),
                 "--no-progress"]) == 0
    by_user: dict[str, set] = {}
    for u, i in pairs:
        by_user.setdefault(f"u{u}", set()).add(f"item-{i}")
    return out, data, by_user


def test_recommend_writes_each_users_best_unknown_items_in_original_ids(named_run, tmp_path, capsys):
    import csv

    out, data, by_user = named_run
    recs, emb = tmp_path / "recs.csv", tmp_path / "emb"
    assert main(["recommend", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data), "--k", "4",
                 "--out", str(recs), "--embeddings", str(emb)]) == 0
    rows = list(csv.DictReader(recs.open()))
    users = json.loads((emb / "user_ids.json").read_text())
    items = json.loads((emb / "item_ids.json").read_text())
    user_table, item_table = (torch.from_numpy(__import__("numpy").load(emb / f"{s}_embeddings.npy"))
                              for s in ("user", "item"))
    assert set(users) == set(by_user) and user_table.shape == (len(users), 8) and item_table.shape[0] == len(items)
    # the brute-force answer from the exported tables: every score, known items removed, best first
    for row, user in enumerate(users):
        got = [r for r in rows if r["user"] == user]
        assert [int(r["rank"]) for r in got] == [1, 2, 3, 4]
        scores = user_table[row] @ item_table.T
        known = torch.tensor([name in by_user[user] for name in items])
        order = torch.sort(scores.masked_fill(known, -math.inf), descending=True, stable=True).indices[:4]
        assert [r["item"] for r in got] == [items[j] for j in order]
        assert not {r["item"] for r in got} & by_user[user]


def test_recommend_users_file_names_an_unknown_user_by_line(named_run, tmp_path, capsys):
    out, data, _ = named_run
    users = tmp_path / "users.txt"
    users.write_text("u3\n\nu999\n")
    code = main(["recommend", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data),
                 "--users", str(users), "--out", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"pnn-fast: error: {users}:3: user 'u999' is not in --data"
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("text, fragment", [
    (b"u3\n\xff\xfeu4\n", ":2: is not UTF-8 text (byte 0xff at column 1)"),  # was a decoder's message, no file
    (b"u3\nu4\nu3\n", ":3: user 'u3' is listed again (first at line 1)"),  # its rows were written twice
])
def test_recommend_users_file_refuses_bytes_that_are_not_text_and_a_user_listed_twice(named_run, tmp_path, capsys,
                                                                                   text, fragment):
    out, data, _ = named_run
    users = tmp_path / "users.txt"
    users.write_bytes(text)
    code = main(["recommend", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data),
                 "--users", str(users), "--out", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"pnn-fast: error: {users}{fragment}", err
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.mkdir(), "is a folder; give the checkpoint.pt inside it"),
    (lambda p: p.write_bytes(b""), "is not a checkpoint written by pnn-fast train"),
    (lambda p: p.write_bytes(bytes(range(256)) * 4), "is not a checkpoint written by pnn-fast train"),
    (lambda p: torch.save({"weights": torch.zeros(2)}, p), "is not a checkpoint written by pnn-fast train (it lacks"),
    # a pickled object would run code on loading: refused, never constructed
    (lambda p: torch.save({"config": __import__("fractions").Fraction(1, 2)}, p),
     "was refused: it holds a Python object (fractions.Fraction)"),
])
@pytest.mark.parametrize("command", ["evaluate", "recommend"])
def test_checkpoints_that_are_not_ours_are_refused_in_one_line(tmp_path, capsys, make, fragment, command):
    path = tmp_path / "checkpoint.pt"
    make(path)
    extra = ["--out", str(tmp_path / "r.csv")] if command == "recommend" else []
    code = main([command, "--checkpoint", str(path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "\n" not in err, err


def test_a_run_without_validation_or_test_split_says_so_and_never_labels_a_loss_a_metric(tmp_path, capsys):
    """Issue 67, item 2: the negated training loss was reported as ``ndcg@20``."""
    data = tmp_path / "one.csv"
    data.write_text("user,item\n0,0\n1,1\n")  # one pair a user: every pair trains
    assert main(["train", "--data", str(data), "--epochs", "2", "--no-progress", "--out", str(tmp_path / "o"),
                 "--loss", "bpr"]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-2]
    assert "lowest training loss" in last and "no validation split" in last and "no test split" in last, out
    assert "ndcg@20 -" not in out
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["best_valid"] is None and results["test"] == {}


def write_random_pairs(path, seed: int) -> None:
    """A user,item CSV of 30 users and 40 items, about 500 distinct random pairs drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    pairs = sorted({(int(u), int(i)) for u, i in zip(torch.randint(0, 30, (500,), generator=g),
                                                     torch.randint(0, 40, (500,), generator=g))})
    path.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in pairs))


def test_resume_evaluate_and_recommend_refuse_other_data_or_another_split(tmp_path, capsys):
    """Issue 67, items 4 to 6: a checkpoint remembers its data and split by fingerprint."""
    folder = tmp_path / "data"
    folder.mkdir()

    def write(seed):
        write_random_pairs(folder / "ratings.csv", seed)

    write(1)
    out = tmp_path / "run"
    base = ["--data", str(folder / "ratings.csv"), "--split", "rs"]
    assert main(["train", *base, "--loss", "bpr", "--epochs", "1", "--dim", "8", "--out", str(out),
                 "--no-progress"]) == 0
    checkpoint = str(out / "checkpoint.pt")
    capsys.readouterr()
    # another split of the same data: it used to score training items as test items
    for command in (["evaluate"], ["recommend", "--out", str(tmp_path / "r.csv")]):
        assert main([*command, "--checkpoint", checkpoint, *base, "--split-seed", "7"]) == 2
        err = capsys.readouterr().err.strip()
        assert "was trained on another split of this data" in err and "--split-seed" in err and "\n" not in err, err
    # other data of the same shape
    write(2)
    assert main(["evaluate", "--checkpoint", checkpoint, *base]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--checkpoint {checkpoint} was trained on other data (data fingerprint" in err, err
    assert main(["train", *base, "--loss", "bpr", "--epochs", "2", "--dim", "8", "--out", str(out), "--resume",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--resume: the checkpoint" in err and "was trained on other data" in err and "\n" not in err, err
    # a checkpoint from before fingerprints is adopted, with one line saying so
    write(1)
    state = torch.load(checkpoint, weights_only=True)
    del state["fingerprint"]
    torch.save(state, checkpoint)
    assert main(["evaluate", "--checkpoint", checkpoint, *base]) == 0
    err = capsys.readouterr().err.strip()
    assert err == f"pnn-fast: warning: --checkpoint {checkpoint} predates data fingerprints: its data and split are not checked"


def test_evaluate_and_recommend_read_the_data_as_the_run_did(tmp_path, capsys):
    """Issue 67, item 6: a checkpoint records how its data was read (split and seed among them), and
    evaluate and recommend use that unless told otherwise: a run split with seed 7 is evaluated on
    its own test split, not refused (or, before fingerprints, scored on another split)."""
    data = tmp_path / "ratings.csv"
    write_random_pairs(data, 5)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--split", "rs", "--split-seed", "7", "--loss", "bpr", "--epochs", "1",
                 "--dim", "8", "--out", str(out), "--no-progress"]) == 0
    trained = json.loads((out / "results.json").read_text())
    assert trained["config"]["data_args"]["split_seed"] == 7
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == trained["test"]
    # told otherwise, it reads another split, which the fingerprint refuses in one line
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data), "--split-seed", "8"]) == 2
    assert "was trained on another split of this data" in capsys.readouterr().err


def test_a_second_run_into_a_locked_folder_is_refused(tmp_path):
    """Issue 67, item 7: two runs writing one --out lost one run's results. The lock is held, then the
    second run starts: deterministic, with no race to win."""
    import fcntl

    out = tmp_path / "race"
    out.mkdir()
    with open(out / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=r"--out .*race is in use by another run; wait for it, or give another --out"):
            run(small_data(), TrainConfig(loss="bpr", epochs=1, dim=8), out, progress=False, log=lambda *_: None)
    assert not (out / "results.json").exists()
    run(small_data(), TrainConfig(loss="bpr", epochs=1, dim=8), out, progress=False, log=lambda *_: None)  # free now


def test_a_killed_run_releases_its_lock(tmp_path, capsys):
    """flock belongs to the process: kill -9 releases it, and --resume then continues."""
    import signal

    out = tmp_path / "killed"
    code = (f"import sys; sys.argv = ['pnn-fast', 'train', '--epochs', '100000', '--patience', '100000', '--dim', '8', "
            f"'--loss', 'bpr', '--no-progress', '--out', {str(out)!r}]; from pnn_fast.cli import main; main()")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.pt").exists():
            assert time.monotonic() < deadline and child.poll() is None, "the run wrote no checkpoint"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # the lock went with the process: the folder is refused only for the run it holds, and resumes
    assert main(["train", "--epochs", "1", "--dim", "8", "--loss", "bpr", "--no-progress", "--out", str(out)]) == 2
    assert "holds a run" in capsys.readouterr().err
    assert main(["train", "--epochs", "2", "--patience", "100000", "--dim", "8", "--loss", "bpr", "--no-progress",
                 "--out", str(out), "--resume"]) == 0
    assert (out / "results.json").exists()


def test_rerunning_into_a_folder_that_holds_a_run_needs_resume_or_overwrite(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["train", "--epochs", "1", "--dim", "8", "--loss", "bpr", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    first = (out / "results.json").read_text()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"pnn-fast: error: --out {out} holds a run (checkpoint.pt, results.json): continue it with "
                   f"--resume, or replace it with --overwrite")
    assert (out / "results.json").read_text() == first
    assert main(argv + ["--overwrite", "--seed", "3"]) == 0
    assert json.loads((out / "results.json").read_text())["config"]["seed"] == 3
