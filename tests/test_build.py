"""Build system and extension loading: variant choice, build record, import-time checks."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from pnn_fast import _extension, build_info

ROOT = Path(__file__).resolve().parents[1]
OPS = ("hard_negative_argmax", "count_unlabeled", "bottom_k_select", "class_centroids_fwd", "class_centroids_bwd",
       "pairwise_uniformity_fwd", "pairwise_uniformity_bwd")
compiled = pytest.mark.skipif(not build_info()["compiled"], reason="pnn_fast._C is not built")


def test_build_info_keys():
    info = build_info()
    assert {"compiled", "with_cuda", "torch_version", "cuda_version", "cuda_arch_list"} <= set(info)
    assert isinstance(info["compiled"], bool) and isinstance(info["with_cuda"], bool)
    if info["compiled"]:
        assert info["torch_version"] == torch.__version__
        assert "variant_reason" in info
    else:
        assert info["reason"]


@compiled
def test_every_op_has_its_kernels():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in OPS:
        assert has(f"pnn_fast::{op}", "CPU"), op
        assert has(f"pnn_fast::{op}", "CUDA") == build_info()["with_cuda"], op


def test_require_kernels_says_how_to_rebuild(monkeypatch):
    monkeypatch.setitem(_extension._INFO, "compiled", True)
    monkeypatch.setitem(_extension._INFO, "with_cuda", False)
    monkeypatch.setitem(_extension._INFO, "variant_reason", "USE_CUDA=0")
    assert _extension.has_kernels("cpu") and not _extension.has_kernels("cuda")
    with pytest.raises(RuntimeError, match=r"built without CUDA kernels \(USE_CUDA=0\).*FORCE_CUDA=1 "
                                           r"TORCH_CUDA_ARCH_LIST=.*pip install --no-build-isolation -e \."):
        _extension.require_kernels(torch.device("cuda", 0))
    monkeypatch.setitem(_extension._INFO, "compiled", False)
    monkeypatch.setitem(_extension._INFO, "reason", "pnn_fast._C is not built")
    with pytest.raises(RuntimeError, match="no compiled kernels: pnn_fast._C is not built"):
        _extension.require_kernels(torch.device("cpu"))


@compiled
def test_a_build_for_another_torch_is_refused(monkeypatch, tmp_path):
    record = tmp_path / "_build_info.json"
    record.write_text(json.dumps({"torch_version": "1.0.0", "with_cuda": False}))
    monkeypatch.setattr(_extension, "_BUILD_INFO_FILE", record)
    with pytest.raises(ImportError, match=rf"built against torch 1\.0\.0, but torch {re.escape(torch.__version__)} is imported"):
        _extension._load()


def test_missing_extension_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(_extension.importlib.util, "find_spec", lambda name: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = _extension._load()
    assert not info["compiled"] and "not built" in info["reason"]
    assert [str(w.message) for w in caught] == [
        f"{info['reason']}; the pure-PyTorch reference backend will be used"]


def setup_variant(**env) -> subprocess.CompletedProcess:
    """`python setup.py --name` under `env`: prints the variant line without building."""
    full_env = {**os.environ, **env}
    for name in ("USE_CUDA", "FORCE_CUDA", "FORCE_ONLY_CPU"):
        if name not in env:
            full_env.pop(name, None)
    return subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_setup_variant_choice():
    cpu = setup_variant(USE_CUDA="0")
    assert cpu.returncode == 0 and "building the CPU-only variant: USE_CUDA=0" in cpu.stdout
    no_toolkit = setup_variant(CUDA_HOME="/nonexistent")
    assert no_toolkit.returncode == 0
    assert "CPU-only variant: CUDA_HOME=/nonexistent has no bin/nvcc" in no_toolkit.stdout
    forced = setup_variant(CUDA_HOME="/nonexistent", FORCE_CUDA="1")
    assert forced.returncode != 0 and "FORCE_CUDA=1 but CUDA_HOME=/nonexistent has no bin/nvcc" in forced.stderr


def test_project_metadata():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert (project["name"], project["version"], project["requires-python"]) == ("pnn_fast", "0.1.0", ">=3.9")
    assert project["dependencies"] == ["torch>=2.4", "numpy", "tqdm", "matplotlib"]
    assert project["optional-dependencies"]["test"] == ["pytest", "pytest-benchmark", "numpy"]
    assert project["scripts"] == {"pnn-fast": "pnn_fast.cli:main"}
    assert set(meta["build-system"]["requires"]) >= {"wheel", "torch"}
    from setuptools import find_packages

    found = find_packages(where=str(ROOT), **meta["tool"]["setuptools"]["packages"]["find"])
    assert {"pnn_fast", "pnn_fast.data", "pnn_fast.models"} <= set(found)
