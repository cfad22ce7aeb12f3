"""A thin trainer: RecBole's protocol for the paper's experiments, without its overheads.

Each epoch shuffles the training pairs on the device, draws negatives on the device
(:func:`pnn_fast.sampling.sample_unknown`, exact and loop-free) and keeps the running loss
on the device, so a batch costs no host synchronisation in the trainer itself. After every
``eval_every``-th epoch (and the last) it evaluates on the validation split and keeps the best
state; after each epoch it writes a checkpoint (atomically: an interrupted run resumes where the
last epoch ended, with the same random streams); it stops early after ``patience`` validations
without improvement. The test split is scored once, with the best state.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import pickle
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.adam import adam as functional_adam
from tqdm.auto import tqdm

from . import distributed
from ._checks import (check_cutoffs, check_device, check_real, check_seed, raise_kernel_input_error,
                      take_kernel_input_error)
from ._extension import build_info
from ._files import write_text_atomic
from ._version import __version__, source_revision
from .data import Dataset, synthetic_dataset
from .eval import evaluate
from .csr import CSR
from .known import KnownPositives
from .models import Recommender, build_model
from .objectives import build_objective, embedding_l2

@dataclass
class TrainConfig:
    """Every knob of a run; defaults are the paper's (Adam, lr 1e-3, batch 2048, L2 1e-4, d = 64).

    ``loss_args`` override the chosen objective's ``DEFAULTS`` (see :mod:`pnn_fast.objectives`),
    ``model_args`` the model's RecBole hyper-parameters. ``data_args`` records how the command read
    its data (``format``, ``split``, ``split_seed``, ``rating_threshold``, ``kcore``): ``evaluate``
    and ``recommend`` read it the same way unless told otherwise.
    """

    model: str = "mf"
    loss: str = "pnn"
    dim: int = 64
    epochs: int = 300
    batch_size: int = 2048
    lr: float = 1e-3
    reg_weight: float = 1e-4
    seed: int = 2020
    device: str = "cpu"
    patience: int = 10
    valid_metric: str = "ndcg@20"
    ks: tuple = (10, 20)
    eval_batch_size: int = 1024
    eval_every: int = 1
    sparse: bool = False
    loss_args: dict = field(default_factory=dict)
    model_args: dict = field(default_factory=dict)
    data_args: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("dim", "epochs", "batch_size", "patience", "eval_batch_size", "eval_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_real("lr", self.lr, low_open=True)
        if not isinstance(self.sparse, bool):
            raise ValueError(f"sparse must be True or False, got {self.sparse!r}")
        check_real("reg_weight", self.reg_weight)
        check_seed("seed", self.seed)
        check_cutoffs("ks", self.ks)
        metric, _, k = self.valid_metric.partition("@")
        if metric not in ("recall", "ndcg", "hit", "precision", "mrr") or not k.isdigit() or int(k) == 0:
            raise ValueError(f"valid_metric must look like 'ndcg@20' (a cut-off of at least 1), got {self.valid_metric!r}")
        check_device(self.device)
        self.ks = tuple(sorted({int(x) for x in self.ks} | {int(k)}))


class LeanAdamStep:
    """``zero_grad(set_to_none=True)`` and ``step()`` of a fused, single-group ``torch.optim.Adam``
    (the trainer's), with the same arithmetic and state but less Python per call.

    ``Optimizer.step`` wraps the fused kernel in per-call Python (a profiler range, hooks, lazy
    state initialisation, grouping by device) that took 8% of a BPR-MF step on ML-1M. Once every
    parameter has its state and a gradient, :meth:`step` calls torch's functional Adam
    (``torch.optim.adam.adam``, where ``Adam.step`` itself ends) on the optimizer's own state
    tensors, so ``optimizer.state_dict()`` and checkpoints are unchanged. Otherwise (the first
    step, a parameter without a gradient, an optimizer with other options) it calls
    ``optimizer.step()``.
    """

    def __init__(self, optimizer: torch.optim.Adam):
        self.optimizer = optimizer
        group = optimizer.param_groups[0]
        self.lean = (len(optimizer.param_groups) == 1 and bool(group["fused"]) and not group["amsgrad"]
                     and not group["capturable"] and not group["differentiable"]
                     and not group.get("decoupled_weight_decay", False))

    def zero_grad(self) -> None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self) -> None:
        group = self.optimizer.param_groups[0]
        params = group["params"]
        grads = [p.grad for p in params]
        states = [self.optimizer.state.get(p) for p in params]
        if not self.lean or any(g is None for g in grads) or not all(states):
            self.optimizer.step()
            return
        beta1, beta2 = group["betas"]
        functional_adam(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
                        [s["step"] for s in states], fused=True, amsgrad=False, beta1=beta1, beta2=beta2,
                        lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                        maximize=group["maximize"])


class RowSparseAdam:
    """The optimiser of ``--sparse``: ``torch.optim.SparseAdam`` over the embedding tables, whose
    gradients are sparse COO tensors of the rows a step read, and which updates only those rows and
    their moments (lazy Adam: a row's moments decay only on the steps that read it); the fused Adam
    over every other parameter (the attention's), if any.

    Same interface as :class:`LeanAdamStep` (``zero_grad``, ``step``) plus ``state_dict`` and
    ``load_state_dict`` for checkpoints.
    """

    def __init__(self, tables: list, others: list, lr: float):
        self.tables = torch.optim.SparseAdam(tables, lr=lr)
        self.others = LeanAdamStep(torch.optim.Adam(others, lr=lr, fused=True)) if others else None

    def zero_grad(self) -> None:
        self.tables.zero_grad(set_to_none=True)
        if self.others is not None:
            self.others.zero_grad()

    def step(self) -> None:
        self.tables.step()
        if self.others is not None:
            self.others.step()

    def optimizers(self) -> list:
        """The torch optimizers it steps."""
        return [self.tables] + ([] if self.others is None else [self.others.optimizer])

    def state_dict(self) -> dict:
        return {"tables": self.tables.state_dict(),
                "others": None if self.others is None else self.others.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.tables.load_state_dict(state["tables"])
        if self.others is not None:
            self.others.optimizer.load_state_dict(state["others"])


class BatchStep(nn.Module):
    """One batch's loss: the objective's, the model's auxiliary loss, and the trainer's L2 term.

    A module of its own so that, under ``torchrun``, DistributedDataParallel wraps the whole step
    (model and objective parameters alike) and sees its forward.
    """

    def __init__(self, model: Recommender, objective: nn.Module, reg_weight: float, sparse: bool = False):
        super().__init__()
        self.model, self.objective, self.reg_weight, self.sparse = model, objective, reg_weight, sparse

    def forward(self, users: torch.Tensor, pos: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """users, pos: int64 [B]; a 0-dim loss."""
        # the L2 weight is the trainer's; the objective may fuse the term into its own op
        out = self.objective(self.model, users, pos, generator, reg_weight=self.reg_weight)
        loss = out.loss + self.model.auxiliary_loss(users, pos) if self.model.has_auxiliary_loss else out.loss
        if self.reg_weight == 0 or out.l2_included:  # (RecBole's BPR model has no L2 term)
            return loss
        return loss + self.reg_weight * embedding_l2(self.model, out.users, out.pos_items, out.neg_items,
                                                     sparse=self.sparse)


def build_model_and_objective(config: TrainConfig, known: KnownPositives, train_users: torch.Tensor,
                              train_items: torch.Tensor, device: torch.device) -> tuple[Recommender, nn.Module]:
    """The run's model and objective, their arguments checked (``--sparse`` needs a model that scores
    with its embedding tables themselves)."""
    model = build_model(config.model, known.num_users, known.num_items, train_users, train_items,
                        dim=config.dim, **config.model_args).to(device)
    if config.sparse:
        user_table, item_table = model.embeddings()
        if user_table is not model.user_embedding.weight or item_table is not model.item_embedding.weight:
            raise ValueError(f"--sparse needs a model that scores with its embedding tables (mf); "
                             f"{config.model} computes its tables from the whole graph every step")
    objective = build_objective(config.loss, known, model, sparse=config.sparse, **config.loss_args).to(device)
    return model, objective


#: the small data set on which :func:`check_arguments` builds a run's model and objective
_ARGUMENT_CHECK_DATA = {"num_users": 32, "num_items": 4096, "interactions_per_user": 8, "seed": 0}


def check_arguments(config: TrainConfig) -> None:
    """Refuse a bad model or loss argument before anything trains: builds the config's model and
    objective on a small built-in data set (on the CPU), where the same checks run as in training.
    The study runner checks every cell with it, ``compare`` every loss; what only the real data
    decide (a catalog too small for a setting, say) is still checked when the run loads them."""
    data = synthetic_dataset(**_ARGUMENT_CHECK_DATA)
    known = KnownPositives.from_pairs(*data.train, data.num_users, data.num_items)
    build_model_and_objective(config, known, *data.train, torch.device("cpu"))


class Trainer:
    """Trains ``config.model`` with ``config.loss`` on ``data``; results and checkpoints go to ``out_dir``.

    Under ``torchrun`` (WORLD_SIZE > 1) every rank trains its slice of each global batch of
    ``config.batch_size`` pairs with DistributedDataParallel; the replicas stay identical, every
    rank evaluates the same, and only rank 0 writes files and logs.
    """

    def __init__(self, data: Dataset, config: TrainConfig, out_dir: os.PathLike | str):
        self.data, self.config = data, config
        self.out_dir = Path(out_dir)
        self.rank, self.world_size = distributed.init_from_environment(torch.device(config.device))
        self.device = distributed.device_of_rank(torch.device(config.device))
        for name, value in (("the number of users", data.num_users), ("the number of items", data.num_items),
                            ("the number of training pairs", data.train[0].numel())):
            distributed.require_same_on_every_rank(name, value, self.device)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        train_users, train_items = (t.to(self.device) for t in data.train)
        self.train_users, self.train_items = train_users, train_items
        self.known = KnownPositives.from_pairs(train_users, train_items, data.num_users, data.num_items)
        _check_every_user_has_an_unknown_item(data, self.known)
        # held-out splits as CSR once, so each evaluation only scores and ranks
        self.held_out = {name: CSR.from_pairs(*(t.to(self.device) for t in getattr(data, name)),
                                              data.num_users, data.num_items)
                         for name in ("valid", "test") if getattr(data, name)[0].numel()}
        if config.sparse and self.world_size > 1:
            raise ValueError("--sparse runs in one process; under torchrun, train without it")
        self.model, self.objective = build_model_and_objective(config, self.known, train_users, train_items,
                                                               self.device)
        self.step = BatchStep(self.model, self.objective, config.reg_weight, config.sparse)
        if self.world_size > 1:  # rank 0's initial parameters are broadcast to every replica
            self.step = DistributedDataParallel(self.step, device_ids=[self.device] if self.device.type == "cuda"
                                                else None)
        params = list(self.model.parameters()) + list(self.objective.parameters())
        if config.sparse:
            tables = [self.model.user_embedding.weight, self.model.item_embedding.weight]
            others = [p for p in params if all(p is not t for t in tables)]
            self.optimizer = self.adam = RowSparseAdam(tables, others, config.lr)
        else:
            # the fused (multi-tensor, one kernel) Adam: the same update as the default one, several
            # times cheaper on the full embedding tables that every step updates
            fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
            self.optimizer = torch.optim.Adam(params, lr=config.lr, fused=fused)
            self.adam = LeanAdamStep(self.optimizer)
        self.history: list[dict] = []
        self.source = source_revision()  # recorded with each epoch this process trains
        self.fingerprint = data.fingerprint()  # stored in checkpoints: resume refuses other data
        self.best = {"epoch": -1, "score": -math.inf, "state": None}
        self.epoch = 0

    # ---- one epoch ------------------------------------------------------------------
    def _batch_loss(self, users: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.step(users, pos, self.generator)

    def _diverged(self, batch: int, batches: int, terms: list) -> "TrainingDiverged":
        where = f"epoch {self.epoch + 1}" + (f", batch {batch + 1} of {batches}" if batch >= 0 else "")
        named = f" (non-finite terms: {', '.join(terms)})" if terms else ""
        kept = (f"the last finite epoch is {self.epoch} (its checkpoint is kept)" if self.epoch > 0
                else "no epoch finished, so there is no checkpoint")
        return TrainingDiverged(f"training diverged: the loss of {where} is not finite{named}; {kept}")

    def train_epoch(self, progress: bool = True) -> float:
        self.model.train()
        self.objective.train()
        if self.world_size > 1:
            # each rank draws its own negatives for its own rows: a stream per (seed, rank, epoch),
            # so that a resumed run draws what an uninterrupted one would
            self.generator.manual_seed(self.config.seed + 1_000_003 * self.rank + 7_919 * self.epoch)
        self.model.on_epoch_start(self.generator)
        self.objective.on_epoch_start(self.model, self.generator, self.epoch)
        self._apply_learning_rate()
        n = self.train_users.numel()
        # every rank must walk the same global batches: rank 0's shuffle is everyone's
        order = distributed.broadcast_from_first(torch.randperm(n, generator=self.generator, device=self.device))
        # shuffled once per epoch (two gathers), so that each batch is a pair of views
        users, items = self.train_users[order], self.train_items[order]
        total = torch.zeros((), device=self.device)
        size = self.config.batch_size
        batches = (n + size - 1) // size
        # A non-finite loss stops the epoch at once where checking costs nothing (one process on the
        # CPU), before its step spoils the weights, and names the terms by replaying the batch. Elsewhere
        # a check would sync every step: the first bad batch is kept on the device and read at the end.
        check_each = self.device.type == "cpu" and self.world_size == 1
        first_bad = torch.full((), -1, dtype=torch.long, device=self.device)
        for batch, start in enumerate(tqdm(range(0, n, size), desc=f"epoch {self.epoch + 1}", leave=False,
                                           disable=not progress or self.rank != 0, unit="batch")):
            lo, hi = distributed.shard(start, min(start + size, n))
            draws = self.generator.get_state() if check_each else None
            loss = self._batch_loss(users[lo:hi], items[lo:hi])
            if check_each and not torch.isfinite(loss):
                self.generator.set_state(draws)
                raise self._diverged(batch, batches, self.objective.nonfinite_terms(
                    self.model, users[lo:hi], items[lo:hi], self.generator))
            if not check_each:
                first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss.detach()), batch, first_bad)
            self.adam.zero_grad()
            loss.backward()
            self.adam.step()
            self.objective.after_step(self.model)
            total.add_(loss.detach(), alpha=hi - lo)
        # the epoch's only host sync: its loss, with the ops' deferred input errors (none with the
        # trainer's own ids, which are valid by construction: a bug if it ever fires)
        pending = take_kernel_input_error(self.device)
        summed = distributed.sum_over_ranks(total).double().reshape(1)
        read = torch.cat([summed, pending.double()] if pending is not None else [summed]).tolist()
        if pending is not None:
            raise_kernel_input_error(*read[1:])
        mean = read[0] / n
        if not math.isfinite(mean):
            raise self._diverged(int(first_bad), batches, [])
        return mean

    def _apply_learning_rate(self) -> None:
        """This epoch's learning rate, the run's times the objective's factor; where the factor changes,
        Adam's moments start afresh (a function of the epoch, so a resumed run does the same)."""
        factor = self.objective.learning_rate_factor(self.epoch)
        restart = self.epoch > 0 and factor != self.objective.learning_rate_factor(self.epoch - 1)
        optimizers = self.optimizer.optimizers() if isinstance(self.optimizer, RowSparseAdam) else [self.optimizer]
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = self.config.lr * factor
            if restart:
                optimizer.state.clear()

    # ---- evaluation ----------------------------------------------------------------
    def scoring_tables(self) -> tuple:
        """(user_table, item_table) whose dot products rank items: the model's embeddings, or the
        objective's own tables where the method scores differently (SimpleX's user tower)."""
        hook = getattr(self.objective, "scoring_tables", None)
        return hook(self.model) if hook is not None else self.model.embeddings()

    def snapshot(self) -> dict:
        """A detached copy of everything that scores: the model's and the objective's state."""
        return {name: {k: v.detach().clone() for k, v in module.state_dict().items()}
                for name, module in (("model", self.model), ("objective", self.objective))}

    def restore(self, snapshot: dict) -> None:
        self.model.load_state_dict(snapshot["model"])
        self.objective.load_state_dict(snapshot["objective"])

    @torch.no_grad()
    def evaluate_split(self, split: str) -> dict:
        self.model.eval()
        self.objective.eval()
        user_table, item_table = self.scoring_tables()
        exclude = [self.known] + ([self.held_out["valid"]] if split == "test" and "valid" in self.held_out else [])
        return evaluate(user_table, item_table, self.held_out[split], exclude, ks=self.config.ks,
                        batch_size=self.config.eval_batch_size)

    # ---- checkpoints ---------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {
            "config": asdict(self.config), "fingerprint": self.fingerprint, "epoch": self.epoch,
            "history": self.history, "best": self.best,
            "model": self.model.state_dict(), "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
        }
        tmp = self.checkpoint_path.with_suffix(".tmp")
        try:
            torch.save(state, tmp)
            os.replace(tmp, self.checkpoint_path)  # atomic: a crash never leaves a half-written checkpoint
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a full disk as a RuntimeError
            tmp.unlink(missing_ok=True)
            kept = ("the previous checkpoint there is intact" if self.checkpoint_path.exists()
                    else "there is no earlier checkpoint")
            reason = err.strerror if isinstance(err, OSError) and err.strerror else " ".join(str(err).split())
            raise CheckpointWriteError(f"could not write the checkpoint {self.checkpoint_path} after epoch "
                                       f"{self.epoch}: {reason}; {kept}") from None

    def load_checkpoint(self) -> None:
        state = read_checkpoint(self.checkpoint_path, self.device)
        check_fingerprint(state, self.fingerprint, f"--resume: the checkpoint {self.checkpoint_path}")
        saved = {k: v for k, v in state["config"].items() if k not in ("epochs", "patience", "device")}
        current = {k: v for k, v in asdict(self.config).items() if k in saved}
        changed = sorted(k for k in saved if json.dumps(saved[k], default=str) != json.dumps(current[k], default=str))
        if changed:
            raise ValueError(f"--resume: the checkpoint was made with other settings: {changed}")
        self.model.load_state_dict(state["model"])
        self.objective.load_state_dict(state["objective"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["cpu_rng"])
        if state["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.epoch, self.history, self.best = state["epoch"], state["history"], state["best"]

    # ---- the run -------------------------------------------------------------------
    def fit(self, *, resume: bool = False, overwrite: bool = False, progress: bool = True, log=print) -> dict:
        """Train until ``config.epochs`` or early stopping; returns the results dict (also written to disk).

        The output folder is locked for the run (``flock``, which a killed process releases): a second
        run into it is refused. A folder that holds a run (its checkpoint or results) is continued with
        ``resume``, replaced with ``overwrite``, and otherwise refused, never silently overwritten.
        """
        if resume and overwrite:
            raise ValueError(f"--resume continues the run in {self.out_dir} and --overwrite replaces it; give one")
        lock = None
        if self.rank == 0:  # every rank trains and evaluates alike; one of them writes and logs
            _check_writable(self.out_dir)  # before any training, not at the first checkpoint
            lock = _lock_folder(self.out_dir)
        try:
            held = [name for name in ("checkpoint.pt", "results.json") if (self.out_dir / name).exists()]
            if held and not resume and not overwrite and self.rank == 0:
                raise ValueError(f"--out {self.out_dir} holds a run ({', '.join(held)}): continue it with --resume, "
                                 f"or replace it with --overwrite")
            return self._fit(resume, progress, log)
        finally:
            if lock is not None:
                lock.close()

    def _fit(self, resume: bool, progress: bool, log) -> dict:
        writes = self.rank == 0
        if not writes:
            def log(*_):
                return None
        if resume:
            if not self.checkpoint_path.exists():
                raise FileNotFoundError(f"--resume: no checkpoint at {self.checkpoint_path}")
            self.load_checkpoint()
            log(f"resumed from {self.checkpoint_path} after epoch {self.epoch}")
        cfg = self.config
        # stop at the (patience + 1)-th validation without improvement: RecBole's stopping_step with eval_step
        while self.epoch < cfg.epochs and self.epoch - max(self.best["epoch"], 0) < (cfg.patience + 1) * cfg.eval_every:
            start = time.perf_counter()
            try:
                loss = self.train_epoch(progress)
            except KeyboardInterrupt:  # Ctrl-C: the epoch in progress is abandoned, the last one is on disk
                kept = (f"the checkpoint of epoch {self.epoch} is kept: rerun the same command with --resume"
                        if self.epoch > 0 and writes else "no epoch had finished: rerun the same command")
                raise TrainingInterrupted(f"interrupted in epoch {self.epoch + 1}; {kept}") from None
            except TrainingDiverged as err:  # the checkpoint on disk is still the last finite epoch's
                if writes:
                    record = {**self.results({}), "status": "diverged", "error": str(err),
                              "last_finite_epoch": self.epoch}
                    write_text_atomic(self.out_dir / "results.json", strict_json(record))
                raise
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            validates = "valid" in self.held_out and ((self.epoch + 1) % cfg.eval_every == 0 or self.epoch + 1 == cfg.epochs)
            valid = self.evaluate_split("valid") if validates else {}
            self.epoch += 1
            score = valid.get(cfg.valid_metric, -loss)  # no validation split: lowest training loss
            if (validates or "valid" not in self.held_out) and score > self.best["score"]:
                self.best = {"epoch": self.epoch, "score": score, "state": self.snapshot()}
            self.history.append({"epoch": self.epoch, "loss": loss, "train_seconds": seconds, "valid": valid,
                                 "source": self.source})
            shown = " ".join(f"{k}={v:.4f}" for k, v in valid.items() if k.endswith(f"@{max(cfg.ks)}"))
            log(f"epoch {self.epoch:3d}  loss {loss:.4f}  {seconds:.2f}s  {shown}")
            if writes:
                self.save_checkpoint()
        self.restore(self.best["state"])
        test = self.evaluate_split("test") if "test" in self.held_out else {}
        results = self.results(test)
        if writes:
            write_text_atomic(self.out_dir / "results.json", strict_json(results))
            try:
                plot_curves(self.history, cfg.valid_metric, self.out_dir / "curves.png")
            except OSError as err:  # a full disk: what matters is written already
                log(f"pnn-fast: warning: could not write {self.out_dir / 'curves.png'} ({err.strerror or err}); "
                    f"results.json and the checkpoint are intact")
        # without a validation split the best epoch is the one of lowest training loss: never a metric
        chosen = (f"{cfg.valid_metric} {self.best['score']:.4f}" if "valid" in self.held_out
                  else f"lowest training loss {-self.best['score']:.4f}; no validation split")
        tested = ("test " + " ".join(f"{k}={v:.4f}" for k, v in test.items()) if test
                  else "no test split: no test metrics")
        log(f"best epoch {self.best['epoch']} ({chosen}); {tested}")
        return results

    def results(self, test: dict) -> dict:
        return {
            "config": asdict(self.config), "dataset": self.data.summary(), "fingerprint": self.fingerprint,
            "versions": {"pnn_fast": __version__, "torch": torch.__version__, "python": sys.version.split()[0],
                         "platform": platform.platform(), "build": build_info(),
                         # every revision that trained an epoch of this run (resumed runs may have several);
                         # None: not a git checkout, or an epoch from before revisions were recorded
                         "source": list(dict.fromkeys(h.get("source") for h in self.history))},
            "world_size": self.world_size,
            "epochs": self.history, "best_epoch": self.best["epoch"],
            # None without a validation split, where the best epoch is the one of lowest training loss
            "best_valid": self.best["score"] if "valid" in self.held_out else None,
            "test": test,
            "mean_epoch_seconds": sum(h["train_seconds"] for h in self.history) / max(len(self.history), 1),
        }


class TrainingDiverged(RuntimeError):
    """A non-finite training loss; the message names the epoch, the batch and, where known, the terms."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training; the message says which checkpoint is kept and how to resume."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, say); the previous one is left intact."""


def strict_json(record: dict) -> str:
    """``record`` as strict JSON (indented): a non-finite float (the -inf best score of a run that
    never validated, a NaN loss) becomes null, which every JSON reader accepts."""
    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        return value
    return json.dumps(finite(record), indent=2, allow_nan=False)


def _check_every_user_has_an_unknown_item(data: Dataset, known: KnownPositives) -> None:
    """A user who holds every item leaves no negative to draw and nothing to rank: one line naming
    the user (in the data's ids) and the data, where the sampler's kernel named neither."""
    counts = known.row_lengths(torch.arange(data.num_users, device=known.indptr.device))
    full = (counts >= data.num_items).nonzero()
    if full.numel():
        row = int(full[0])
        name = data.user_ids[row] if data.user_ids is not None else row
        raise ValueError(f"{data.name}: user {name!r} holds all {data.num_items:,} items in the training split, so no "
                         f"item is left to sample as a negative or to rank; drop that user")


def _lock_folder(folder: Path):
    """An exclusive ``flock`` on ``folder/.lock``, held while the returned file is open (a killed
    process's is released by the kernel); a folder another run holds is a ValueError of one line."""
    handle = open(folder / ".lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ValueError(f"--out {folder} is in use by another run; wait for it, or give another --out") from None
    return handle


def _check_writable(folder: Path) -> None:
    """Creates ``folder`` and writes a file there, or fails in one line naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"output folder {folder}: cannot write there ({err.strerror or err})") from None


def plot_curves(history: list, metric: str, path: Path) -> None:
    """Training loss and the validation metric per epoch, as a PNG."""
    import matplotlib  # here, not at the top: matplotlib takes a second to import and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, [h["loss"] for h in history], marker=".")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    validated = [h for h in history if metric in h["valid"]]  # every eval_every-th epoch
    ax_metric.plot([h["epoch"] for h in validated], [h["valid"][metric] for h in validated], marker=".", color="C1")
    ax_metric.set(xlabel="epoch", ylabel=metric, title=f"validation {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: what every checkpoint written by :meth:`Trainer.save_checkpoint` holds
CHECKPOINT_KEYS = ("config", "epoch", "history", "best", "model", "objective", "optimizer")


def read_checkpoint(path: os.PathLike | str, device="cpu") -> dict:
    """A checkpoint written by :meth:`Trainer.save_checkpoint`, loaded onto ``device``.

    Loaded with ``torch.load(weights_only=True)``: tensors and plain data only, so a checkpoint from
    someone else cannot run code. Anything else (a folder, a file that is not a checkpoint, one that
    carries pickled objects) is a ValueError of one line naming the file.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a folder; give the checkpoint.pt inside it")
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint: {path}")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if found:  # what weights_only refuses: objects beyond tensors and plain data
            raise ValueError(f"checkpoint {path} was refused: it holds a Python object ({found.group(1)}) that "
                             f"loading would construct, so it could run code") from None
        raise ValueError(f"checkpoint {path} is not a checkpoint written by pnn-fast train (unreadable)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise ValueError(f"checkpoint {path} is not a checkpoint written by pnn-fast train ({reason})") from None
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise ValueError(f"checkpoint {path} is not a checkpoint written by pnn-fast train (it lacks "
                         f"{[key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]})")
    return state


def check_fingerprint(state: dict, fingerprint: dict, what: str) -> None:
    """That a checkpoint was trained on the data and split of ``fingerprint`` (:meth:`Dataset.fingerprint`),
    else a ValueError of one line starting with ``what``; a checkpoint from before fingerprints is
    adopted with a one-line warning."""
    saved = state.get("fingerprint")
    if saved is None:
        print(f"pnn-fast: warning: {what} predates data fingerprints: its data and split are not checked",
              file=sys.stderr)
        return
    if saved["data"] != fingerprint["data"]:
        raise ValueError(f"{what} was trained on other data (data fingerprint {saved['data']}, the data given "
                         f"{fingerprint['data']}); pass the --data (and --rating-threshold, --kcore) it was trained with")
    if saved["split"] != fingerprint["split"]:
        raise ValueError(f"{what} was trained on another split of this data (split fingerprint {saved['split']}, "
                         f"the split given {fingerprint['split']}); pass the --split and --split-seed it was trained with")


def load_config(d: dict, **overrides) -> TrainConfig:
    """A TrainConfig from a saved dict (e.g. a checkpoint's), with ``overrides`` applied."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in {**d, **overrides}.items() if k in known})


def run(data: Dataset, config: TrainConfig, out_dir, *, resume: bool = False, overwrite: bool = False,
        progress: bool = True, log=print) -> dict:
    """Train and test one configuration; the programmatic twin of ``pnn-fast train``."""
    return Trainer(data, config, out_dir).fit(resume=resume, overwrite=overwrite, progress=progress, log=log)


__all__ = ["TrainConfig", "Trainer", "TrainingDiverged", "TrainingInterrupted", "CheckpointWriteError", "run",
           "embedding_l2", "plot_curves", "load_config", "read_checkpoint", "check_fingerprint"]
