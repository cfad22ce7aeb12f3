"""Build of pnn_fast._C, the C++/CUDA kernels (metadata is in pyproject.toml).

    pip install --no-build-isolation -e .      # build isolation would compile against another torch

The variant is decided by capability, never by whether a GPU is visible, so a GPU-less CI or
Docker host builds the same CUDA kernels a GPU machine does:

* CUDA when a CUDA toolkit is found (CUDA_HOME) and torch is a CUDA build; CPU-only otherwise.
* FORCE_CUDA=1 turns a missing toolkit into an error; USE_CUDA=0 (or FORCE_ONLY_CPU=1) builds CPU-only.
* TORCH_CUDA_ARCH_LIST picks the GPU architectures (e.g. "8.0;9.0"), DEBUG=1 gives -O0 -g.

The torch/CUDA versions of the build are written to pnn_fast/_build_info.json next to _C and
checked when pnn_fast is imported.
"""
import json
import os
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import (
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
)

ROOT = Path(__file__).resolve().parent


def env_flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def choose_variant():
    """(with_cuda, reason)."""
    if os.environ.get("USE_CUDA", "").strip() == "0" or env_flag("FORCE_ONLY_CPU"):
        if env_flag("FORCE_CUDA"):
            raise RuntimeError("FORCE_CUDA=1 contradicts USE_CUDA=0 / FORCE_ONLY_CPU=1")
        return False, "USE_CUDA=0 / FORCE_ONLY_CPU=1"
    if CUDA_HOME is None:
        why = "no CUDA toolkit found (set CUDA_HOME or put nvcc on PATH)"
    elif not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        why = f"CUDA_HOME={CUDA_HOME} has no bin/nvcc"
    elif torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build"
    else:
        return True, f"CUDA toolkit at {CUDA_HOME}, torch built with CUDA {torch.version.cuda}"
    if env_flag("FORCE_CUDA"):
        raise RuntimeError(f"FORCE_CUDA=1 but {why}")
    return False, why


def openmp_flags():
    """at::parallel_for is a header template: it only runs threads in our code when that code is
    compiled with OpenMP, like torch's own (the default backend) -- the same check as pytorch_scatter."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info() or sys.platform == "darwin":
        return []  # native thread pool (no flag needed), or macOS' clang without OpenMP: serial loops
    return ["-fopenmp"]


def relative_sources(pattern: str):
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))


WITH_CUDA, REASON = choose_variant()
DEBUG = env_flag("DEBUG")
print(f"pnn_fast: building the {'CUDA' if WITH_CUDA else 'CPU-only'} variant: {REASON}", flush=True)

# Limited Python API (one abi3 .so for every Python): torch >= 2.6 defines Py_LIMITED_API itself for
# py_limited_api extensions, as its oldest supported CPython; older torch needs the define from us.
LIMITED_API = getattr(cpp_extension, "min_supported_cpython", None)
defines = ([] if LIMITED_API else ["-DPy_LIMITED_API=0x03090000"]) + (["-DPNN_FAST_WITH_CUDA"] if WITH_CUDA else [])
ABI3_TAG = f"cp3{int((LIMITED_API or '0x03090000')[4:6], 16)}"
# -ffp-contract=off: scores must be bit-identical across kernels (pnn_rows.h, madd); -Wno-psabi: the
# AVX2 vectors of cpu/simd.h only cross inlined calls
cxx_flags = (["-O0", "-g"] if DEBUG else ["-O3"]) + ["-ffp-contract=off", "-Wno-psabi"] + openmp_flags() + defines
nvcc_flags = (["-O0", "-g", "-lineinfo"] if DEBUG else ["-O3"]) + defines
sources = relative_sources("csrc/*.cpp") + relative_sources("csrc/cpu/*.cpp")
if WITH_CUDA:
    sources += relative_sources("csrc/cuda/*.cu")
extension_type = CUDAExtension if WITH_CUDA else CppExtension
extension = extension_type(
    "pnn_fast._C",
    sources,
    include_dirs=[str(ROOT / "csrc")],
    extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags} if WITH_CUDA else {"cxx": cxx_flags},
    extra_link_args=(["-O0", "-g"] if DEBUG else []) + openmp_flags(),
    py_limited_api=True,
)

BUILD_INFO = {
    "with_cuda": WITH_CUDA,
    "variant_reason": REASON,
    "torch_version": torch.__version__,
    "cuda_version": torch.version.cuda if WITH_CUDA else None,
    "cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", "torch default") if WITH_CUDA else None,
    "debug": DEBUG,
}


class BuildExtensionWithInfo(BuildExtension):
    """BuildExtension that also writes _build_info.json beside the built _C."""

    def info_path(self) -> Path:
        return Path(self.get_ext_fullpath(extension.name)).parent / "_build_info.json"

    def run(self):
        super().run()
        self.info_path().write_text(json.dumps(BUILD_INFO, indent=2) + "\n")

    def get_outputs(self):
        return super().get_outputs() + [str(self.info_path())]


setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtensionWithInfo.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": ABI3_TAG}},
)
