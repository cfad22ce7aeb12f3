"""``pnn-fast study PLAN``: a grid of experiments from a TOML plan, run resumably and in parallel,
summarised with paired statistics.

A *cell* is one dataset x model x config x seed, trained by :func:`pnn_fast.train.run`. The data
split never depends on the seed (it keeps the loaders' own seed), so the seeds of two configs are
paired: the same split and the same initial draws, which is what the paired t-tests rely on.

Plan::

    [study]
    name = "table2"                 # required; results go to studies/<name>/ unless --out is given
    seeds = [1, 2, 3, 4, 5]         # required; the training seeds of every cell
    baselines = ["bpr", "dns"]      # configs the others are compared with (the default; absent ones skipped)
    holm = ["sl-pool", "simplex"]   # optional: a family of configs tested against each baseline, whose
                                    # p-values are also given adjusted for their number (Holm)
    epochs = 300                    # TrainConfig fields applied to every cell (see below)
    patience = 10

    [[datasets]]                    # one or more
    name = "ml-1m"                  # required in every [[...]] entry: letters, digits, '-' and '_'
    path = "../shared/data/ml-1m"   # required; relative to the current directory; "synthetic": built-in data
    split = "rs"                    # optional: format, split, rating_threshold, kcore, hide_train_share
                                    # (see load_dataset)

    [[models]]                      # one or more
    name = "lightgcn-3"
    model = "lightgcn"              # default: the entry's name
    model_args = { n_layers = 3 }   # optional: the model's hyper-parameters

    [[configs]]                     # one or more
    name = "dns"
    loss = "dns"                    # default: the entry's name
    loss_args = { candidates = 8 }  # optional: the loss's hyper-parameters
    seeds = [1, 2]                  # optional: e.g. fewer seeds for an expensive config

Every table may set ``seeds`` and any TrainConfig field but those a cell sets itself (model, loss,
seed, model_args, loss_args): dim, epochs, batch_size, lr, reg_weight, device, patience,
valid_metric, ks, eval_batch_size, eval_every. For a cell the most specific table wins: config > model >
dataset > study. :func:`load_plan` checks the whole plan before anything trains; every error names
the plan file and the key, e.g. ``studies/x.toml: configs[2].loss_args.candidatez: ...``.

Output folder::

    cells/<dataset>/<model>/<config>/seed<N>/results.json  + checkpoint.pt, curves.png (error.txt: failed)
    summary.md, summary.json                                   the statistics of the finished cells
    plots/<dataset>.<model>.png                                mean test NDCG@20 per config, std error bars

A cell with a results.json is finished and skipped; one with only a checkpoint.pt resumes from it.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import typing
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ._files import write_text_atomic
from .data import Dataset, load_dataset, synthetic_dataset
from .data.loaders import FORMATS, SPLITS
from .models import MODELS
from .objectives import OBJECTIVES
from .train import TrainConfig, check_arguments, run

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI, before Python 3.11
    import tomli as tomllib

SYNTHETIC = "synthetic"
SUMMARY_METRICS = ("recall@20", "ndcg@20")
PLOTTED_METRIC = "ndcg@20"
DEFAULT_BASELINES = ("bpr", "dns")
RESULTS_FILE, CHECKPOINT_FILE, ERROR_FILE = "results.json", "checkpoint.pt", "error.txt"

# Names become folder and file names; without '.', "<dataset>.<model>.png" is unambiguous.
_NAME = re.compile(r"[A-Za-z0-9_-]+")
# TrainConfig fields that each cell sets itself; every other field may be set by any table.
_CELL_FIELDS = {"model", "loss", "seed", "model_args", "loss_args", "data_args"}  # (data_args: the dataset's table)
_OVERRIDE_KINDS = {f.name: list[int] if isinstance(f.default, tuple) else type(f.default)
                   for f in dataclasses.fields(TrainConfig) if f.name not in _CELL_FIELDS}
_COMMON_KEYS = {"seeds": list[int], **_OVERRIDE_KINDS}
_SECTION_KEYS = {
    "study": {"name": str, "baselines": list[str], "holm": list[str]},
    "datasets": {"name": str, "path": str, "format": str, "split": str, "rating_threshold": float, "kcore": int,
                 "hide_train_share": float},
    "models": {"name": str, "model": str, "model_args": dict},
    "configs": {"name": str, "loss": str, "loss_args": dict},
}
_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table",
               list[int]: "an array of integers", list[str]: "an array of strings"}


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset comes from: ``path`` is absolute, or "synthetic" (the built-in data)."""

    name: str
    path: str
    format: str = "auto"
    split: str = "auto"
    rating_threshold: float | None = None
    kcore: int = 0
    hide_train_share: float = 0.0

    def load(self) -> Dataset:
        if self.path == SYNTHETIC:
            return synthetic_dataset()
        return load_dataset(self.path, format=self.format, split=self.split, rating_threshold=self.rating_threshold,
                            kcore=self.kcore, hide_train_share=self.hide_train_share)


@dataclass(frozen=True)
class Cell:
    """One run of the grid: the entry names that place it, its data and its TrainConfig (seed included)."""

    dataset: DatasetSpec
    model: str
    config: str
    train_config: TrainConfig

    @property
    def seed(self) -> int:
        return self.train_config.seed

    @property
    def key(self) -> str:
        """``dataset/model/config/seedN``: the cell's folder under ``cells/``, and what --only matches."""
        return f"{self.dataset.name}/{self.model}/{self.config}/seed{self.seed}"

    def folder(self, out: Path) -> Path:
        return Path(out) / "cells" / self.key


@dataclass(frozen=True)
class Plan:
    """A checked plan. ``groups`` maps (dataset, model, config) names, in plan order, to their cells (one per seed)."""

    path: Path
    name: str
    seeds: tuple[int, ...]  # the study's; a table may set fewer or others for its cells
    baselines: tuple[str, ...]
    configs: tuple[str, ...]
    groups: dict[tuple[str, str, str], tuple[Cell, ...]]
    holm: tuple[str, ...] = ()  # the configs whose p-values against a baseline are corrected together

    @property
    def cells(self) -> list[Cell]:
        return [cell for cells in self.groups.values() for cell in cells]

    @property
    def default_out(self) -> Path:
        return Path("studies") / self.name


# ---- reading and checking a plan ----------------------------------------------------------
def _has_kind(value, kind) -> bool:
    """Whether a TOML value is of ``kind`` (int, float, str, dict, list[int], list[str]); an integer is a float too."""
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return isinstance(value, list) and all(_has_kind(v, item) for v in value)
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


class _PlanReader:
    """Checks one parsed plan; every error names the plan file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, where: str, message, kind=ValueError) -> Exception:
        return kind(f"{self.path}: {where}: {message}")

    def table(self, where: str, table, section: str) -> dict:
        """``table`` (an entry of ``section``) with its keys, their value types, its name and seeds checked."""
        if not isinstance(table, dict):
            raise self.error(where, "expected a table")
        allowed = {**_SECTION_KEYS[section], **_COMMON_KEYS}
        for key, value in table.items():
            if key not in allowed:
                raise self.error(f"{where}.{key}", f"unknown key; valid: {', '.join(sorted(allowed))}")
            if not _has_kind(value, allowed[key]):
                raise self.error(f"{where}.{key}", f"expected {_KIND_NAMES[allowed[key]]}, got {value!r}")
        if "name" not in table:
            raise self.error(f"{where}.name", "missing")
        if not _NAME.fullmatch(table["name"]):
            raise self.error(f"{where}.name", f"{table['name']!r}: use letters, digits, '-' and '_' only")
        if "seeds" in table and (not table["seeds"] or len(set(table["seeds"])) < len(table["seeds"])):
            raise self.error(f"{where}.seeds", f"expected distinct seeds, at least one, got {table['seeds']}")
        return table

    def overrides(self, where: str, table: dict) -> dict:
        """The TrainConfig fields ``table`` sets, checked by building a TrainConfig from them alone."""
        fields = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in table.items() if key in _OVERRIDE_KINDS}
        try:
            TrainConfig(**fields)
        except ValueError as err:
            raise self.error(where, err) from None
        return fields

    def entries(self, plan: dict, section: str) -> list[dict]:
        """The ``[[section]]`` entries, each checked, names distinct."""
        entries = plan.get(section)
        if not isinstance(entries, list) or not entries:
            raise self.error(section, f"expected one or more [[{section}]] entries")
        seen = {}
        for i, entry in enumerate(entries):
            self.table(f"{section}[{i}]", entry, section)
            if entry["name"] in seen:
                raise self.error(f"{section}[{i}].name", f"{entry['name']!r} is also {section}[{seen[entry['name']]}]")
            seen[entry["name"]] = i
        return entries

    def registered(self, where: str, entry: dict, key: str, registry: dict, args_key: str) -> str:
        """``entry[key]`` (default: its name) checked against ``registry``, and the keys of ``entry[args_key]``
        against that class's DEFAULTS."""
        name = entry.get(key, entry["name"])
        if name.lower() not in registry:
            raise self.error(f"{where}.{key if key in entry else 'name'}",
                             f"unknown {key} {name!r}; choose one of {sorted(registry)}")
        valid = registry[name.lower()].DEFAULTS
        for arg in entry.get(args_key, {}):
            if arg not in valid:
                raise self.error(f"{where}.{args_key}.{arg}", f"{key} {name!r} has no such argument; "
                                 f"valid: {sorted(valid)}")
        return name.lower()

    def dataset(self, where: str, entry: dict) -> DatasetSpec:
        if "path" not in entry:
            raise self.error(f"{where}.path", "missing")
        options = {key: entry[key] for key in ("format", "split", "rating_threshold", "kcore", "hide_train_share")
                   if key in entry}
        if entry["path"] == SYNTHETIC:
            if options:
                raise self.error(f"{where}.{next(iter(options))}",
                                 "the built-in synthetic data takes no loading options")
            return DatasetSpec(entry["name"], SYNTHETIC)
        path = Path(entry["path"]).expanduser()
        if not path.exists():
            raise self.error(f"{where}.path", f"no such file or folder: {entry['path']!r} "
                             f"(relative to the current directory, {Path.cwd()})", FileNotFoundError)
        for key, choices in (("format", FORMATS), ("split", SPLITS)):
            if options.get(key, "auto") not in choices:
                raise self.error(f"{where}.{key}", f"choose one of {list(choices)}, got {options[key]!r}")
        if options.get("kcore", 0) < 0:
            raise self.error(f"{where}.kcore", f"expected an integer >= 0, got {options['kcore']}")
        if not 0 <= options.get("hide_train_share", 0) < 1:
            raise self.error(f"{where}.hide_train_share", f"expected a number in [0, 1), got {options['hide_train_share']}")
        return DatasetSpec(entry["name"], str(path.resolve()), **options)

    def read(self, plan: dict) -> Plan:
        for section in plan:
            if section not in _SECTION_KEYS:
                raise self.error(section, f"unknown table; valid: {', '.join(_SECTION_KEYS)}")
        if "study" not in plan:
            raise self.error("study", "missing: a [study] table with name and seeds")
        study = self.table("study", plan["study"], "study")
        if "seeds" not in study:
            raise self.error("study.seeds", "missing")
        datasets, models, configs = (self.entries(plan, section) for section in ("datasets", "models", "configs"))
        dataset_specs = [self.dataset(f"datasets[{i}]", entry) for i, entry in enumerate(datasets)]
        model_types = [self.registered(f"models[{i}]", entry, "model", MODELS, "model_args")
                       for i, entry in enumerate(models)]
        losses = [self.registered(f"configs[{i}]", entry, "loss", OBJECTIVES, "loss_args")
                  for i, entry in enumerate(configs)]
        located = [("study", study)] + [(f"{section}[{i}]", entry) for section, entries in
                                        (("datasets", datasets), ("models", models), ("configs", configs))
                                        for i, entry in enumerate(entries)]
        overrides = {where: self.overrides(where, table) for where, table in located}
        groups, checked = {}, set()
        for (d, dataset), (m, model), (c, config) in product(*map(enumerate, (datasets, models, configs))):
            # the most specific table wins: config > model > dataset > study
            tables = [("study", study), (f"datasets[{d}]", dataset), (f"models[{m}]", model), (f"configs[{c}]", config)]
            fields = {key: value for where, _ in tables for key, value in overrides[where].items()}
            seeds = next(table["seeds"] for _, table in reversed(tables) if "seeds" in table)
            where = f"{dataset['name']}/{model['name']}/{config['name']}"
            try:
                base = TrainConfig(model=model_types[m], loss=losses[c], model_args=dict(model.get("model_args", {})),
                                   loss_args=dict(config.get("loss_args", {})), **fields)
            except ValueError as err:
                raise self.error(where, err) from None
            if not {int(metric.partition("@")[2]) for metric in SUMMARY_METRICS} <= set(base.ks):
                raise self.error(where, f"ks must include the summary's k (metrics {SUMMARY_METRICS}), got {base.ks}")
            if (m, c) not in checked:  # the arguments' values, on small data: the dataset does not change them
                try:
                    check_arguments(base)
                except (ValueError, TypeError) as err:
                    raise self.error(where, err) from None
                checked.add((m, c))
            groups[dataset["name"], model["name"], config["name"]] = tuple(
                Cell(dataset_specs[d], model["name"], config["name"], dataclasses.replace(base, seed=seed))
                for seed in seeds)
        names = tuple(entry["name"] for entry in configs)
        # the default baselines are skipped where absent; one the plan names must be one of its configs
        for key in ("baselines", "holm"):
            missing = [name for name in study.get(key, []) if name not in names]
            if missing:
                raise self.error(f"study.{key}", f"{missing} name no config; configs: {', '.join(names)}")
        return Plan(self.path, study["name"], tuple(study["seeds"]), tuple(study.get("baselines", DEFAULT_BASELINES)),
                    names, groups, tuple(study.get("holm", ())))


def load_plan(path: os.PathLike | str) -> Plan:
    """Read and check a TOML plan (format: this module's docstring).

    Raises:
        FileNotFoundError: the plan, or a dataset path, does not exist.
        ValueError: anything else wrong; the message names the plan file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such plan file")
    try:
        parsed = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    return _PlanReader(path).read(parsed)


# ---- training the cells -----------------------------------------------------------------
_loaded_datasets: dict[DatasetSpec, Dataset] = {}  # a worker's datasets, each loaded once


def _start_worker(threads: int) -> None:
    """Initialiser of a worker process, before any cell."""
    # torch's OpenMP pool is already up (importing this module imported torch): set_num_threads sizes
    # it; the variable covers whatever starts threads later
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    # Ctrl-C ends the worker at once; by default it would report a KeyboardInterrupt and take the next cell
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # tqdm's default lock spans processes: a named semaphore, which a terminated worker never unlinks,
    # so the resource tracker warns of a leak at the study's end. Only one worker ever draws bars.
    tqdm.set_lock(threading.RLock())


def _run_cell(cell: Cell, out: Path, show_bars: bool) -> str | None:
    """Train a cell, or resume it from its checkpoint; returns None, or its error in one line (also in error.txt)."""
    folder = cell.folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ERROR_FILE).unlink(missing_ok=True)
    try:
        if cell.dataset not in _loaded_datasets:
            _loaded_datasets[cell.dataset] = cell.dataset.load()
        run(_loaded_datasets[cell.dataset], cell.train_config, folder, resume=(folder / CHECKPOINT_FILE).exists(),
            progress=show_bars, log=lambda line: print(f"{cell.key}  {line}", flush=True))
    except Exception as err:  # noqa: BLE001 - a failure is the cell's own; the other cells go on
        message = " ".join(f"{type(err).__name__}: {err}".split())
        write_text_atomic(folder / ERROR_FILE, message + "\n")
        return message
    return None


def _train_cells(cells: list[Cell], out: Path, jobs: int, threads: int, show_bars: bool, log) -> dict[str, str]:
    """Trains ``cells`` in ``jobs`` spawned worker processes; returns {cell key: error} of those that failed."""
    pool = ProcessPoolExecutor(min(jobs, len(cells)), mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(threads,))
    failed = {}
    try:
        futures = {pool.submit(_run_cell, cell, out, show_bars): cell for cell in cells}
        for done, future in enumerate(as_completed(futures), 1):
            cell, error = futures[future], future.result()
            if error is not None:
                failed[cell.key] = error
            log(f"[{done}/{len(cells)}] {cell.key}: " + ("finished" if error is None else f"FAILED: {error}"))
    except BaseException:
        # Ctrl-C (or a worker killed): stop the running cells now, which loses at most each one's
        # epoch in progress, instead of waiting for them; start no other
        for process in list((pool._processes or {}).values()):  # public from Python 3.14: terminate_workers()
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return failed


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # a BaseException: _train_cells terminates its workers on the way out


def run_study(plan: Plan, out: os.PathLike | str | None = None, *, jobs: int = 1, threads: int | None = None,
              only: str | None = None, progress: bool = True, log=print) -> dict:
    """Train the plan's unfinished cells, then write the summary (also when interrupted) and return it.

    Args:
        out: the output folder; default ``plan.default_out`` (studies/<name>).
        jobs: cells trained at once, each in its own spawned process.
        threads: torch threads per job; default the CPU count divided by ``jobs``. Results are
            bit-identical on CPU for a given thread count, whatever ``jobs``.
        only: a glob over cell keys (``dataset/model/config/seedN``): train only those.
        progress: per-batch progress bars (with one job only: bars of several would interleave).
    Raises:
        RuntimeError: after the summary, when cells failed (their errors are in it).
    """
    if jobs < 1 or (threads is not None and threads < 1):
        raise ValueError(f"jobs and threads must be >= 1, got {jobs} and {threads}")
    out = Path(out or plan.default_out)
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    selected = [cell for cell in plan.cells if only is None or fnmatch.fnmatchcase(cell.key, only)]
    if not selected:
        raise ValueError(f"--only {only!r} matches no cell; cell names look like {plan.cells[0].key}")
    # the cells finished before must have been trained on the plan's data, before any more train
    _check_fingerprints(plan, out, _finished_runs(plan, out)[0])
    # a diverged cell has a results.json too (saying so): it would diverge again, so it is not retried
    pending = [cell for cell in selected if not (cell.folder(out) / RESULTS_FILE).exists()]
    log(f"study {plan.name}: {len(selected)} cells, {len(selected) - len(pending)} finished before, "
        f"{len(pending)} to train ({jobs} jobs x {threads} threads); output in {out}")
    # a `kill` (SIGTERM) must stop the workers as Ctrl-C does, not leave them training as orphans
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        failed = _train_cells(pending, out, jobs, threads, progress and jobs == 1, log) if pending else {}
    finally:
        signal.signal(signal.SIGTERM, previous)
        # also after Ctrl-C: whatever has finished (the cells trained now are on the plan's data)
        summary = write_summary(plan, out, check=False)
    if failed:
        key, error = next(iter(failed.items()))
        raise RuntimeError(f"{len(failed)} of {len(pending)} cells failed (first: {key}: {error}); "
                           f"see {out / 'summary.md'}")
    return summary


# ---- the summary --------------------------------------------------------------------------
def _mean(values: list) -> float | None:
    return float(np.mean(values)) if values else None


def _std(values: list) -> float | None:
    """The sample standard deviation (ddof=1); None below two values."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _versus(runs: dict, baseline_runs: dict, metric: str) -> dict:
    """A config against a baseline on ``metric``, from {seed: results}: the lift of the mean in %, and over
    the seeds both have finished, the paired lift (the mean paired difference in % of the baseline's mean
    over those seeds: the centre of the interval, and the lift itself when both finished the same seeds),
    the paired two-sided t-test and the 95% confidence interval of the paired lift (t, p and the interval
    None below two pairs). The interval is what says a lift is excluded, such as the 3% issue 14 asks for,
    where p can only say that no difference was found."""
    from scipy.stats import ttest_rel

    mean, baseline_mean = (_mean([r["test"][metric] for r in rs.values()]) for rs in (runs, baseline_runs))
    lift = 100 * (mean - baseline_mean) / baseline_mean if mean is not None and baseline_mean else None
    paired = sorted(set(runs) & set(baseline_runs))
    values, baseline = (np.array([rs[s]["test"][metric] for s in paired]) for rs in (runs, baseline_runs))
    paired_lift = 100 * float((values - baseline).mean() / baseline.mean()) if paired and baseline.mean() else None
    t = p = interval = None
    if len(paired) >= 2:
        with warnings.catch_warnings():  # equal pairs: NaN with a warning; reported as None
            warnings.simplefilter("ignore", RuntimeWarning)
            test = ttest_rel(values, baseline)
            low, high = test.confidence_interval(0.95)
        t, p = _finite(test.statistic), _finite(test.pvalue)
        if baseline.mean() and math.isfinite(low) and math.isfinite(high):
            interval = [100 * float(low) / baseline.mean(), 100 * float(high) / baseline.mean()]
    return {"lift_percent": lift, "paired_lift_percent": paired_lift, "ci95_percent": interval, "t": t, "p": p,
            "p_holm": None, "pairs": len(paired)}


def holm_adjusted(p_values: list[float | None], family_size: int) -> list[float | None]:
    """Holm's step-down adjustment of the p-values of one family of ``family_size`` tests, in the order
    given: in ascending order p_(1) <= p_(2) <= ..., the adjusted p_(i) is the largest of
    min(1, (m - j + 1) p_(j)) over j <= i. A member without a p-value (None: not finished, or fewer
    than two pairs) keeps None and still counts in m, which can only raise the others' adjusted values."""
    if family_size < len(p_values):
        raise ValueError(f"family_size {family_size} is below the {len(p_values)} members given")
    order = sorted((p, at) for at, p in enumerate(p_values) if p is not None)
    adjusted = [None] * len(p_values)
    running = 0.0
    for rank, (p, at) in enumerate(order):
        running = max(running, min(1.0, (family_size - rank) * p))
        adjusted[at] = running
    return adjusted


def _adjust_by_holm(groups: list[dict], plan: Plan) -> None:
    """Fill each comparison's ``p_holm`` for the plan's holm family: per dataset x model, baseline and
    metric, the family is the holm configs other than the baseline (finished or not)."""
    for baseline in plan.baselines:
        for rows in _tables({"groups": groups}).values():
            family = [row for row in rows if row["config"] in plan.holm and baseline in row["vs"]]
            members = [name for name in plan.holm if name != baseline]
            for metric in SUMMARY_METRICS:
                comparisons = [row["vs"][baseline][metric] for row in family]
                for comparison, adjusted in zip(comparisons, holm_adjusted([c["p"] for c in comparisons], len(members))):
                    comparison["p_holm"] = adjusted


def _cell_status(folder: Path) -> dict:
    if (folder / ERROR_FILE).exists():
        return {"status": "failed", "error": (folder / ERROR_FILE).read_text().strip()}
    if (folder / CHECKPOINT_FILE).exists():
        return {"status": "interrupted (resumes from its checkpoint)"}
    return {"status": "not started"}


def _read_results(path: Path) -> dict:
    """A cell's results.json; a ValueError naming the file where it is not JSON (one cut short by a
    crash before these files were written atomically): deleting it makes the study train the cell again."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); delete it to train "
                         f"the cell again") from None


def _finished_runs(plan: Plan, out: os.PathLike | str) -> tuple[dict, list]:
    """({(dataset, model, config): {seed: results}} of the finished cells, [{cell, status, error?}] of the others)."""
    runs = {}  # (dataset, model, config) -> {seed: results}
    unfinished = []
    for group, cells in plan.groups.items():
        runs[group] = {}
        for cell in cells:
            results_file = cell.folder(out) / RESULTS_FILE
            results = _read_results(results_file) if results_file.exists() else None
            if results is not None and results.get("status") == "diverged":
                unfinished.append({"cell": cell.key, "status": "failed", "error": results["error"]})
            elif results is not None:
                runs[group][cell.seed] = results
            else:
                unfinished.append({"cell": cell.key, **_cell_status(cell.folder(out))})
    return runs, unfinished


def _check_fingerprints(plan: Plan, out: os.PathLike | str, runs: dict) -> None:
    """That each finished cell was trained on the data and split its plan entry gives today (the
    fingerprint in its results.json, :meth:`Dataset.fingerprint`), else a ValueError of one line naming
    the cell: a summary must not pair seeds trained on different data. Cells from before fingerprints
    are adopted with a one-line warning. A dataset is loaded only when a finished cell can be checked."""
    current, unchecked = {}, 0
    for (dataset_name, _, _), cells in plan.groups.items():
        for cell in cells:
            results = runs[dataset_name, cell.model, cell.config].get(cell.seed)
            if results is None:
                continue
            saved = results.get("fingerprint")
            if saved is None:
                unchecked += 1
                continue
            if cell.dataset not in current:
                current[cell.dataset] = cell.dataset.load().fingerprint()
            if saved != current[cell.dataset]:
                which = "data" if saved.get("data") != current[cell.dataset]["data"] else "split"
                raise ValueError(f"{cell.folder(out) / RESULTS_FILE}: trained on another {which} than the plan's "
                                 f"dataset {dataset_name!r} gives now ({which} fingerprint {saved.get(which)}, now "
                                 f"{current[cell.dataset][which]}); delete the cell's folder to train it again")
    if unchecked:
        print(f"pnn-fast: warning: {unchecked} finished cell(s) of {plan.name} predate data fingerprints: "
              f"their data and split are not checked", file=sys.stderr)


def summarize(plan: Plan, out: os.PathLike | str, *, check: bool = True) -> dict:
    """The statistics of the cells finished under ``out``, per (dataset, model, config) group, in plan order.

    Returns a dict: ``seeds`` (the study's), ``groups`` (per group: planned and finished seeds, mean and std of each of
    SUMMARY_METRICS, ``vs`` {baseline: {metric: lift_percent, ci95_percent, t, p, p_holm, pairs}}, mean_epoch_seconds,
    mean_best_epoch), ``unfinished`` [{cell, status, error?}], counts; None where there is no value.
    ``check``: first, that the finished cells were trained on the plan's data (:func:`_check_fingerprints`).
    """
    runs, unfinished = _finished_runs(plan, out)
    if check:
        _check_fingerprints(plan, out, runs)
    groups = []
    for (dataset, model, config), cells in plan.groups.items():
        finished = runs[dataset, model, config]
        row = {"dataset": dataset, "model": model, "config": config, "loss": cells[0].train_config.loss,
               "seeds": [cell.seed for cell in cells], "finished_seeds": sorted(finished)}
        for metric in SUMMARY_METRICS:
            values = [r["test"][metric] for r in finished.values()]
            row[metric] = {"mean": _mean(values), "std": _std(values)}
        row["vs"] = {baseline: {metric: _versus(finished, runs[dataset, model, baseline], metric)
                                for metric in SUMMARY_METRICS}
                     for baseline in plan.baselines if baseline in plan.configs and baseline != config}
        row["mean_epoch_seconds"] = _mean([r["mean_epoch_seconds"] for r in finished.values()])
        row["mean_best_epoch"] = _mean([r["best_epoch"] for r in finished.values()])
        groups.append(row)
    _adjust_by_holm(groups, plan)
    return {"study": plan.name, "plan": str(plan.path), "seeds": list(plan.seeds), "metrics": list(SUMMARY_METRICS),
            "baselines": [b for b in plan.baselines if b in plan.configs], "cells": len(plan.cells),
            "finished": len(plan.cells) - len(unfinished), "groups": groups, "unfinished": unfinished}


def _number(x: float | None, spec: str = ".4f") -> str:
    return "—" if x is None else format(x, spec)


def _versus_text(comparison: dict) -> str:
    if comparison["lift_percent"] is None:
        return "—"
    lift, paired_lift, interval = (comparison[k] for k in ("lift_percent", "paired_lift_percent", "ci95_percent"))
    # where the seeds differ, the interval is centred on the paired lift, not on the lift of the means
    paired = (f"paired {paired_lift:+.4f}%, " if paired_lift is not None and f"{paired_lift:+.4f}" != f"{lift:+.4f}"
              else "")
    ci = f"95% CI [{interval[0]:+.2f}%, {interval[1]:+.2f}%], " if interval is not None else ""
    holm = f" (Holm {_number(comparison['p_holm'], '.3g')})" if comparison.get("p_holm") is not None else ""
    return (f"{lift:+.4f}% ({paired}{ci}t {_number(comparison['t'])}, "
            f"p {_number(comparison['p'], '.3g')}{holm}, n {comparison['pairs']})")


LEGEND = """\
seeds: finished / planned. recall@20, ndcg@20: mean ± sample std (ddof 1) over the finished seeds of the test
metric at the best validation epoch. "X vs B": lift of the mean of X over config B's mean, in %; paired (shown
where X and B finished different seeds): the mean paired difference over the n seeds both have finished, in % of
B's mean over them; 95% CI: its confidence interval (Student's t, n - 1 degrees of freedom); t and p: paired
two-sided t-test (scipy.stats.ttest_rel) over those seeds (— below 2 pairs); Holm (the plan's holm configs
only): that p adjusted by Holm's step-down method for the family of holm configs compared with B, a member
not yet finished counting as one of them. s/epoch: mean
training seconds per epoch; best epoch: mean epoch of the best validation score (epochs to converge)."""


def _tables(summary: dict) -> dict[tuple[str, str], list[dict]]:
    """The summary's group rows by (dataset, model), in plan order."""
    tables = {}
    for row in summary["groups"]:
        tables.setdefault((row["dataset"], row["model"]), []).append(row)
    return tables


def summary_markdown(summary: dict) -> str:
    """``summary`` (see :func:`summarize`) as Markdown: one table per dataset x model, configs in plan order."""
    lines = [f"# Study {summary['study']}", "",
             f"Plan `{summary['plan']}`: {summary['finished']} of {summary['cells']} cells finished.", "", LEGEND]
    # a plan may give an expensive config fewer seeds than the study's; say which, so that a "1/3" is
    # read as planned, not as lost
    fewer = [row for row in summary["groups"] if len(row["seeds"]) < len(summary["seeds"])]
    if fewer:
        lines += ["", f"Planned with fewer seeds than the study's {len(summary['seeds'])}: " + "; ".join(
            f"`{row['dataset']}/{row['model']}/{row['config']}` {len(row['seeds'])} "
            f"(seed{'s' * (len(row['seeds']) > 1)} {', '.join(map(str, row['seeds']))})" for row in fewer) + "."]
    versus = [(baseline, metric) for baseline in summary["baselines"] for metric in summary["metrics"]]
    for (dataset, model), rows in _tables(summary).items():
        header = (["config", "loss", "seeds"] + summary["metrics"] + [f"{m} vs {b}" for b, m in versus]
                  + ["s/epoch", "best epoch"])
        lines += ["", f"## {dataset} · {model}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for row in rows:
            cells = ([row["config"], row["loss"], f"{len(row['finished_seeds'])}/{len(row['seeds'])}"]
                     + [f"{_number(row[m]['mean'])} ± {_number(row[m]['std'])}" for m in summary["metrics"]]
                     + [_versus_text(row["vs"][b][m]) if b in row["vs"] else "—" for b, m in versus]
                     + [_number(row["mean_epoch_seconds"]), _number(row["mean_best_epoch"])])
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"![{PLOTTED_METRIC}](plots/{dataset}.{model}.png)"]
    if summary["unfinished"]:
        lines += ["", "## Unfinished cells", ""]
        lines += [f"- `{u['cell']}`: {u['status']}" + (f": {u['error']}" if "error" in u else "")
                  for u in summary["unfinished"]]
    return "\n".join(lines) + "\n"


def plot_summary(summary: dict, folder: Path) -> None:
    """One PNG per dataset x model: mean test NDCG@20 per config, with std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for (dataset, model), rows in _tables(summary).items():
        stat = [[row[PLOTTED_METRIC][key] for row in rows] for key in ("mean", "std")]
        means, stds = (np.array(values, dtype=float) for values in stat)  # None (no value) -> NaN: no bar
        fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(rows), 3.5))
        ax.bar([row["config"] for row in rows], means, yerr=stds, capsize=4)
        ax.set(ylabel=f"test {PLOTTED_METRIC}", title=f"{dataset} · {model} (mean ± std over seeds)")
        ax.tick_params(axis="x", labelrotation=30)
        fig.tight_layout()
        fig.savefig(folder / f"{dataset}.{model}.png", dpi=100)
        plt.close(fig)


def write_summary(plan: Plan, out: os.PathLike | str, *, check: bool = True) -> dict:
    """summary.json, summary.md and plots/ under ``out`` from the cells finished there; returns the summary.
    ``check``: as :func:`summarize`."""
    out = Path(out)
    summary = summarize(plan, out, check=check)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "summary.md", summary_markdown(summary))
    plot_summary(summary, out / "plots")
    return summary


__all__ = ["Cell", "DatasetSpec", "Plan", "holm_adjusted", "load_plan", "run_study", "summarize", "summary_markdown",
           "write_summary"]
