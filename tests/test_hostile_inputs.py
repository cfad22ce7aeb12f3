"""Issue 67's hostile inputs as one table: each case is a command (run in-process through the CLI's
entry point) and the one line it must print on stderr, exit code 2, no traceback. The list only
grows: a new bad input found is a new row. (Cases that need a second process, a lock or a kill, and
the checkpoints that are not ours, are in tests/test_train.py.)"""
from __future__ import annotations

import json

import pytest
import torch

from pnn_fast.cli import main
from pnn_fast.eval import evaluate
from pnn_fast.known import KnownPositives
from pnn_fast.losses import BPRLoss, DNSLoss, PNNLoss
from pnn_fast.recommend import top_items
from pnn_fast.sampling import sample_unknown

T = ["train", "--epochs", "1", "--no-progress", "--dim", "8"]


def _bytes(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _lightgcn(folder, train: str, valid: str, test: str) -> str:
    """A LightGCN folder (train.txt, valid.txt and test.txt, ``user item item ...`` a line)."""
    folder.mkdir()
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{name}.txt").write_text(text)
    return str(folder)

#: a study plan's first tables (a config table follows), for the plan cases below
PLAN = (b'[study]\nname = "p"\nseeds = [1]\n[[datasets]]\nname = "s"\npath = "synthetic"\n'
        b'[[models]]\nname = "mf"\n')

#: (id, argv, the expected fragment of the one line); the test runs in a fresh folder, so relative paths
#: land there; an argv that needs files is a function that writes them into the folder it is given
CASES = [
    ("yes-no word", T + ["--loss", "dns", "--loss-arg", "in_batch=no"], "loss 'dns': in_batch must be true or false, got 'no'"),
    ("yes-no word maybe", T + ["--loss", "dns", "--loss-arg", "in_batch=maybe"],
     "loss 'dns': in_batch must be true or false, got 'maybe'"),
    ("yes-no word pnn", T + ["--loss", "pnn", "--loss-arg", "use_rank=off"],
     "loss 'pnn': use_rank must be true or false, got 'off'"),
    ("a float for an int", T + ["--loss", "dns", "--loss-arg", "candidates=2.5"],
     "loss 'dns': candidates must be an int, got 2.5"),
    ("a word for a number", T + ["--loss", "sl", "--loss-arg", "temperature=hot"],
     "loss 'sl': temperature must be a number, got 'hot'"),
    ("dns candidates 0", T + ["--loss", "dns", "--loss-arg", "candidates=0"], "loss 'dns': candidates must be an int >= 1, got 0"),
    ("dns candidates -3", T + ["--loss", "dns", "--loss-arg", "candidates=-3"],
     "loss 'dns': candidates must be an int >= 1, got -3"),
    ("valid metric @0", T + ["--valid-metric", "ndcg@0"],
     "valid_metric must look like 'ndcg@20' (a cut-off of at least 1), got 'ndcg@0'"),
    ("compare unknown loss", ["compare", "--losses", "bpr,bogus", "--epochs", "1", "--no-progress"],
     "--losses: unknown loss(es) ['bogus']"),
    ("sparse without a sparse path", T + ["--loss", "simplex", "--sparse"],
     "--sparse: loss 'simplex' has no sparse path; these do: bpr, bsl, dns, pnn, psl, sl, slatk"),
    ("sparse graph model", T + ["--model", "lightgcn", "--sparse"],
     "--sparse needs a model that scores with its embedding tables (mf)"),
    ("checkpoint is a folder", ["evaluate", "--checkpoint", "."], "is a folder; give the checkpoint.pt inside it"),
    ("a pnn flag with sl", T + ["--loss", "sl", "--alpha", "0.5"],
     "--alpha is a pnn option; --loss sl takes --loss-arg KEY=VALUE with its own arguments (backend, in_batch_negatives"),
    ("a dns flag with bpr", T + ["--loss", "bpr", "--dns-candidates", "4"],
     "--dns-candidates is a dns option; --loss bpr takes --loss-arg KEY=VALUE"),
    ("a backend for a loss without one", T + ["--loss", "ans", "--backend", "cpu"],
     "--backend: no loss of this run (ans) takes a backend"),
    ("a user who holds every item", lambda d: T + ["--data", _lightgcn(d / "full", "0 0 1 2\n1 0\n", "1 1\n", "1 2\n"),
                                                   "--loss", "bpr"],
     "full: user 0 holds all 3 items in the training split, so no item is left to sample as a negative"),
    ("non-UTF-8 bytes in a CSV", lambda d: T + ["--data", _bytes(d / "bad.csv", b"user,item\n1,2\n\xff\xfe,3\n")],
     "bad.csv:3: is not UTF-8 text (byte 0xff at column 1)"),
    ("non-UTF-8 bytes in an .inter",
     lambda d: T + ["--data", _bytes(d / "bad.inter", b"user_id:token\titem_id:token\n1\t2\nab\xc3\t3\n")],
     "bad.inter:3: is not UTF-8 text (byte 0xc3 at column 3)"),
    ("recommend k 0", ["recommend", "--checkpoint", "x.pt", "--out", "r.csv", "--k", "0"], "--k must be an int >= 1, got 0"),
    ("an .inter id declared float",
     lambda d: T + ["--data", _bytes(d / "f.inter", b"user_id:float\titem_id:token\n1\t2\n")],
     "f.inter:1: header declares user_id as float; it is read as token, so declare 'user_id:token'"),
    ("an .inter id declared a sequence",
     lambda d: T + ["--data", _bytes(d / "s.inter", b"user_id:token\titem_id:token_seq\n1\t2 3\n")],
     "s.inter:1: header declares item_id as token_seq; it is read as token, so declare 'item_id:token'"),
    ("an .inter type RecBole does not have",
     lambda d: T + ["--data", _bytes(d / "t.inter", b"user_id:token\titem_id:token\trating:int\n1\t2\t5\n")],
     "t.inter:1: header field 'rating:int' has type 'int'; RecBole's types are token, token_seq, float, float_seq"),
    ("a KEY=VALUE given twice", T + ["--loss", "sl", "--loss-arg", "temperature=0.1", "--loss-arg", "temperature=0.2"],
     "--loss-arg temperature is given twice ('0.2' after 0.1); give it once"),
    ("a model argument given twice", T + ["--model", "lightgcn", "--model-arg", "n_layers=2", "--model-arg", "n_layers=3"],
     "--model-arg n_layers is given twice ('3' after 2); give it once"),
    ("a KEY=VALUE without a key", T + ["--loss", "sl", "--loss-arg", "=5"], "--loss-arg must be KEY=VALUE, got '=5'"),
    ("an infinite temperature", T + ["--loss", "sl", "--loss-arg", "temperature=inf"],
     "loss 'sl': temperature must be a finite number > 0, got inf"),
    ("a NaN weight", T + ["--loss", "bsl", "--loss-arg", "negative_weight=nan"],
     "loss 'bsl': negative_weight must be a finite number > 0, got nan"),
    ("a study baseline that names no config",
     lambda d: ["study", _bytes(d / "b.toml", b'[study]\nname = "b"\nseeds = [1]\nbaselines = ["sl-t01"]\n'
                                             b'[[datasets]]\nname = "s"\npath = "synthetic"\n[[models]]\nname = "mf"\n'
                                             b'[[configs]]\nname = "bpr"\n')],
     "b.toml: study.baselines: ['sl-t01'] name no config; configs: bpr"),
    ("recommendations into a missing folder", ["recommend", "--checkpoint", "x.pt", "--out", "no/such/r.csv"],
     "--out no/such/r.csv: its folder "),
    # SL's successors and the mixed negatives (issue 69): each bad argument named with its loss
    ("psl activation", T + ["--loss", "psl", "--loss-arg", "activation=gelu"],
     "loss 'psl': activation must be one of ['atan', 'relu', 'tanh'], got 'gelu'"),
    ("psl atan below 2", T + ["--loss", "psl", "--loss-arg", "temperature=1", "--loss-arg", "activation=atan"],
     "loss 'psl': activation='atan' needs temperature >= 2 (gaps of cosines within [-1, 1]), got 1"),
    ("slatk k above the draws", T + ["--loss", "slatk", "--loss-arg", "k=2000"],
     "loss 'slatk': k must be at most num_negatives=1000 (the quantile's draws), got 2000"),
    ("slatk refresh every 0 epochs", T + ["--loss", "slatk", "--loss-arg", "quantile_every=0"],
     "loss 'slatk': quantile_every must be an int >= 1, got 0"),
    ("slatk negative lr factor", T + ["--loss", "slatk", "--loss-arg", "switch_lr_factor=-1"],
     "loss 'slatk': switch_lr_factor must be a finite number > 0, got -1"),
    ("slatk negative warm-up", T + ["--loss", "slatk", "--loss-arg", "warmup_epochs=-1"],
     "loss 'slatk': warmup_epochs must be an int >= 0, got -1"),
    ("bsl temperature 0", T + ["--loss", "bsl", "--loss-arg", "temperature=0"],
     "loss 'bsl': temperature must be a finite number > 0, got 0"),
    ("bsl no draws", T + ["--loss", "bsl", "--loss-arg", "num_negatives=0"],
     "loss 'bsl': num_negatives must be an int >= 1, got 0"),
    ("logq without in-batch negatives", T + ["--loss", "sl", "--loss-arg", "logq=true"],
     "loss 'sl': logq corrects for the in-batch negatives' popularity: it needs in_batch_negatives=True"),
    ("in-batch negatives without a pool", T + ["--loss", "psl", "--loss-arg", "in_batch_negatives=true"],
     "loss 'psl': in_batch_negatives mixes the batch's positives with one uniform pool shared by the batch"),
    # found this session (issue 67, beyond the list): each was accepted silently, or named the wrong culprit
    ("a device torch does not know", T + ["--device", "tpu"], "device 'tpu': not a device name (cpu, cuda, cuda:1, ...)"),
    ("evaluate on a device torch does not know", ["evaluate", "--checkpoint", "x.pt", "--device", "tpu"],
     "device 'tpu': not a device name"),
    ("a data flag without --data", T + ["--kcore", "5"],
     "--kcore applies to --data; without --data the run uses the built-in synthetic data set"),
    ("a split seed without --data", T + ["--split-seed", "7"], "--split-seed applies to --data"),
    ("a NaN rating threshold",
     lambda d: T + ["--data", _bytes(d / "r.csv", b"user,item,rating\n1,2,5\n"), "--rating-threshold", "nan"],
     "rating_threshold must be a finite number, got nan"),
    ("study --jobs 0", ["study", "plan.toml", "--jobs", "0"], "argument --jobs: jobs must be an int >= 1, got 0"),
    ("study --threads 0", ["study", "plan.toml", "--threads", "0"], "argument --threads: threads must be an int >= 1, got 0"),
    ("recommend for a users file that is not there", ["recommend", "--checkpoint", "x.pt", "--out", "r.csv",
                                                      "--users", "nofile.txt"], "--users nofile.txt: no such file"),
    ("simplex no draws", T + ["--loss", "simplex", "--loss-arg", "num_negatives=0"],
     "loss 'simplex': num_negatives must be an int >= 1, got 0"),
    ("simplex NaN margin", T + ["--loss", "simplex", "--loss-arg", "margin=nan"],
     "loss 'simplex': margin must be a finite number in [-1, 1], got nan"),
    # found by a hunt of 169 more hostile inputs (issue 67, beyond the list): each was accepted silently,
    # named the wrong thing, or failed only after training had run
    ("a header line inside a CSV", lambda d: T + ["--data", _bytes(d / "j.csv", b"user,item\n1,2\nuser,item\n1,3\n")],
     "j.csv:3: a header line 'user,item' inside the data (files joined?); only line 1 may name the columns"),
    ("a seed past 2^31", T + ["--seed", "4294967297"], "--seed must be an int in [0, 2^31), got 4294967297"),
    ("a seed past int64", T + ["--seed", "1180591620717411303424"], "--seed must be an int in [0, 2^31)"),
    ("a negative seed", T + ["--seed", "-1"], "--seed must be an int in [0, 2^31), got -1"),
    ("a split seed past int64", lambda d: T + ["--data", _bytes(d / "r.csv", b"1,2\n"), "--split-seed", "9" * 23],
     "--split-seed must be an int in [0, 2^31)"),
    ("a study flag of the wrong type", lambda d: ["study", _bytes(d / "b.toml", PLAN + b'[[configs]]\nname = "bpr"\n'
                                                                               b'sparse = 1\n')],
     "b.toml: configs[0].sparse: expected true or false, got 1"),
    ("a study's data_args", lambda d: ["study", _bytes(d / "b.toml", PLAN + b'[[configs]]\nname = "bpr"\n'
                                                                       b'data_args = { kcore = 5 }\n')],
     "b.toml: configs[0].data_args: unknown key"),
    ("a study's ks with a 0", lambda d: ["study", _bytes(d / "b.toml", PLAN + b'[[configs]]\nname = "bpr"\n'
                                                                        b'ks = [0, 20]\n')],
     "b.toml: configs[0]: ks must be a list of positive ints, got (0, 20)"),
    ("a study loss argument out of range", lambda d: ["study", _bytes(d / "b.toml", PLAN + b'[[configs]]\nname = "bpr"\n'
                                                                                    b'[[configs]]\nname = "dns"\n'
                                                                                    b'loss_args = { candidates = 0 }\n')],
     "b.toml: s/mf/dns: loss 'dns': candidates must be an int >= 1, got 0"),
    ("a study model argument of the wrong type",
     lambda d: ["study", _bytes(d / "b.toml", PLAN.replace(b'name = "mf"', b'name = "lightgcn"\nmodel_args = { n_layers = "three" }')
                                + b'[[configs]]\nname = "bpr"\n')],
     "b.toml: s/lightgcn/bpr: n_layers must be a non-negative int, got 'three'"),
    ("compare given --loss", ["compare", "--loss", "sl", "--epochs", "1"], "--loss could match --loss-arg, --losses"),
    ("compare's loss argument that a compared loss lacks", ["compare", "--losses", "sl", "--loss-arg", "temperature=0.2"],
     "--loss-arg temperature: loss 'bpr' of this comparison has no such argument; give it to one loss as LOSS.KEY=VALUE"),
    ("compare's argument for a loss not compared", ["compare", "--losses", "sl", "--loss-arg", "psl.temperature=1"],
     "--loss-arg psl.temperature: 'psl' is not a loss of this run (bpr, dns, pnn, sl)"),
    ("compare's argument out of range for one loss", ["compare", "--loss-arg", "dns.candidates=0", "--epochs", "1"],
     "loss 'dns': candidates must be an int >= 1, got 0"),
    ("train's argument for another loss", T + ["--loss", "sl", "--loss-arg", "psl.temperature=1"],
     "--loss-arg psl.temperature: 'psl' is not a loss of this run (sl)"),
    ("resume and overwrite at once", T + ["--resume", "--overwrite"],
     "--resume continues the run in --out and --overwrite replaces it; give one"),
    ("recommendations into a folder", lambda d: ["recommend", "--checkpoint", "x.pt", "--out", str(d)],
     "is a folder; give the path of the CSV file to write"),
    ("embeddings into a file", lambda d: ["recommend", "--checkpoint", "x.pt", "--out", "r.csv",
                                          "--embeddings", _bytes(d / "e.npy", b"")],
     "e.npy is a file; it names a folder to write the embeddings into"),
    ("a data file of an unknown suffix", lambda d: T + ["--data", _bytes(d / "r.tsv", b"1\t2\n")],
     "r.tsv from its suffix (.csv, .inter, .dat, .txt); pass --format"),
    ("a comma-separated .inter", lambda d: T + ["--data", _bytes(d / "c.inter", b"user_id:token,item_id:token\n1,2\n")],
     "c.inter:1: the header has commas and no tab: a .inter file is tab-separated"),
    ("an .inter column named twice",
     lambda d: T + ["--data", _bytes(d / "u.inter", b"user_id:token\titem_id:token\tuser_id:token\n1\t2\t3\n")],
     "u.inter:1: header names column 'user_id' twice (fields 1 and 3)"),
] + ([("device cuda without a GPU", T + ["--device", "cuda"], "device 'cuda': no usable GPU here")]
     if not torch.cuda.is_available() else [])


@pytest.mark.parametrize("argv, fragment", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_hostile_input_gets_one_line(argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv(tmp_path) if callable(argv) else argv)
    except SystemExit as err:  # argparse's own refusals
        code = err.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err, err
    assert "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()  # refused before anything trained


def test_known_positives_refuse_id_spaces_past_2_31():
    """2^40 x 2^40 tried to allocate 8.8 TB before failing (and its keys row x I + col overflow int64)."""
    ids = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^num_users must be below 2\^31, got 1,099,511,627,776$"):
        KnownPositives.from_pairs(ids, ids, 2**40, 2**40)
    with pytest.raises(ValueError, match=r"^num_items must be below 2\^31, got 2,147,483,648$"):
        KnownPositives.from_pairs(ids, ids, 10, 2**31)


def test_a_diverged_first_epoch_says_there_is_no_checkpoint_and_writes_strict_json(tmp_path, capsys):
    """--beta 1e308: the first epoch's loss overflows. The message named a checkpoint that did not exist,
    and results.json held -Infinity, which strict JSON readers refuse."""
    code = main(T + ["--loss", "pnn", "--beta", "1e308", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "the loss of epoch 1, batch 1 of" in err, err
    assert "no epoch finished, so there is no checkpoint" in err and "(non-finite terms: beta * uniform)" in err, err
    assert not (tmp_path / "o" / "checkpoint.pt").exists()
    record = json.loads((tmp_path / "o" / "results.json").read_text(),
                        parse_constant=lambda name: pytest.fail(f"results.json holds {name}"))
    assert record["status"] == "diverged" and record["best_valid"] is None


@pytest.mark.parametrize("loss", ["sl", "bpr", "simplex"])
def test_backend_reaches_every_loss_that_takes_one(loss):
    """--backend was dropped for sl, bpr and simplex; it reaches each loss that declares a backend."""
    from pnn_fast.cli import _config, build_parser
    from pnn_fast.data import synthetic_dataset
    from pnn_fast.train import Trainer

    args = build_parser().parse_args(["train", "--loss", loss, "--backend", "reference", "--dim", "8"])
    config = _config(args, loss)
    assert config.loss_args["backend"] == "reference"
    data = synthetic_dataset(num_users=40, num_items=30, interactions_per_user=6, seed=1)
    assert Trainer(data, config, "/tmp/unused").objective.args["backend"] == "reference"


def test_compare_sends_a_pnn_flag_to_pnn_only(tmp_path):
    """In compare, pnn is in every run: --alpha reaches it, and the other losses go on without it."""
    from pnn_fast.cli import _config, build_parser

    args = build_parser().parse_args(["compare", "--losses", "sl", "--alpha", "0.5"])
    assert _config(args, "pnn").loss_args["alpha"] == 0.5
    assert "alpha" not in _config(args, "sl").loss_args


def test_compare_reads_a_list_with_spaces():
    """``--losses "bpr, sl"`` was refused as the unknown loss ' sl'."""
    from pnn_fast.cli import compared_losses
    assert compared_losses("sl, psl ,sl,") == ["bpr", "dns", "pnn", "sl", "psl"]


@pytest.mark.parametrize("make", [
    lambda known: PNNLoss(known, 8, use_rank="false"),  # "false" kept L_rank: a non-empty string is true
    lambda known: PNNLoss(known, 8, uniform_normalize="false"),
    lambda known: PNNLoss(known, 8, candidates_across_ranks="no"),
    lambda known: PNNLoss(known, 8, sparse="false"),
    lambda known: BPRLoss(sparse="false"),
    lambda known: DNSLoss(known, sparse="no"),
], ids=["use_rank", "uniform_normalize", "candidates_across_ranks", "pnn sparse", "bpr sparse", "dns sparse"])
def test_a_yes_no_argument_of_a_loss_refuses_a_word(make):
    known = KnownPositives.from_pairs(torch.tensor([0, 1]), torch.tensor([1, 2]), 2, 4)
    with pytest.raises(TypeError, match=r"must be True or False, got '(false|no)'$"):
        make(known)


def test_evaluate_refuses_a_string_of_cut_offs_and_ranks_a_cut_off_past_the_catalog_once():
    """``ks="25"`` was read as [2, 5]; a cut-off of 10^12 allocated 8 TB (after an epoch had trained)."""
    g = torch.Generator().manual_seed(0)
    users, items = torch.randn(6, 4, generator=g), torch.randn(9, 4, generator=g)
    truth = (torch.tensor([0, 0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 4, 5, 6, 7]))
    with pytest.raises(ValueError, match=r"^ks must be a list of positive ints, got '25'$"):
        evaluate(users, items, truth, ks="25")
    past = evaluate(users, items, truth, ks=[10**12, 9])
    for metric in ("recall", "ndcg", "hit", "mrr"):  # every item is ranked within either cut-off
        assert past[f"{metric}@{10**12}"] == pytest.approx(past[f"{metric}@9"])
    assert past[f"precision@{10**12}"] == pytest.approx(past["precision@9"] * 9 / 10**12)


def test_small_api_arguments_are_named():
    known = KnownPositives.from_pairs(torch.tensor([0, 1]), torch.tensor([1, 2]), 2, 4)
    meta = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match=r"^user_ids is a meta tensor"):  # torch's "Cannot copy out of meta tensor"
        KnownPositives.from_pairs(meta, meta, 2, 4)
    with pytest.raises(ValueError, match=r"^num must be an int >= 0, got -2$"):  # torch's negative dimension
        sample_unknown(known, torch.tensor([0, 1]), -2)
    tables = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"^k must be an int in \[1, 4\] \(the number of items\), got '5'$"):
        next(top_items(*tables, torch.tensor([0]), [], "5"))
