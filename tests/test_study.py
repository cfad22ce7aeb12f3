"""``pnn-fast study``: the summary's statistics against a recomputation, resume, --jobs, failures, bad plans."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t, ttest_rel

from pnn_fast.cli import main
from pnn_fast.csr import CSR
from pnn_fast.data import synthetic_dataset
from pnn_fast.study import holm_adjusted, load_plan
from pnn_fast.train import TrainConfig, run

ROOT = Path(__file__).resolve().parents[1]

# 2 x 3 + 2 cells of two tiny epochs on the built-in data; "dns16" has two seeds only
PLAN = """\
[study]
name = "tiny"
seeds = [1, 2, 3]
dim = 8
epochs = 2
batch_size = 256
patience = 5

[[datasets]]
name = "syn"
path = "synthetic"

[[models]]
name = "mf"

[[configs]]
name = "bpr"

[[configs]]
name = "dns"
loss_args = { candidates = 4 }

[[configs]]
name = "dns16"
loss = "dns"
loss_args = { candidates = 16 }
seeds = [1, 2]
"""
METRICS = ("recall@20", "ndcg@20")


def study(plan, out, *options) -> int:
    return main(["study", str(plan), "--out", str(out), "--threads", "1", "--no-progress", *options])


def cell_results(out, key) -> dict:
    return json.loads((out / "cells" / key / "results.json").read_text())


def results_files(out) -> dict:
    """{cell key: results.json mtime in ns} of every finished cell under ``out``."""
    cells = out / "cells"
    return {str(p.parent.relative_to(cells)): p.stat().st_mtime_ns for p in cells.rglob("results.json")}


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """The plan trained with one job: (plan file, output folder). Tests that change it work on a copy."""
    folder = tmp_path_factory.mktemp("study")
    plan = folder / "tiny.toml"
    plan.write_text(PLAN)
    assert study(plan, folder / "out", "--jobs", "1") == 0
    return plan, folder / "out"


def test_every_cell_finishes_and_the_summary_matches_a_recomputation(finished_study):
    _, out = finished_study
    seeds = {"bpr": [1, 2, 3], "dns": [1, 2, 3], "dns16": [1, 2]}
    assert set(results_files(out)) == {f"syn/mf/{c}/seed{s}" for c, ss in seeds.items() for s in ss}
    runs = {c: {s: cell_results(out, f"syn/mf/{c}/seed{s}") for s in ss} for c, ss in seeds.items()}
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["cells"], summary["finished"], summary["unfinished"]) == (8, 8, [])
    rows = {row["config"]: row for row in summary["groups"]}
    assert list(rows) == ["bpr", "dns", "dns16"]
    for config, row in rows.items():
        assert row["finished_seeds"] == seeds[config]
        assert row["mean_best_epoch"] == pytest.approx(np.mean([r["best_epoch"] for r in runs[config].values()]))
        assert row["mean_epoch_seconds"] == pytest.approx(np.mean([r["mean_epoch_seconds"]
                                                                   for r in runs[config].values()]))
        for metric in METRICS:
            values = [r["test"][metric] for r in runs[config].values()]
            assert row[metric]["mean"] == pytest.approx(np.mean(values))
            assert row[metric]["std"] == pytest.approx(np.std(values, ddof=1))
            assert set(row["vs"]) == {"bpr", "dns"} - {config}
            for baseline, comparison in row["vs"].items():
                base = [r["test"][metric] for r in runs[baseline].values()]
                assert comparison[metric]["lift_percent"] == pytest.approx(100 * (np.mean(values) / np.mean(base) - 1))
                paired = sorted(set(runs[config]) & set(runs[baseline]))
                expected = ttest_rel([runs[config][s]["test"][metric] for s in paired],
                                     [runs[baseline][s]["test"][metric] for s in paired])
                assert comparison[metric]["pairs"] == len(paired)
                assert comparison[metric]["t"] == pytest.approx(expected.statistic)
                assert comparison[metric]["p"] == pytest.approx(expected.pvalue)
                # the interval by hand: mean paired difference +- t(0.975, n - 1) s / sqrt(n), over the
                # paired seeds' baseline mean
                differences = np.array([runs[config][s]["test"][metric] - runs[baseline][s]["test"][metric]
                                        for s in paired])
                half = student_t.ppf(0.975, len(paired) - 1) * differences.std(ddof=1) / np.sqrt(len(paired))
                scale = 100 / np.mean([runs[baseline][s]["test"][metric] for s in paired])
                assert comparison[metric]["paired_lift_percent"] == pytest.approx(scale * differences.mean())
                assert comparison[metric]["ci95_percent"] == pytest.approx(
                    [scale * (differences.mean() - half), scale * (differences.mean() + half)])
    markdown = (out / "summary.md").read_text()
    assert "| dns16 | dns | 2/2 |" in markdown and "## syn · mf" in markdown
    assert summary["seeds"] == [1, 2, 3]
    assert "Planned with fewer seeds than the study's 3: `syn/mf/dns16` 2 (seeds 1, 2).\n" in markdown
    # dns16 (seeds 1-2) against bpr (seeds 1-3): the lift of the means, then the paired lift that the
    # interval is centred on; dns against bpr (the same seeds) has one lift, so no "paired"
    comparison = rows["dns16"]["vs"]["bpr"]["ndcg@20"]
    interval = comparison["ci95_percent"]
    assert (f"{comparison['lift_percent']:+.4f}% (paired {comparison['paired_lift_percent']:+.4f}%, "
            f"95% CI [{interval[0]:+.2f}%, {interval[1]:+.2f}%]") in markdown
    same_seeds = rows["dns"]["vs"]["bpr"]["ndcg@20"]
    assert same_seeds["paired_lift_percent"] == pytest.approx(same_seeds["lift_percent"])
    assert f"{same_seeds['lift_percent']:+.4f}% (95% CI" in markdown
    assert (out / "plots" / "syn.mf.png").stat().st_size > 0


def test_two_jobs_give_the_results_of_one(finished_study, tmp_path):
    plan, out = finished_study
    assert study(plan, tmp_path, "--jobs", "2") == 0
    assert set(results_files(tmp_path)) == set(results_files(out))
    for key in results_files(out):
        assert cell_results(tmp_path, key)["test"] == cell_results(out, key)["test"], key


def test_a_rerun_trains_only_unfinished_cells_and_resumes_from_checkpoints(finished_study, tmp_path, capfd):
    plan, finished = finished_study
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    restarted, resumed = "syn/mf/bpr/seed2", "syn/mf/dns/seed1"
    (out / "cells" / restarted / "results.json").unlink()
    (out / "cells" / restarted / "checkpoint.pt").unlink()
    # the resumed cell: one epoch of the plan's settings, then interrupted (a checkpoint, no results)
    shutil.rmtree(out / "cells" / resumed)
    one_epoch = run(synthetic_dataset(), TrainConfig(loss="dns", loss_args={"candidates": 4}, dim=8, epochs=1,
                                                     batch_size=256, patience=5, seed=1),
                    out / "cells" / resumed, progress=False, log=lambda *_: None)
    (out / "cells" / resumed / "results.json").unlink()
    untouched = results_files(out)

    assert study(plan, out, "--summary-only") == 0
    unfinished = json.loads((out / "summary.json").read_text())["unfinished"]
    assert [(u["cell"], u["status"].split()[0]) for u in unfinished] == [(restarted, "not"), (resumed, "interrupted")]

    capfd.readouterr()
    assert study(plan, out, "--jobs", "1") == 0
    printed = capfd.readouterr().out  # the workers' lines too
    assert "6 finished before, 2 to train" in printed and f"{resumed}  resumed from" in printed
    after = results_files(out)
    assert {k: after[k] for k in untouched} == untouched
    history = cell_results(out, resumed)["epochs"]
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[0] == one_epoch["epochs"][0]  # its loss, and its measured time: carried over, not rerun
    for key in (restarted, resumed):  # a restart or a resume ends where an uninterrupted run does
        assert cell_results(out, key)["test"] == cell_results(finished, key)["test"], key
    assert json.loads((out / "summary.json").read_text())["unfinished"] == []


@pytest.mark.parametrize("which", ["data", "split"])
def test_a_cell_trained_on_other_data_stops_the_summary_and_the_study_in_one_line(finished_study, tmp_path,
                                                                                   capsys, which):
    """Issue 67: the runner compares each finished cell's data fingerprint with what its plan entry
    gives now, before training more and before pairing seeds in a summary."""
    plan, finished = finished_study
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    stale = out / "cells" / "syn" / "mf" / "dns" / "seed2" / "results.json"
    record = json.loads(stale.read_text())
    record["fingerprint"][which] = "0123456789abcdef"
    stale.write_text(json.dumps(record))
    (out / "cells" / "syn" / "mf" / "bpr" / "seed1" / "results.json").unlink()  # one cell left to train
    for options in (("--summary-only",), ("--jobs", "1")):
        capsys.readouterr()
        assert study(plan, out, *options) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"pnn-fast: error: {stale}: trained on another {which} than the plan's dataset 'syn'"), err
        assert f"{which} fingerprint 0123456789abcdef, now " in err and "delete the cell's folder" in err
        assert "\n" not in err
    assert not (out / "cells" / "syn" / "mf" / "bpr" / "seed1" / "results.json").exists()  # nothing trained


def test_cells_from_before_fingerprints_are_summarised_with_a_warning(finished_study, tmp_path, capsys):
    plan, finished = finished_study
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    for path in (out / "cells").rglob("results.json"):
        record = json.loads(path.read_text())
        del record["fingerprint"]
        path.write_text(json.dumps(record))
    capsys.readouterr()
    assert study(plan, out, "--summary-only") == 0
    err = capsys.readouterr().err.strip()
    assert err == "pnn-fast: warning: 8 finished cell(s) of tiny predate data fingerprints: their data and split are not checked"


def test_a_cut_short_results_file_is_one_line_naming_it(finished_study, tmp_path, capsys):
    """A results.json cut short (a crash mid-write, before these were written atomically): the study
    says which file and how to recover, in one line, instead of a traceback."""
    plan, finished = finished_study
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    broken = out / "cells" / "syn" / "mf" / "bpr" / "seed2" / "results.json"
    broken.write_text(broken.read_text()[:40])
    capsys.readouterr()
    assert study(plan, out, "--summary-only") == 2
    err = capsys.readouterr().err.strip()
    assert f"{broken}: not valid JSON" in err and "delete it to train the cell again" in err, err
    assert "\n" not in err and "Traceback" not in err


def test_a_failing_cell_is_reported_and_the_others_finish(tmp_path, capsys):
    """A cell that fails as it runs (here its data file, which the plan's check does not read) is
    reported in one line and the other cells finish."""
    (tmp_path / "broken.csv").write_text("user,item\n1,2\nuser,item\n")  # a header line inside the data
    plan = tmp_path / "failing.toml"
    plan.write_text(PLAN.replace("seeds = [1, 2, 3]", "seeds = [1]").split("[[configs]]")[0]
                    + f'[[datasets]]\nname = "broken"\npath = "{tmp_path / "broken.csv"}"\n\n'
                      '[[configs]]\nname = "bpr"\n')
    assert study(plan, tmp_path / "out", "--jobs", "1") == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "1 of 2 cells failed" in error and "broken/mf/bpr/seed1" in error
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["finished"] == 1
    [failure] = summary["unfinished"]
    assert failure["cell"] == "broken/mf/bpr/seed1" and failure["status"] == "failed"
    assert "a header line" in failure["error"] and "\n" not in failure["error"]
    assert "broken/mf/bpr/seed1`: failed: DataFormatError:" in (tmp_path / "out" / "summary.md").read_text()


def test_a_bad_loss_argument_fails_the_plan_before_any_cell_trains(tmp_path, capsys):
    """The plan's check builds each loss on small data: a bad value no longer fails its cell after
    the cells before it trained."""
    plan = tmp_path / "bad.toml"
    plan.write_text(PLAN.replace("seeds = [1, 2, 3]", "seeds = [1]").split("[[configs]]")[0]
                    + '[[configs]]\nname = "bpr"\n\n[[configs]]\nname = "broken"\nloss = "pnn"\n'
                      'loss_args = { neg_size = "bogus" }\n')
    assert study(plan, tmp_path / "out", "--jobs", "1") == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"pnn-fast: error: {plan}: syn/mf/broken: neg_size must be 'proportional', 'count' or an "
                     f"int >= 0, got 'bogus'"), error
    assert not (tmp_path / "out").exists()


def test_a_diverged_cell_counts_as_failed_and_is_not_retried(tmp_path, capsys):
    """A cell whose training diverged leaves a results.json saying so (the trainer's record); the
    summary lists it as failed with its error, and a rerun does not train it again."""
    plan = tmp_path / "one.toml"
    plan.write_text(PLAN.replace("seeds = [1, 2, 3]", "seeds = [1]").split("[[configs]]")[0]
                    + '[[configs]]\nname = "bpr"\n')
    folder = tmp_path / "out" / "cells" / "syn" / "mf" / "bpr" / "seed1"
    folder.mkdir(parents=True)
    error = "training diverged: the loss of epoch 2, batch 1 of 4 is not finite; the last finite epoch is 1"
    (folder / "results.json").write_text(json.dumps({"status": "diverged", "error": error}))
    assert study(plan, tmp_path / "out", "--jobs", "1") == 0
    assert "1 cells, 1 finished before, 0 to train" in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["finished"] == 0
    assert summary["unfinished"] == [{"cell": "syn/mf/bpr/seed1", "status": "failed", "error": error}]


def test_holm_adjusts_step_down_and_counts_unfinished_members():
    # ascending 0.01, 0.03, 0.04 in a family of 3: 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert holm_adjusted([0.04, 0.01, 0.03], 3) == pytest.approx([0.06, 0.03, 0.06])
    # a member without a p-value still counts: 3 x 0.01, 2 x 0.02
    assert holm_adjusted([0.01, None, 0.02], 3)[::2] == pytest.approx([0.03, 0.04])
    assert holm_adjusted([0.01, None, 0.02], 3)[1] is None
    assert holm_adjusted([0.5, 0.9], 2) == [1.0, 1.0]  # capped at 1, and never below an earlier one
    assert holm_adjusted([0.2], 1) == [0.2]
    with pytest.raises(ValueError, match="family_size 1 is below the 2 members given"):
        holm_adjusted([0.1, 0.2], 1)


def test_the_holm_family_gets_adjusted_p_values_against_each_baseline(finished_study, tmp_path):
    plan, out = finished_study
    holm_plan = tmp_path / "holm.toml"
    holm_plan.write_text(PLAN.replace('patience = 5\n', 'patience = 5\nholm = ["dns", "dns16"]\n'))
    copied = tmp_path / "out"
    shutil.copytree(out, copied)
    assert study(holm_plan, copied, "--summary-only") == 0
    rows = {row["config"]: row for row in json.loads((copied / "summary.json").read_text())["groups"]}
    for metric in METRICS:
        p_dns, p_dns16 = rows["dns"]["vs"]["bpr"][metric]["p"], rows["dns16"]["vs"]["bpr"][metric]["p"]
        expected = holm_adjusted([p_dns, p_dns16], 2)
        assert rows["dns"]["vs"]["bpr"][metric]["p_holm"] == pytest.approx(expected[0])
        assert rows["dns16"]["vs"]["bpr"][metric]["p_holm"] == pytest.approx(expected[1])
        # against dns the family is dns16 alone: nothing to correct
        assert rows["dns16"]["vs"]["dns"][metric]["p_holm"] == pytest.approx(rows["dns16"]["vs"]["dns"][metric]["p"])
        assert rows["bpr"]["vs"]["dns"][metric]["p_holm"] is None  # bpr is not in the family
    assert f"(Holm {rows['dns']['vs']['bpr']['ndcg@20']['p_holm']:.3g})" in (copied / "summary.md").read_text()


@pytest.mark.parametrize("change, where", [
    (("name = \"dns\"\n", "name = \"dns\"\nlearning_rate = 0.1\n"), "configs[1].learning_rate: unknown key"),
    (("loss = \"dns\"\n", "loss = \"dnz\"\n"), "configs[2].loss: unknown loss 'dnz'"),
    (("{ candidates = 4 }", "{ candidatez = 4 }"), "configs[1].loss_args.candidatez"),
    (("[[models]]\nname = \"mf\"\n", "[[models]]\nname = \"mf\"\nmodel_args = { reg_weight = 1e-4 }\n"),
     "models[0].model_args.reg_weight: model 'mf' has no such argument; valid: []"),
    (("dim = 8", "dim = 8\nlr = nan"), "study: lr must be a finite number > 0, got nan"),
    (("path = \"synthetic\"", "path = \"no/such/folder\""), "datasets[0].path: no such file or folder"),
    (("path = \"synthetic\"", "path = \".\"\nhide_train_share = 1.5"),
     "datasets[0].hide_train_share: expected a number in [0, 1), got 1.5"),
    (("path = \"synthetic\"", "path = \"synthetic\"\nhide_train_share = 0.1"),
     "datasets[0].hide_train_share: the built-in synthetic data takes no loading options"),
    (("seeds = [1, 2, 3]\n", ""), "study.seeds: missing"),
    (("name = \"dns16\"", "name = \"dns\""), "configs[2].name: 'dns' is also configs[1]"),
    (("dim = 8", "dim = \"8\""), "study.dim: expected an integer"),
    (("epochs = 2", "epochs = 0"), "study: epochs must be a positive int"),
    (("patience = 5\n", "patience = 5\nholm = [\"dns\", \"sl\"]\n"), "study.holm: ['sl'] name no config"),
])
def test_a_bad_plan_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, change, where):
    plan = tmp_path / "bad.toml"
    old, new = change
    assert PLAN.count(old) == 1
    plan.write_text(PLAN.replace(old, new))
    assert study(plan, tmp_path / "out") == 2
    error = capsys.readouterr().err
    assert error.startswith(f"pnn-fast: error: {plan}: {where}") and error.count("\n") == 1, error
    assert not (tmp_path / "out").exists()  # checked before anything trains


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_study_stops_the_workers_too(tmp_path, signum):
    """`kill` or `kill -INT` of a running study ends its worker processes (no orphan keeps training),
    and leaves no named semaphore behind for the resource tracker to warn of.
    The study starts with SIGINT at its default, as under a terminal: a shell script's `cmd &` starts
    it ignored, which Python keeps (studies/README.md says to use `kill` then)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "pnn_fast", "study", str(ROOT / "studies" / "example.toml"),
                             "--out", str(tmp_path), "--jobs", "1", "--threads", "1", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(tmp_path.rglob("checkpoint.pt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children, "the study started no worker"
    proc.send_signal(getattr(signal, signum))
    _, stderr = proc.communicate(timeout=60)  # also waits for the resource tracker, which shares stderr
    assert proc.returncode != 0
    assert "leaked" not in stderr, stderr
    time.sleep(1)
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()
             and "spawn" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert alive == []


def test_the_alpha_beta_script_draws_the_grid_and_chooses_on_valid(tmp_path):
    """studies/alpha_beta.py on a real 2 x 2 grid of one-epoch PNN runs (one point left unfinished)."""
    grid = "".join(f'\n[[configs]]\nname = "pnn-a{a}-b{b}"\nloss = "pnn"\nloss_args = {{ alpha = {a}.0, beta = {b}.0 }}\n'
                   for a in (0, 1) for b in (0, 1))
    plan = tmp_path / "grid.toml"
    plan.write_text(PLAN.replace("seeds = [1, 2, 3]", "seeds = [1]").replace("epochs = 2", "epochs = 1") + grid)
    out = tmp_path / "out"
    assert study(plan, out, "--only", "syn/mf/[!p]*/*") == 0  # the baselines
    assert study(plan, out, "--only", "syn/mf/pnn-a[01]-b0/*") == 0
    assert study(plan, out, "--only", "syn/mf/pnn-a0-b1/*") == 0  # pnn-a1-b1 stays unfinished
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "alpha_beta.py"), str(plan), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    table = (out / "alpha_beta.md").read_text()
    assert "3 of 4 grid points finished" in table and (out / "alpha_beta.png").stat().st_size > 0
    valid = {}
    for a in (0, 1):
        for b in (0, 1):
            path = out / "cells" / "syn" / "mf" / f"pnn-a{a}-b{b}" / "seed1" / "results.json"
            if path.exists():
                valid[(a, b)] = json.loads(path.read_text())["best_valid"]
    (a, b), best = max(valid.items(), key=lambda item: item[1])
    assert f"**Chosen on valid** among the finished points: alpha {a}, beta {b} (valid {best:.4f}" in table
    assert "| 1 | " in table and " — |" in table  # the unfinished point is blank
    assert "- dns: valid" in table and "- bpr: valid" in table


def test_the_intervals_script_reads_each_lift_and_its_interval_against_the_bar(finished_study, tmp_path):
    """studies/intervals.py on a real summary: a row per config paired with the baseline, the summary's
    numbers, and the verdict from where the interval lies against --bar; a file that is not a summary
    is one line naming it."""
    _, out = finished_study
    summary = json.loads((out / "summary.json").read_text())
    comparison = {row["config"]: row["vs"]["bpr"]["ndcg@20"] for row in summary["groups"] if "bpr" in row["vs"]}
    low, high = comparison["dns"]["ci95_percent"]
    script = [sys.executable, str(ROOT / "studies" / "intervals.py"), str(out / "summary.json"), "--baseline", "bpr"]
    # a bar below, above and inside dns's interval
    for bar, verdict in ((low - 1, "clears"), (high + 1, "excluded"), ((low + high) / 2, "open")):
        done = subprocess.run(script + ["--bar", str(bar)], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        lines = {line.split(" | ")[2]: line for line in done.stdout.splitlines()[2:]}
        assert set(lines) == {"dns", "dns16"}  # bpr itself has no row
        c = comparison["dns"]
        assert lines["dns"] == (f"| tiny | syn · mf | dns | {c['pairs']} | {c['paired_lift_percent']:+.2f}% "
                                f"| [{low:+.2f}%, {high:+.2f}%] | {c['p']:.2g} | {verdict} |")
        c16 = comparison["dns16"]  # seeds 1-2 against bpr's 1-3: the row gives the interval's centre
        assert f"| dns16 | {c16['pairs']} | {c16['paired_lift_percent']:+.2f}% |" in lines["dns16"]
    bad = tmp_path / "summary.json"
    bad.write_text("{")
    done = subprocess.run(script[:2] + [str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and done.stderr.strip().startswith(f"{bad}: cannot read a study summary")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_sl_classes_script_places_the_draws_of_trained_sl_models(tmp_path):
    """studies/sl_classes.py on real one-epoch SL runs: the negative class is the lowest-scored draws,
    so it holds less of the softmax mass than its share of the draws, the top draws more, and the
    false negatives it counts are the valid items among the draws, K |valid| / |unknown|
    of them a row in expectation."""
    plan = tmp_path / "sl.toml"
    plan.write_text(PLAN.split("[[configs]]")[0].replace("seeds = [1, 2, 3]", "seeds = [1]").replace(
        "epochs = 2", "epochs = 1") + '[[configs]]\nname = "sl"\nloss = "sl"\nloss_args = { num_negatives = 64 }\n'
        '[[configs]]\nname = "sl-pnn"\nloss = "sl"\nloss_args = { num_negatives = 64, neutral_weight = 0.5 }\n')
    out = tmp_path / "out"
    assert study(plan, out) == 0
    report = tmp_path / "placement.json"
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "sl_classes.py"), str(plan), "--configs", "sl,sl-pnn",
                           "--study-folder", str(out), "--out", str(report)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = json.loads(report.read_text())
    assert [row["cell"] for row in rows] == ["syn/mf/sl/seed1", "syn/mf/sl-pnn/seed1"]
    data = load_plan(plan).cells[0].dataset.load()
    train = CSR.from_pairs(*data.train, data.num_users, data.num_items)
    valid = CSR.from_pairs(*data.valid, data.num_users, data.num_items)
    train_counts, valid_counts = train.indptr.diff().double(), valid.indptr.diff().double()
    has_valid = valid_counts > 0
    expected = (64 * valid_counts / (data.num_items - train_counts))[has_valid].mean().item()
    # the count a row is about Poisson, so its mean over the rows is within 4 standard errors
    tolerance = 4 * (expected / int(has_valid.sum())) ** 0.5
    for row in rows:
        assert row["rows"] == int(has_valid.sum())
        assert abs(row["false_negatives"] - expected) < tolerance, (row["false_negatives"], expected)
        assert 0 < row["negative_class_softmax_mass"] < row["negative_class_share_of_draws"]
        # and the 8 highest draws (--top's default) hold more than their 8 / 64 share of it
        assert row["top_share_of_draws"] == 8 / 64 < row["top_softmax_mass"] < 1
        assert 0 <= row["top_share_of_false_negatives"] <= 1
        assert 0 < row["false_negative_softmax_mass"] < 1
        assert 0 <= row["negative_class_share_of_false_negatives"] <= 1
