"""``pnn-fast train`` and ``pnn-fast evaluate`` (also ``python -m pnn_fast``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from ._checks import check_device, check_int, check_real, check_seed
from .data import load_dataset, synthetic_dataset
from .data.parsers import text_lines
from .objectives import OBJECTIVES
from .study import load_plan, run_study, write_summary
from .csr import CSR
from .recommend import export_embeddings, top_items, write_recommendations
from .train import (Trainer, TrainConfig, TrainingInterrupted, check_arguments, check_fingerprint, load_config,
                    read_checkpoint, run)

EXAMPLES = """examples:
  pnn-fast train                                   # built-in synthetic data, MF + PNN
  pnn-fast train --data ../shared/data/ml-1m --split rs --model lightgcn --loss pnn
  pnn-fast train --data ratings.csv --loss dns --epochs 50 --out runs/dns
  pnn-fast compare --data ../shared/data/ml-100k --losses simplex,uib --epochs 20
  pnn-fast evaluate --checkpoint runs/pnn/checkpoint.pt --data ../shared/data/ml-1m --split rs
  pnn-fast recommend --checkpoint runs/pnn/checkpoint.pt --data ../shared/data/ml-1m --split rs --k 20 --out recs.csv
  pnn-fast study studies/example.toml --jobs 2 --threads 1    # a grid of runs, resumable; studies/README.md
  torchrun --nproc-per-node 2 -m pnn_fast train --loss pnn --loss-arg candidates_across_ranks=true
"""


# The built-in data set is a demonstration: this many epochs keep the README's first command under
# five minutes on two cores (PNN's valid NDCG@20 is then about 0.15, against 0.02 after one epoch).
SYNTHETIC_EPOCHS = 50


class _Parser(argparse.ArgumentParser):
    """Bad options end in one line on stderr, not a usage dump or a traceback."""

    def error(self, message):
        self.exit(2, f"pnn-fast: error: {message} (see --help)\n")


def _checked(kind, check, name: str, **bounds):
    """An argparse ``type``: the option's text as ``kind``, then ``check(name, value, **bounds)`` (a
    check of :mod:`pnn_fast._checks`). The loss checks the same value, but only once the data are
    loaded (and in ``compare``, after the losses before it have trained): this stops a bad value first."""
    def parse(text: str):
        try:
            return check(name, kind(text), **bounds)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return parse


#: how --data is read: the defaults of train; a checkpoint records the values its run used (TrainConfig.data_args)
DATA_ARG_DEFAULTS = {"format": "auto", "split": "auto", "split_seed": 2020, "rating_threshold": None, "kcore": 0}


def _add_data_args(p: argparse.ArgumentParser, from_checkpoint: bool = False) -> None:
    """The data flags; ``from_checkpoint`` (evaluate, recommend): each left unset takes the value the
    checkpoint's run read its data with (DATA_ARG_DEFAULTS for a checkpoint that did not record it)."""
    default = (lambda name: None) if from_checkpoint else DATA_ARG_DEFAULTS.get
    note = "; default: the checkpoint's" if from_checkpoint else ""
    g = p.add_argument_group("data")
    g.add_argument("--data", default=None, help="folder or file (LightGCN text, RecBole .inter, MovieLens "
                   "ratings.dat/.csv, user,item CSV); default: the built-in synthetic data set")
    g.add_argument("--format", default=default("format"), choices=["auto", "lightgcn", "inter", "movielens", "csv"],
                   help=note.lstrip("; ") or None)
    g.add_argument("--split", default=default("split"), choices=["auto", "files", "rs"],
                   help="files' own split, or RecBole's per-user random 8:1:1 ('rs', the paper's protocol)" + note)
    g.add_argument("--split-seed", type=_checked(int, check_seed, "--split-seed"), default=default("split_seed"),
                   help="seed of the 'rs' split" + note)
    g.add_argument("--rating-threshold", type=float, default=default("rating_threshold"),
                   help="keep ratings >= this" + note)
    g.add_argument("--kcore", type=int, default=default("kcore"),
                   help="drop users/items with fewer interactions (iterated)" + note)


def _add_train_args(p: argparse.ArgumentParser, compare: bool = False) -> None:
    """The options of a run; ``compare`` takes its losses from --losses, not --loss, and a
    ``LOSS.KEY=VALUE`` form of --loss-arg for one of them."""
    d = TrainConfig()
    pnn = OBJECTIVES["pnn"].DEFAULTS
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--model", default=d.model, choices=["mf", "lightgcn", "ngcf", "sgl"])
    if not compare:
        g.add_argument("--loss", default=d.loss, choices=sorted(OBJECTIVES))
    g.add_argument("--dim", type=int, default=d.dim, help="embedding size")
    g.add_argument("--epochs", type=int, default=None,
                   help=f"at most this many epochs (default {d.epochs}; {SYNTHETIC_EPOCHS} on the built-in synthetic data)")
    g.add_argument("--batch-size", type=int, default=d.batch_size)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--reg-weight", type=float, default=d.reg_weight,
                   help="weight of the L2 term, RecBole's EmbLoss over the batch's layer-0 rows: "
                        "(||U[users]|| + ||I[pos]|| + ||I[neg]||) / B")
    g.add_argument("--seed", type=_checked(int, check_seed, "--seed"), default=d.seed)
    g.add_argument("--device", default=d.device, help="cpu, cuda, cuda:1, ...")
    g.add_argument("--patience", type=int, default=d.patience,
                   help="early stopping: validations without improvement")
    g.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="validate every N epochs (and after the last), as RecBole's eval_step")
    g.add_argument("--valid-metric", default=d.valid_metric, help="e.g. ndcg@20, recall@20, mrr@10")
    g.add_argument("--sparse", action="store_true",
                   help="large catalogs: sparse gradients of the rows a step reads and SparseAdam over the "
                        "embedding tables (mf; losses bpr, bsl, dns, pnn, psl, sl, slatk)")
    g.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a model hyper-parameter by RecBole's name, e.g. n_layers=3 (repeatable)")
    g.add_argument("--loss-arg", action="append", default=[], metavar="LOSS.KEY=VALUE" if compare else "KEY=VALUE",
                   help=("a hyper-parameter of one compared loss, e.g. sl.temperature=0.2 (repeatable; KEY=VALUE "
                         "for every loss)" if compare else "a hyper-parameter of the chosen loss by name, e.g. "
                         "candidates=16 (repeatable)") + "; each loss's DEFAULTS in pnn_fast/objectives/<loss>.py")
    g = p.add_argument_group("dns")
    g.add_argument("--dns-candidates", type=_checked(int, check_int, "candidates", minimum=1),
                   default=OBJECTIVES["dns"].DEFAULTS["candidates"],
                   help="M uniform candidates per row")
    g.add_argument("--dns-in-batch", action="store_true", help="hardest of the whole batch's positives instead")
    g = p.add_argument_group("pnn (ablations of the paper's Table 5 as switches)")
    g.add_argument("--pnn-sampled", action="store_true", help="sampled unlabeled candidates instead of in-batch")
    g.add_argument("--pnn-candidates", type=_checked(int, check_int, "candidates", minimum=1),
                   default=pnn["candidates"], help="K sampled candidates per row")
    g.add_argument("--alpha", type=_checked(float, check_real, "alpha"), default=pnn["alpha"],
                   help="weight of L_constrain (0: w/o constrain)")
    g.add_argument("--beta", type=_checked(float, check_real, "beta"), default=pnn["beta"],
                   help="weight of L_uniform (0: w/o uniform)")
    g.add_argument("--no-rank", action="store_true", help="drop L_rank (w/o rank)")
    g.add_argument("--fixed-lambda", type=_checked(float, check_real, "fixed_lambda", high=1.0), default=None,
                   help="a fixed lambda in [0, 1] instead of the attention (w/o ada)")
    g.add_argument("--no-warmup", action="store_true", help="lambda = 1: no BPR warm-up (w/o sem)")
    g.add_argument("--neg-size", default=pnn["neg_size"], help="'proportional', 'count' or an int")
    g.add_argument("--history-len", type=_checked(int, check_int, "history_len", minimum=1),
                   default=pnn["history_len"])
    g.add_argument("--backend", default=pnn["backend"], choices=["auto", "reference", "cpu", "cuda"],
                   help="kernels of dns and pnn")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pnn-fast", description="Positive-neutral-negative learning for recommenders.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a model and report test metrics at the best validation epoch",
                           epilog=EXAMPLES, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_data_args(train)
    _add_train_args(train)
    train.add_argument("--out", default=None, help="output folder (default runs/<data>-<model>-<loss>)")
    train.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    train.add_argument("--overwrite", action="store_true", help="replace the run that <out> holds")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp = sub.add_parser("compare", help="train several losses on one model and data; a table of the results",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_data_args(cmp)
    _add_train_args(cmp, compare=True)
    cmp.add_argument("--losses", default="bpr,dns,pnn",
                     help="comma-separated losses; bpr, dns and pnn are always included, side by side")
    cmp.add_argument("--out", default=None, help="output folder (default runs/<data>-<model>-compare)")
    cmp.add_argument("--overwrite", action="store_true", help="replace the runs that <out> holds")
    cmp.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev = sub.add_parser("evaluate", help="score a checkpoint's model on the test split",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_data_args(ev, from_checkpoint=True)
    ev.add_argument("--checkpoint", required=True, help="a checkpoint.pt written by train")
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--split-name", default="test", choices=["valid", "test"])
    rec = sub.add_parser("recommend", help="each user's top K items from a checkpoint, as CSV in the data's ids; "
                         "optionally the embeddings for serving", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_data_args(rec, from_checkpoint=True)
    rec.add_argument("--checkpoint", required=True, help="a checkpoint.pt written by train")
    rec.add_argument("--out", required=True, help="CSV of user,rank,item,score")
    rec.add_argument("--k", type=_checked(int, check_int, "--k", minimum=1), default=20, help="items per user")
    rec.add_argument("--users", default=None, help="a file of original user ids, one a line (default: every user)")
    rec.add_argument("--embeddings", default=None, metavar="FOLDER",
                     help="also write the user and item embeddings (.npy) with their original ids (.json)")
    rec.add_argument("--device", default="cpu")
    st = sub.add_parser("study", help="train a TOML plan's datasets x models x configs x seeds (resumable, parallel) "
                        "and summarise them")
    st.add_argument("plan", help="the plan, a TOML file (format: studies/README.md)")
    st.add_argument("--out", default=None, help="output folder (default studies/<the plan's study.name>)")
    st.add_argument("--jobs", type=_checked(int, check_int, "jobs", minimum=1), default=1,
                    help="cells trained at once, each in its own process (default: 1)")
    st.add_argument("--threads", type=_checked(int, check_int, "threads", minimum=1), default=None,
                    help="torch threads per job (default: CPUs / jobs)")
    st.add_argument("--only", default=None, metavar="PATTERN", help="train only the cells matching this glob "
                    "over dataset/model/config/seedN")
    st.add_argument("--summary-only", action="store_true", help="summarise the finished cells; train nothing")
    st.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _parse_pairs(option: str, pairs: list) -> dict:
    """KEY=VALUE strings to a dict; values parsed as JSON where they are JSON (numbers, true, lists),
    with Python's True / False / None accepted too (a string "False" would be truthy)."""
    python_words = {"true": True, "false": False, "none": None}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} must be KEY=VALUE, got {pair!r}")
        if key in out:  # the last would win silently: which one the user meant is not ours to guess
            raise ValueError(f"{option} {key} is given twice ({pair.partition('=')[2]!r} after {out[key]!r}); "
                             f"give it once")
        if value.lower() in python_words:
            out[key] = python_words[value.lower()]
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = _float_word(value)
    return out


def _own_pairs(loss: str, pairs: dict, run_losses: list) -> dict:
    """The --loss-arg pairs of ``loss``: every ``KEY`` and its own ``LOSS.KEY`` (compare's form, one
    loss of several); ``OTHER.KEY`` of another loss of the run is left to that loss."""
    own = {}
    for key, value in pairs.items():
        owner, dot, name = key.rpartition(".")
        if not dot:
            own[key] = value
        elif owner not in run_losses:
            raise ValueError(f"--loss-arg {key}: {owner!r} is not a loss of this run ({', '.join(run_losses)})")
        elif owner == loss:
            if name in own:
                raise ValueError(f"--loss-arg {name} is given twice (as {name} and as {key}); give it once")
            own[name] = value
    return own


def _float_word(value: str):
    """``value`` as a float where Python reads it as one and JSON does not ("inf", "nan"), so that the
    loss's own check names it as a number out of range; else the string itself."""
    try:
        return float(value)
    except ValueError:
        return value


#: the flags of one loss (``--backend`` reaches every loss that takes a backend): flag -> (loss, argparse dest)
LOSS_FLAGS = {"--dns-candidates": ("dns", "dns_candidates"), "--dns-in-batch": ("dns", "dns_in_batch"),
              "--pnn-sampled": ("pnn", "pnn_sampled"), "--pnn-candidates": ("pnn", "pnn_candidates"),
              "--alpha": ("pnn", "alpha"), "--beta": ("pnn", "beta"), "--no-rank": ("pnn", "no_rank"),
              "--fixed-lambda": ("pnn", "fixed_lambda"), "--no-warmup": ("pnn", "no_warmup"),
              "--neg-size": ("pnn", "neg_size"), "--history-len": ("pnn", "history_len")}


def _check_loss_flags(args, losses: list) -> None:
    """A loss's flag given (set to other than its default) in a run with no loss that takes it is an
    error of one line, never dropped: ``--alpha`` with ``--loss sl`` did nothing."""
    defaults = vars(build_parser().parse_args([args.command]))
    for flag, (owner, dest) in LOSS_FLAGS.items():
        if getattr(args, dest) != defaults[dest] and owner not in losses:
            takes = ", ".join(sorted(OBJECTIVES[losses[0]].DEFAULTS))
            raise ValueError(f"{flag} is a {owner} option; --loss {losses[0]} takes --loss-arg KEY=VALUE with "
                             f"its own arguments ({takes})")
    if args.backend != defaults["backend"] and not any("backend" in OBJECTIVES[loss].DEFAULTS for loss in losses):
        raise ValueError(f"--backend: no loss of this run ({', '.join(losses)}) takes a backend")


def _loss_args(args) -> dict:
    """The loss's own flags as loss_args (only those of the chosen loss; ``--backend`` for every loss
    that takes one), then --loss-arg."""
    if args.loss == "dns":
        named = {"candidates": args.dns_candidates, "in_batch": args.dns_in_batch, "backend": args.backend}
    elif args.loss == "pnn":
        lambda_mode, fixed = "attention", 0.5
        if args.no_warmup:
            lambda_mode, fixed = "fixed", 1.0
        elif args.fixed_lambda is not None:
            lambda_mode, fixed = "fixed", args.fixed_lambda
        neg_size = int(args.neg_size) if args.neg_size.isdigit() else args.neg_size
        named = {"in_batch": not args.pnn_sampled, "candidates": args.pnn_candidates, "alpha": args.alpha,
                 "beta": args.beta, "neg_size": neg_size, "history_len": args.history_len,
                 "lambda_mode": lambda_mode, "fixed_lambda": fixed, "use_rank": not args.no_rank,
                 "backend": args.backend}
    else:
        named = {"backend": args.backend} if "backend" in OBJECTIVES[args.loss].DEFAULTS else {}
    run_losses = compared_losses(args.losses) if args.command == "compare" else [args.loss]
    pairs = _own_pairs(args.loss, _parse_pairs("--loss-arg", args.loss_arg), run_losses)
    if args.loss == "pnn" and "preset" in pairs:
        # a preset sets every PNN argument but the backend: the flags' defaults give way to it,
        # and a flag set to anything else contradicts it
        defaults = _loss_args(build_parser().parse_args(["train", "--loss", "pnn"]))
        changed = sorted(key for key in named if key != "backend" and named[key] != defaults[key])
        if changed:
            raise ValueError(f"--loss-arg preset={pairs['preset']} sets every PNN argument but backend; "
                             f"drop the flags that set {changed}")
        named = {"backend": args.backend}
    return {**named, **pairs}


def _load_data(args):
    if args.data is None:
        # the built-in data set reads no file, so a data flag would be silently ignored
        given = [name for name, default in DATA_ARG_DEFAULTS.items() if getattr(args, name) not in (None, default)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(f"{flag} applies to --data; without --data the run uses the built-in synthetic data set")
        return synthetic_dataset()
    return load_dataset(args.data, format=args.format, split=args.split, seed=args.split_seed,
                        rating_threshold=args.rating_threshold, kcore=args.kcore)


def _config(args, loss: str):
    args.loss = loss
    epochs = args.epochs
    if epochs is None:
        epochs = SYNTHETIC_EPOCHS if args.data is None else TrainConfig.epochs
    return TrainConfig(
        model=args.model, loss=loss, dim=args.dim, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
        reg_weight=args.reg_weight, seed=args.seed, device=args.device, patience=args.patience,
        eval_every=args.eval_every, valid_metric=args.valid_metric, sparse=args.sparse, loss_args=_loss_args(args),
        model_args=_parse_pairs("--model-arg", args.model_arg),
        data_args={name: getattr(args, name) for name in DATA_ARG_DEFAULTS} if args.data is not None else {})


def _train(args) -> None:
    if args.resume and args.overwrite:  # (the trainer refuses it too; here before the data load)
        raise ValueError("--resume continues the run in --out and --overwrite replaces it; give one")
    _check_loss_flags(args, [args.loss])
    config = _config(args, args.loss)
    data = _load_data(args)
    first_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun, one rank reports (the trainer logs likewise)
    if first_rank:
        print(data.summary())
    out = args.out or Path("runs") / f"{data.name}-{args.model}-{args.loss}"
    try:
        run(data, config, out, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress)
    except TrainingInterrupted as err:
        print(f"pnn-fast: {err}", file=sys.stderr)
        raise SystemExit(130) from None
    if first_rank:
        print(f"results: {Path(out) / 'results.json'}, curves: {Path(out) / 'curves.png'}")


def comparison_table(rows: list) -> str:
    """Markdown table of (loss, results dict) pairs."""
    lines = ["| loss | s / epoch | epochs run | best epoch | test recall@20 | test ndcg@20 |",
             "|---|---|---|---|---|---|"]
    for loss, r in rows:
        lines.append(f"| {loss} | {r['mean_epoch_seconds']:.2f} | {len(r['epochs'])} | {r['best_epoch']} | "
                     f"{r['test'].get('recall@20', float('nan')):.4f} | {r['test'].get('ndcg@20', float('nan')):.4f} |")
    return "\n".join(lines)


def compared_losses(text: str) -> list:
    """The losses ``compare --losses`` trains: BPR, DNS and PNN, then those listed (comma-separated,
    spaces around a name allowed), each once."""
    return list(dict.fromkeys(["bpr", "dns", "pnn"] + [name.strip() for name in text.split(",") if name.strip()]))


def _compare(args) -> None:
    losses = compared_losses(args.losses)
    unknown = [loss for loss in losses if loss not in OBJECTIVES]
    if unknown:
        raise ValueError(f"--losses: unknown loss(es) {unknown}; choose from {sorted(OBJECTIVES)}")
    _check_loss_flags(args, losses)
    for key in _parse_pairs("--loss-arg", args.loss_arg):  # a bare KEY goes to every loss compared
        without = [loss for loss in losses if "." not in key and key not in OBJECTIVES[loss].DEFAULTS]
        if without:
            raise ValueError(f"--loss-arg {key}: loss {without[0]!r} of this comparison has no such argument; give "
                             f"it to one loss as LOSS.KEY=VALUE (e.g. {losses[-1]}.{key}=...)")
    configs = {loss: _config(args, loss) for loss in losses}  # every config checked before any training
    for config in configs.values():
        check_arguments(config)
    data = _load_data(args)
    print(data.summary())
    out = Path(args.out or Path("runs") / f"{data.name}-{args.model}-compare")
    rows = []
    for loss, config in configs.items():
        print(f"== {loss}")
        rows.append((loss, run(data, config, out / loss, overwrite=args.overwrite, progress=not args.no_progress)))
    table = comparison_table(rows)
    (out / "comparison.md").write_text(f"{data.summary()}\n\nmodel {args.model}\n\n{table}\n")
    print(table)


def _trained_model(args):
    """(data, trainer holding the checkpoint's best model) for ``evaluate`` and ``recommend``."""
    check_device(args.device)  # before the checkpoint is read onto it, which would blame the checkpoint
    state = read_checkpoint(args.checkpoint, args.device)
    config = load_config(state["config"], device=args.device)
    for name, default in DATA_ARG_DEFAULTS.items():  # read the data as the run did, unless told otherwise
        if getattr(args, name) is None:
            setattr(args, name, config.data_args.get(name, default))
    data = _load_data(args)
    # the checkpoint's tables declare the id spaces; other data would fail deep in load_state_dict
    trained = tuple(state["model"][f"{side}_embedding.weight"].shape[0] for side in ("user", "item"))
    if trained != (data.num_users, data.num_items):
        raise ValueError(f"--checkpoint {args.checkpoint} was trained on {trained[0]:,} users and {trained[1]:,} "
                         f"items, but --data gives {data.num_users:,} and {data.num_items:,}; pass the data (and "
                         f"--rating-threshold, --kcore) it was trained with")
    trainer = Trainer(data, config, Path(args.checkpoint).parent)
    check_fingerprint(state, trainer.fingerprint, f"--checkpoint {args.checkpoint}")  # the trainer's, computed once
    trainer.restore(state["best"]["state"] or {"model": state["model"], "objective": state["objective"]})
    return data, trainer


def _evaluate(args) -> None:
    _, trainer = _trained_model(args)
    metrics = trainer.evaluate_split(args.split_name)
    print(json.dumps(metrics, indent=2))


def _user_rows(path: str, data) -> torch.Tensor:
    """The internal ids of the users a file lists, one original id a line (blank lines skipped); a
    user listed twice is refused (its rows would be written twice)."""
    internal = {str(name): row for row, name in enumerate(data.user_ids)} if data.user_ids is not None else None
    rows, first_line = [], {}
    for number, text in text_lines(path):
        row = internal.get(text) if internal is not None else (int(text) if text.isdigit() else None)
        if row is None or not 0 <= row < data.num_users:
            raise ValueError(f"{path}:{number}: user {text!r} is not in --data")
        if row in first_line:
            raise ValueError(f"{path}:{number}: user {text!r} is listed again (first at line {first_line[row]})")
        first_line[row] = number
        rows.append(row)
    if not rows:
        raise ValueError(f"--users {path} lists no user")
    return torch.tensor(rows, dtype=torch.int64)


def _writable(option: str, path, *, folder: bool) -> None:
    """Where a file (or, with ``folder``, a folder of files) will be written must have a folder to go
    in and must not be the other kind of thing, checked before the work that fills it."""
    path = Path(path)
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: its folder {parent} does not exist")
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; it names a folder to write the embeddings into")
    if not folder and path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give the path of the CSV file to write")


def _recommend(args) -> None:
    _writable("--out", args.out, folder=False)
    if args.embeddings:
        _writable("--embeddings", args.embeddings, folder=True)
    if args.users and not Path(args.users).is_file():
        raise ValueError(f"--users {args.users}: no such file")
    data, trainer = _trained_model(args)
    users = (_user_rows(args.users, data) if args.users else torch.arange(data.num_users)).to(trainer.device)
    user_table, item_table = trainer.scoring_tables()
    # every item the data holds for a user (train, valid and test) is known: never recommended
    pairs = [torch.cat([split[side] for split in (data.train, data.valid, data.test)]) for side in (0, 1)]
    known = CSR.from_pairs(pairs[0], pairs[1], data.num_users, data.num_items).to(trainer.device)
    written = write_recommendations(args.out, top_items(user_table, item_table, users, [known], args.k),
                                    data.user_ids, data.item_ids)
    print(f"recommendations: {args.out} ({written:,} rows, top {args.k} of {users.numel():,} users)")
    if args.embeddings:
        export_embeddings(args.embeddings, user_table, item_table, data.user_ids, data.item_ids)
        print(f"embeddings: {args.embeddings}")


def _study(args) -> None:
    plan = load_plan(args.plan)  # checked whole before anything trains
    out = Path(args.out or plan.default_out)
    if args.summary_only:
        write_summary(plan, out)
    else:
        try:
            run_study(plan, out, jobs=args.jobs, threads=args.threads, only=args.only, progress=not args.no_progress)
        except KeyboardInterrupt:
            print("pnn-fast: interrupted; the same command resumes the study", file=sys.stderr)
            raise SystemExit(130) from None
    print(f"summary: {out / 'summary.md'}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        {"train": _train, "compare": _compare, "evaluate": _evaluate, "recommend": _recommend,
         "study": _study}[args.command](args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as err:
        print(f"pnn-fast: error: {err}", file=sys.stderr)
        return 2
    return 0


__all__ = ["build_parser", "main"]
