"""bench/gpu_check.sh, the GPU check a session with a device runs: its dry run (the CPU-side steps)
must pass here, so that the script, its smoke workload and its benchmarks' arguments are not first
exercised on the scarce GPU."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from batches import requires_kernels
from pnn_fast.data import default_data_dir

ROOT = Path(__file__).resolve().parents[1]


def gpu_check_finds_ml1m() -> bool:
    """Whether gpu_check.sh will find ML-1M, by its own rule: $PNN_FAST_DATA when set and not empty,
    else bench/.data when it holds ml-1m, else default_data_dir(); then ml-1m/train.txt under it."""
    data = os.environ.get("PNN_FAST_DATA") or (
        ROOT / "bench" / ".data" if (ROOT / "bench" / ".data" / "ml-1m").is_dir() else default_data_dir())
    return (Path(data) / "ml-1m" / "train.txt").exists()


#: the steps of gpu_check.sh --dry-run (the epoch profile only where the script finds ML-1M)
EPOCH_PROFILE = gpu_check_finds_ml1m()
DRY_RUN_STEPS = ("syntax", "linkage", "smoke-cpu", "bench-args", "profile-cpu", "epochs-collect") + (
    ("profile-epoch-cpu",) if EPOCH_PROFILE else ()) + ("sync-debug-cpu",)
#: the steps of gpu_check.sh --dry-run --quick
QUICK_DRY_RUN_STEPS = ("syntax", "capture-collect", "sync-debug-cpu", "bench-args")


@requires_kernels
def test_gpu_check_dry_run_passes_and_writes_its_report(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    report = (tmp_path / "gpu_check.md").read_text()
    assert run.returncode == 0, report
    for step in DRY_RUN_STEPS:
        assert f"| {step} | ok |" in report, report
    if not EPOCH_PROFILE:
        assert "| profile-epoch-cpu | skipped (no ML-1M under" in report, report
    assert "gpu_smoke: table ops ok on cpu" in report
    # the logs come back as one archive (the device tool returns only a few files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.md", "logs.tar.gz"]
    with tarfile.open(tmp_path / "logs.tar.gz") as archive:
        names = archive.getnames()
    for step in DRY_RUN_STEPS:
        assert f"logs/{step}.log" in names, names


def test_gpu_check_rejects_an_unknown_argument(tmp_path):
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--bogus"], cwd=ROOT,
                         env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown argument '--bogus'" in run.stderr, run.stderr
    assert not (tmp_path / "gpu_check.md").exists()


@requires_kernels
def test_gpu_check_quick_dry_run_passes(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--quick"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    report = (tmp_path / "gpu_check.md").read_text()
    assert run.returncode == 0, report
    for step in QUICK_DRY_RUN_STEPS:
        assert f"| {step} | ok |" in report, report
    assert "of its 180 s budget" in report
    assert "no synchronisation in a step" in report  # the sync-debug script ran every loss


def test_gpu_check_clips_slow_steps_to_its_budget(tmp_path):
    """Steps slowed to 30 s each under a 40 s budget (4 s kept for the report): the first times out at
    its own 10 s, the second at the 20-odd s left, and the rest are skipped; the whole check ends
    within its budget with a row for every step."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "BUDGET_S": "40", "RESERVE_S": "4", "STEP_DELAY_S": "30"}
    start = time.monotonic()
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--quick"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    report = (tmp_path / "gpu_check.md").read_text()
    assert took < 40 + 10, f"the check took {took:.0f} s of a 40 s budget"  # slack: the report and the archive
    assert run.returncode == 1, report  # a step timed out
    rows = dict(re.findall(r"^\| (\S+) \| ([^|]+) \|", report, flags=re.M))
    assert set(QUICK_DRY_RUN_STEPS) <= set(rows), report
    assert rows["syntax"].startswith("timed out after 10 s"), rows  # its own 10 s limit, under the 12 s delay
    assert re.match(r"timed out after \d+ s, clipped to the budget", rows["capture-collect"]), rows
    for step in ("sync-debug-cpu", "bench-args"):
        assert rows[step].startswith("skipped (the check had run"), rows
    assert (tmp_path / "logs.tar.gz").exists()


def test_gpu_check_report_survives_a_kill(tmp_path):
    """A call stopped mid-check (the device tool's limit) still returns the report of the steps that ran."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "STEP_DELAY_S": "2"}
    check = subprocess.Popen(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--quick"], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    report = tmp_path / "gpu_check.md"
    try:
        deadline = time.monotonic() + 90
        while not (report.exists() and "| syntax | ok |" in report.read_text()):
            assert time.monotonic() < deadline, "the first step never reached the report"
            time.sleep(0.2)
    finally:
        os.killpg(check.pid, signal.SIGKILL)
        check.wait()
    assert "| syntax | ok |" in report.read_text()
    with tarfile.open(tmp_path / "logs.tar.gz") as archive:
        assert "logs/syntax.log" in archive.getnames()


def test_gpu_study_stops_at_its_deadline_and_its_tar_resumes(tmp_path):
    """bench/gpu_study.sh on the CPU (the plan's device): a study far longer than its deadline, two
    cells trained at once (JOBS=2), is stopped with both cells' checkpoints in the tar, and a second
    call given that tar resumes a cell after the epoch the first one reached."""
    plan = tmp_path / "long.toml"  # 100,000 epochs: an idle machine trains about 40 a second
    plan.write_text('[study]\nname = "long"\nseeds = [1, 2]\nbaselines = []\nepochs = 100000\npatience = 100000\n'
                    '[[datasets]]\nname = "synthetic"\npath = "synthetic"\n'
                    '[[models]]\nname = "mf"\n[[configs]]\nname = "bpr"\n')
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    first = tmp_path / "first"
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_study.sh"), str(plan), "*", "30"], cwd=ROOT,
                         env={**env, "OUT": str(first), "STUDY_FOLDER": str(tmp_path / "a" / "long"), "JOBS": "2"},
                         capture_output=True, text=True, timeout=300)
    log = (first / "study.log").read_text()
    assert run.returncode == 0 and "stopping the study at its deadline" in log, run.stderr + log
    assert "2 to train (2 jobs x" in log, log
    with tarfile.open(first / "long.tar") as packed:
        names = packed.getnames()
    for seed in (1, 2):
        assert f"long/cells/synthetic/mf/bpr/seed{seed}/checkpoint.pt" in names, names
    assert not any(name.endswith("results.json") for name in names)

    second = tmp_path / "second"
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_study.sh"), str(plan), "*", "25"], cwd=ROOT,
                         env={**env, "OUT": str(second), "STUDY_FOLDER": str(tmp_path / "b" / "long"),
                              "RESUME_TAR": str(first / "long.tar")},
                         capture_output=True, text=True, timeout=300)
    log = (second / "study.log").read_text()
    assert "unpacked the cells of" in run.stderr, run.stderr
    resumed = re.search(r"resumed from \S+checkpoint\.pt after epoch (\d+)", log)
    assert resumed and int(resumed.group(1)) >= 1, log


def test_gpu_study_rejects_bad_arguments(tmp_path):
    for args, message in ((["studies/example.toml"], "usage: gpu_study.sh PLAN PATTERN [SECONDS]"),
                          (["studies/example.toml", "*", "0"], "SECONDS must be a positive integer, got '0'")):
        run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_study.sh"), *args], cwd=ROOT,
                             env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and message in run.stderr, run.stderr
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_study.sh"), "studies/example.toml", "*", "10"], cwd=ROOT,
                         env={**os.environ, "OUT": str(tmp_path), "JOBS": "two"}, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and "JOBS must be a positive integer, got 'two'" in run.stderr, run.stderr
