"""Faults in a training run, injected for real: SIGKILL in the middle of an epoch and in the middle of
a checkpoint write, SIGINT, a full disk, an unwritable output folder and a non-finite loss. Nothing
may be lost: a resumed run ends exactly where an uninterrupted one does, and the checkpoint on disk
is readable at every moment."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pnn_fast import _files as files
from pnn_fast._files import write_text_atomic
from pnn_fast.cli import main
from pnn_fast.data import synthetic_dataset
from pnn_fast.train import CheckpointWriteError, TrainConfig, Trainer, TrainingDiverged

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--loss", "pnn", "--epochs", "4", "--dim", "16", "--batch-size", "256", "--no-progress"]


def train_args(out: Path) -> list:
    return [*TRAIN, "--out", str(out)]


# every run of a comparison in its own process on one thread: the same arithmetic whatever the
# machine's core count or the test process's thread settings
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}


def train(out: Path, *extra: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pnn_fast", *train_args(out), *extra], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr


def metrics_of(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["test"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("uninterrupted")
    train(out)
    return metrics_of(out)


def start_paused(tmp_path: Path, stage: str, epoch: int, out: Path) -> subprocess.Popen:
    """The training process, once it sits at the pause (its flag file exists)."""
    flag = tmp_path / f"{stage}.flag"
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fault_target.py"), str(flag), stage,
                                str(epoch), "--", *train_args(out)], env=ENV, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not flag.exists():
        if process.poll() is not None:
            pytest.fail(f"the run ended before its pause: {process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the run never reached its pause")
        time.sleep(0.05)
    return process


@pytest.mark.parametrize("stage", ["batch", "save"])
def test_sigkill_then_resume_ends_exactly_where_an_uninterrupted_run_does(tmp_path, uninterrupted, stage):
    out = tmp_path / "run"
    process = start_paused(tmp_path, stage, 3, out)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    # killed in epoch 3, or while its checkpoint's new file was written: on disk is epoch 2's, whole
    assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] == 2
    assert not (out / "results.json").exists()
    train(out, "--resume")
    assert metrics_of(out) == uninterrupted
    assert not (out / "checkpoint.tmp").exists()


def test_sigint_stops_with_the_checkpoint_kept_and_says_how_to_resume(tmp_path, uninterrupted):
    out = tmp_path / "run"
    process = start_paused(tmp_path, "batch", 3, out)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()  # a no-op once it has exited; never leave it sleeping if it did not
    assert process.returncode == 130, err
    assert "interrupted in epoch 3" in err and "--resume" in err and "Traceback" not in err, err
    assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] == 2
    train(out, "--resume")
    assert metrics_of(out) == uninterrupted


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_says_so(tmp_path, monkeypatch):
    trainer = Trainer(synthetic_dataset(num_users=40, num_items=30, seed=1), TrainConfig(loss="bpr", epochs=3, dim=8),
                      tmp_path)
    save, calls = torch.save, []

    def full_disk_on_the_second(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            Path(f).write_bytes(b"partial")  # what a full disk leaves behind
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_on_the_second)
    with pytest.raises(CheckpointWriteError, match=r"after epoch 2: No space left on device; the previous "
                                                   r"checkpoint there is intact"):
        trainer.fit(progress=False, log=lambda *_: None)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["epoch"] == 1
    assert not (tmp_path / "checkpoint.tmp").exists()


@pytest.mark.parametrize("failing", ["write", "rename"])
def test_results_and_summaries_are_written_whole_or_not_at_all(tmp_path, monkeypatch, failing):
    """results.json (a study's mark of a finished cell) and the summaries: a full disk mid-write, or
    a failed rename, leaves the previous file as it was and no temporary file behind."""
    target = tmp_path / "results.json"
    write_text_atomic(target, '{"old": 1}')
    write_text = Path.write_text

    def full_disk(path, text, *args, **kwargs):
        write_text(path, text[:3], *args, **kwargs)  # what a full disk leaves behind
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def failed_rename(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    if failing == "write":
        monkeypatch.setattr(Path, "write_text", full_disk)
    else:
        monkeypatch.setattr(files.os, "replace", failed_rename)
    with pytest.raises(OSError):
        write_text_atomic(target, '{"new": 2}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_an_unwritable_output_folder_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main([*TRAIN, "--out", str(blocker / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"pnn-fast: error: output folder {blocker / 'run'}: cannot write there")
    assert "\n" not in err


def test_a_non_finite_loss_stops_at_its_batch_names_its_terms_and_keeps_the_last_good_epoch(tmp_path):
    data = synthetic_dataset(num_users=40, num_items=30, seed=1)
    trainer = Trainer(data, TrainConfig(loss="pnn", epochs=5, dim=8, batch_size=64), tmp_path)
    start_epoch = trainer.model.on_epoch_start

    def poisoned(generator):  # epoch 2 starts from item embeddings that overflowed
        start_epoch(generator)
        if trainer.epoch == 1:
            with torch.no_grad():
                trainer.model.item_embedding.weight.fill_(float("inf"))

    trainer.model.on_epoch_start = poisoned
    with pytest.raises(TrainingDiverged, match=r"the loss of epoch 2, batch 1 of \d+ is not finite \(non-finite "
                                               r"terms: .*bpr.*\); the last finite epoch is 1") as caught:
        trainer.fit(progress=False, log=lambda *_: None)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["epoch"] == 1
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "diverged" and record["last_finite_epoch"] == 1
    assert record["error"] == str(caught.value) and len(record["epochs"]) == 1
