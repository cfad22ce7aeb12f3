"""bench/gpu_check.sh, the GPU check a session with a device runs: its dry run (the CPU-side steps)
must pass here, so that the script, its smoke workload and its benchmarks' arguments are not first
exercised on the scarce GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from batches import requires_kernels

ROOT = Path(__file__).resolve().parents[1]


@requires_kernels
def test_gpu_check_dry_run_passes_and_writes_its_report(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    report = (tmp_path / "gpu_check.md").read_text()
    assert run.returncode == 0, report
    for step in ("syntax", "linkage", "smoke-cpu", "bench-args", "profile-cpu", "epochs-collect"):
        assert f"| {step} | ok |" in report, report
    assert "gpu_smoke: table ops ok on cpu" in report


def test_gpu_check_rejects_an_unknown_argument(tmp_path):
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--bogus"], cwd=ROOT,
                         env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown argument '--bogus'" in run.stderr
    assert not (tmp_path / "gpu_check.md").exists()
