"""The loss library installs and imports alone; the ``pnn-fast`` command says in one line when the
``train`` extra it needs is missing."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN_ONLY = ("tqdm", "scipy", "matplotlib")


def _without_train_extra(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter where the train extra's packages cannot be imported."""
    block = ("import sys\n"
             "class Absent:  # what an interpreter without these packages raises on importing them\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             f"        if name.split('.')[0] in {TRAIN_ONLY!r}:\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name.split('.')[0])\n"
             "sys.meta_path.insert(0, Absent())\n")
    return subprocess.run([sys.executable, "-c", block + code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_core_dependencies_are_the_built_torch_and_numpy_and_the_trainer_is_an_extra(tmp_path):
    """The package's metadata (what a wheel declares) requires exactly the torch the kernels are built
    against, and numpy; nothing of the trainer's."""
    import torch

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dynamic"] == ["dependencies"] and "dependencies" not in project
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300, env={**os.environ, "USE_CUDA": "0"})
    requires = (tmp_path / "pnn_fast.egg-info" / "requires.txt").read_text().split("\n\n")[0].split()
    assert requires == [f"torch=={torch.__version__.split('+')[0]}", "numpy"]
    train = project["optional-dependencies"]["train"]
    for name in TRAIN_ONLY:
        assert any(d.startswith(name) for d in train), train
    assert "pnn_fast[train]" in project["optional-dependencies"]["test"]
    assert project["scripts"]["pnn-fast"] == "pnn_fast.command:main"


def test_the_loss_library_imports_and_trains_without_the_train_extra():
    run = _without_train_extra(
        "import torch\n"
        "from pnn_fast import DNSLoss, KnownPositives, PNNLoss, SampledSoftmaxLoss, sample_unknown\n"
        "from pnn_fast.eval import evaluate\n"
        "from pnn_fast.recommend import top_items\n"
        "known = KnownPositives.from_pairs(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]), 2, 5)\n"
        "users, table = torch.nn.Embedding(2, 4), torch.nn.Embedding(5, 4)\n"
        "loss = PNNLoss(known, 4)(users(torch.tensor([0, 1])), table.weight, torch.tensor([0, 1]), torch.tensor([0, 2]))\n"
        "loss.backward()\n"
        "print('ok', float(loss) == float(loss))\n")
    assert run.returncode == 0 and run.stdout.strip() == "ok True", run.stderr


@pytest.mark.parametrize("entry", ["from pnn_fast.command import main; sys.exit(main(['train']))",
                                   "import runpy; runpy.run_module('pnn_fast', run_name='__main__')"])
def test_the_command_without_the_train_extra_says_how_to_install_it(entry):
    run = _without_train_extra(entry)
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip() == ('pnn-fast: the trainer needs the train extra (tqdm is not installed): '
                                  'pip install "pnn_fast[train]"')


def test_the_sdist_holds_every_kernel_source_and_no_build_output(tmp_path):
    """An sdist builds the kernels on the machine that installs it: it must carry every file under
    csrc/ (the headers and the CUDA sources too, which setup.py's source list does not name), and
    none of this checkout's build outputs or data."""
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300, env={**os.environ, "USE_CUDA": "0"})
    (archive,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {Path(*Path(name).parts[1:]).as_posix() for name in tar.getnames()}
    kernel_sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "csrc").rglob("*") if path.is_file()}
    assert kernel_sources <= names, sorted(kernel_sources - names)
    assert {"setup.py", "pyproject.toml", "README.md", "pnn_fast/losses.py"} <= names
    assert not [n for n in names if n.endswith((".so", ".o", ".pt")) or n.startswith(("build/", "bench/.data"))]
