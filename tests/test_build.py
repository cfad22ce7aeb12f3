"""Build system and extension loading: variant choice, build record, import-time checks."""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import pnn_fast
from pnn_fast import _extension, build_info

ROOT = Path(__file__).resolve().parents[1]
OPS = ("hard_negative_argmax", "count_unlabeled", "class_centroids_fwd", "class_centroids_bwd", "class_terms_fwd",
       "class_terms_bwd",
       "pairwise_uniformity_fwd", "pairwise_uniformity_bwd", "unknown_items", "history_sample", "embedding_bpr_fwd",
       "embedding_bpr_bwd", "gathered_norm_fwd", "gathered_norm_bwd", "gathered_dots_fwd", "gathered_dots_bwd",
       "unit_rows_fwd", "unit_rows_bwd", "masked_logsumexp_fwd", "masked_logsumexp_bwd", "dot_topk")
#: ops with a CPU kernel only: on a GPU the evaluator ranks chunks of cuBLAS products with masked_topk
CPU_ONLY = ("dot_topk",)
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
    """Every schema the extension registers (enumerated, so a new op is covered) has a CPU kernel,
    and a CUDA one exactly when the build has CUDA (but for CPU_ONLY); OPS, the schemas known today,
    must all be there."""
    registered = {name.removeprefix("pnn_fast::") for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("pnn_fast::")}
    assert set(OPS) <= registered, sorted(set(OPS) - registered)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in sorted(registered):
        assert has(f"pnn_fast::{op}", "CPU"), op
        assert has(f"pnn_fast::{op}", "CUDA") == (build_info()["with_cuda"] and op not in CPU_ONLY), op


# The C++ runtime's own compiled parts (streams, locales, facets): defined by libstdc++.so, never
# by an extension that links it dynamically.
CXX_RUNTIME_SYMBOL = re.compile(r"std::(ios_base|basic_ios|basic_ostream|basic_istream|ostream::|locale|"
                                r"__codecvt|codecvt|num_put|num_get)")


@compiled
@pytest.mark.skipif(sys.platform != "linux", reason="reads the ELF dynamic symbol table with binutils' nm")
def test_extension_links_the_shared_cxx_runtime():
    """On the GPU machine (2026-11-26) an error message that formats a number crashed with SIGSEGV
    inside std::ostream::_M_insert<long>, a symbol the backtrace found in pnn_fast/_C.abi3.so: the
    extension carried its own copy of the C++ runtime's streams beside libstdc++.so's.  Two copies
    disagree on their locale facets; every std:: stream symbol must come from libstdc++.so."""
    library = importlib.import_module("pnn_fast._C").__file__
    listing = subprocess.run(["nm", "-D", "-C", "--defined-only", library], capture_output=True, text=True,
                             check=True).stdout
    own_runtime = sorted({line.split(" ", 2)[-1] for line in listing.splitlines() if CXX_RUNTIME_SYMBOL.search(line)})
    assert not own_runtime, (f"{library} defines {len(own_runtime)} of the C++ runtime's own symbols "
                             f"(linked statically?), e.g. {own_runtime[:3]}")


def test_require_kernels_says_how_to_rebuild(monkeypatch):
    monkeypatch.setitem(_extension._INFO, "compiled", True)
    monkeypatch.setitem(_extension._INFO, "with_cuda", False)
    monkeypatch.setitem(_extension._INFO, "variant_reason", "USE_CUDA=0")
    assert _extension.has_kernels("cpu") and not _extension.has_kernels("cuda")
    with pytest.raises(RuntimeError, match=r"built without CUDA kernels \(USE_CUDA=0\).*FORCE_CUDA=1 "
                                           r"pip install --no-build-isolation -e \."):
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
    for name in ("USE_CUDA", "FORCE_CUDA", "FORCE_ONLY_CPU", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST",
                 "SANITIZE"):
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


def test_setup_sanitize_switch():
    """SANITIZE names the sanitizers of a CPU-only build (.ci/sanitize builds and runs one)."""
    sanitized = setup_variant(FORCE_ONLY_CPU="1", SANITIZE="address, undefined")
    assert sanitized.returncode == 0 and "; sanitizers address,undefined" in sanitized.stdout
    # where the CUDA variant can be built the switch refuses it; elsewhere FORCE_CUDA itself fails first
    cuda = setup_variant(FORCE_CUDA="1", SANITIZE="address")
    refused = ("SANITIZE=address is supported for the CPU-only build only", "FORCE_CUDA=1 but")
    assert cuda.returncode != 0 and any(message in cuda.stderr for message in refused), cuda.stderr


def third_party_imports(files) -> set:
    """Top-level names of the modules that ``files`` import, less the standard library and pnn_fast."""
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "pnn_fast"}


def test_project_metadata_matches_the_package():
    """pyproject.toml against the code it ships: its version is the package's, its console script
    exists, the package search finds every package folder, and each third-party module the package
    imports is a declared dependency (the optional RecBole integration aside)."""
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert pnn_fast.__version__ == project["version"]
    for target in project["scripts"].values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    from setuptools import find_packages

    found = set(find_packages(where=str(ROOT), **meta["tool"]["setuptools"]["packages"]["find"]))
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pnn_fast").rglob("__init__.py")}
    assert folders <= found, folders - found
    # the core's (setup.py declares torch and numpy: tests/test_packaging.py checks the metadata) and the
    # train extra's (tests/test_packaging.py also checks that the core imports without the extra)
    declared = {"torch", "numpy"} | {re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower()
                                     for requirement in project["optional-dependencies"]["train"]}
    package = ROOT / "pnn_fast"
    imported = third_party_imports(path for path in package.rglob("*.py")
                                   if path.relative_to(package).parts[0] != "integrations")
    assert "torch" in imported and imported <= declared, imported - declared


def fake_toolkit(root: Path, *, cudart: bool) -> Path:
    """A toolkit folder (bin/nvcc, and lib64/libcudart.so when ``cudart``) and, in root/wrapper, an
    nvcc wrapper script outside it that reports the toolkit in a dry run, as the real nvcc does."""
    toolkit = root / "cuda-fake"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\nexit 1\n")
    if cudart:
        (toolkit / "lib64").mkdir()
        (toolkit / "lib64" / "libcudart.so").write_text("")
    wrapper = root / "wrapper"
    wrapper.mkdir()
    (wrapper / "nvcc").write_text(f"#!/bin/sh\necho '#$ _HERE_={toolkit / 'bin'}'\n")
    (wrapper / "nvcc").chmod(0o755)
    return toolkit


def test_setup_finds_the_toolkit_behind_an_nvcc_wrapper(tmp_path):
    toolkit = fake_toolkit(tmp_path, cudart=True)
    found = setup_variant(PATH=f"{tmp_path / 'wrapper'}:{os.environ['PATH']}")
    assert found.returncode == 0, found.stderr
    if torch.version.cuda:
        assert f"building the CUDA variant: CUDA toolkit at {toolkit} (from the nvcc on PATH" in found.stdout
        assert "GPU architectures" in found.stdout
    else:
        assert f"CPU-only build (CUDA toolkit at {toolkit} not used)" in found.stdout


def test_setup_builds_cpu_only_when_the_toolkit_cannot_link(tmp_path):
    toolkit = fake_toolkit(tmp_path, cudart=False)
    path = f"{tmp_path / 'wrapper'}:{os.environ['PATH']}"
    quiet = setup_variant(PATH=path)
    assert quiet.returncode == 0, quiet.stderr
    assert f"CPU-only variant: the CUDA toolkit at {toolkit} (the nvcc on PATH" in quiet.stdout
    assert "no CUDA runtime library (libcudart) to link" in quiet.stdout
    forced = setup_variant(PATH=path, FORCE_CUDA="1")
    assert forced.returncode != 0
    last_line = forced.stderr.strip().splitlines()[-1]
    assert last_line.startswith("pnn_fast: FORCE_CUDA=1 but the CUDA toolkit at") and "libcudart" in last_line
    assert "Traceback" not in forced.stderr


def test_every_cuda_op_file_is_in_the_cuda_translation_unit():
    """setup.py and CMake compile csrc/cuda_ops.cu, which includes the op files: a new one must be listed."""
    listed = re.findall(r'^#include "cuda/(\w+\.cu)"$', (ROOT / "csrc" / "cuda_ops.cu").read_text(), re.MULTILINE)
    assert sorted(listed) == sorted(p.name for p in (ROOT / "csrc" / "cuda").glob("*.cu"))


@compiled
def test_the_build_keeps_its_objects_in_the_checkout():
    """`pip install -e` compiles in a new temporary folder unless setup.py moves build_temp, and then
    the README's second install recompiled every kernel: the build that made this _C must have left
    an object for each of its sources under build/objects, where the next build reuses them."""
    library = Path(importlib.util.find_spec("pnn_fast._C").origin)
    if library.parent != ROOT / "pnn_fast":
        pytest.skip(f"pnn_fast._C ({library}) was not built in this checkout")
    objects = ROOT / "build" / "objects"
    sources = [p for folder in ("csrc", "csrc/common", "csrc/cpu") for p in (ROOT / folder).glob("*.cpp")]
    if build_info()["with_cuda"]:
        sources.append(ROOT / "csrc" / "cuda_ops.cu")
    # torch's ninja build names an object after its source's path: csrc/cpu/x.cpp -> csrc/cpu/x.o,
    # csrc/cuda_ops.cu -> csrc/cuda_ops.o
    missing = [str(p.relative_to(ROOT)) for p in sources
               if not list((objects / p.parent.relative_to(ROOT)).glob(f"{p.stem}.*o"))]
    assert not missing, (f"no object under {objects} for {missing}: reinstall "
                         "(pip install --no-build-isolation -e .)")


#: C++20 library names: torch before 2.13 builds extensions as C++17 (the GPU machine's 2.11 did, and
#: std::bit_width broke its build while this machine's torch 2.14, which builds as C++20, compiled it)
CXX20_ONLY = re.compile(r"#include <(bit|span|ranges|numbers|concepts|compare|format|source_location)>|"
                        r"std::(bit_width|bit_cast|bit_ceil|bit_floor|has_single_bit|popcount|countl_zero|"
                        r"countr_zero|rotl|rotr|span|ranges::|views::|midpoint|lerp|ssize|erase_if|"
                        r"remove_cvref|type_identity|is_constant_evaluated|to_address|assume_aligned)\b|"
                        r"\b(consteval|constinit|co_await|co_return|co_yield)\b|<=>")


def test_sources_stay_within_cxx17():
    """No C++20-only header, library name or keyword in csrc (a grep: the local torch cannot build the
    sources as C++17, its own headers need C++20)."""
    sources = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in {".h", ".cpp", ".cu", ".cuh"}]
    assert sources
    found = [f"{p.relative_to(ROOT)}:{number}: {line.strip()}" for p in sources
             for number, line in enumerate(p.read_text().splitlines(), 1)
             if CXX20_ONLY.search(line.split("//")[0])]
    assert not found, "C++20 in sources that torch < 2.13 builds as C++17:\n" + "\n".join(found)
