"""Build of pnn_fast._C, the C++/CUDA kernels (metadata is in pyproject.toml).

    pip install --no-build-isolation -e .      # build isolation would compile against another torch

The variant is decided by capability, never by whether a GPU is visible, so a GPU-less CI or
Docker host builds the same CUDA kernels a GPU machine does:

* CUDA when torch is a CUDA build and a toolkit that can link (nvcc and libcudart) is found:
  CUDA_HOME or CUDA_PATH, else the nvcc on PATH followed to its real folder (a wrapper script
  is asked with `nvcc -dryrun`), else /usr/local/cuda. CPU-only otherwise, with the reason printed.
* FORCE_CUDA=1 turns a missing or unusable toolkit into a one-line error; USE_CUDA=0 (or
  FORCE_ONLY_CPU=1) builds CPU-only.
* TORCH_CUDA_ARCH_LIST picks the GPU architectures; unset, the visible GPUs', or with none
  visible DEFAULT_ARCH_LIST (8.0;9.0+PTX). DEBUG=1 gives -O0 -g.
* SANITIZE=address,undefined (any comma list of gcc/clang -fsanitize= names) compiles and links
  the C++ kernels with those sanitizers, -fno-omit-frame-pointer and -fno-sanitize-recover=undefined
  (a UB report fails the run), at -O1 -g unless DEBUG=1. CPU-only builds only (FORCE_ONLY_CPU=1):
  a CUDA build with SANITIZE is a one-line error. Python is not instrumented, so the runtimes
  must be preloaded: LD_PRELOAD="$(gcc -print-file-name=libasan.so) ..."; .ci/sanitize does it all.

The torch/CUDA versions of the build and its DEBUG and SANITIZE switches are written to
pnn_fast/_build_info.json next to _C; the torch version is checked when pnn_fast is imported.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).resolve().parent


def env_flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


# The GPUs compiled for when none is visible and TORCH_CUDA_ARCH_LIST is unset: A100 and H100 as
# machine code, plus PTX for 9.0 that newer GPUs compile at load time. torch's own fallback is
# every architecture it knows, which takes far longer to build than a first install should.
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
STANDARD_TOOLKIT_FOLDER = Path("/usr/local/cuda")


class BuildSetupError(SystemExit):
    """A one-line build error (setuptools prints a SystemExit's message, no traceback)."""

    def __init__(self, message: str):
        super().__init__(f"pnn_fast: {message}")


def nvcc_reported_folder(nvcc: str):
    """The toolkit folder a (possibly wrapped) nvcc runs from, as its own dry run reports it.

    An nvcc on PATH may be a script that execs the real one elsewhere, so the folder above the
    PATH entry need not be the toolkit; `nvcc -dryrun` prints `#$ _HERE_=<the real bin folder>`.
    """
    try:
        run = subprocess.run([nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"^#\$ _HERE_=(.+)$", run.stdout + run.stderr, re.MULTILINE)
    return Path(found.group(1).strip()).parent if found else None


def find_cuda_toolkit():
    """(folder, how it was found), or (None, why not): CUDA_HOME or CUDA_PATH when set, else the
    folder of the nvcc on PATH (through symlinks and wrapper scripts), else /usr/local/cuda."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(name):
            return Path(os.environ[name]), f"{name}={os.environ[name]}"
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        # the folder above the real file (through symlinks), else the one a wrapper script execs
        folders = [Path(nvcc).resolve().parent.parent, nvcc_reported_folder(nvcc)]
        toolkits = [f for f in folders if f is not None and (f / "bin" / "nvcc").exists()]
        if toolkits:
            linkable = [f for f in toolkits if cudart_library(f)]
            return (linkable or toolkits)[0], f"the nvcc on PATH ({nvcc})"
    if (STANDARD_TOOLKIT_FOLDER / "bin" / "nvcc").exists():
        return STANDARD_TOOLKIT_FOLDER, f"the standard install folder {STANDARD_TOOLKIT_FOLDER}"
    return None, "no CUDA toolkit found (no nvcc on PATH, no /usr/local/cuda, CUDA_HOME unset)"


def cudart_library(folder: Path):
    """The CUDA runtime library the extension links against, or None."""
    for lib in ("lib64/libcudart.so", "lib/libcudart.so", "lib/x64/cudart.lib", "targets/x86_64-linux/lib/libcudart.so",
                "targets/sbsa-linux/lib/libcudart.so"):
        if (folder / lib).exists():
            return folder / lib
    return None


def choose_variant():
    """(with_cuda, reason). Sets torch's CUDA_HOME to the toolkit found when building CUDA."""
    if os.environ.get("USE_CUDA", "").strip() == "0" or env_flag("FORCE_ONLY_CPU"):
        if env_flag("FORCE_CUDA"):
            raise BuildSetupError("FORCE_CUDA=1 contradicts USE_CUDA=0 / FORCE_ONLY_CPU=1")
        return False, "USE_CUDA=0 / FORCE_ONLY_CPU=1"
    toolkit, found_by = find_cuda_toolkit()
    if toolkit is None:
        why = found_by
    elif not (toolkit / "bin" / "nvcc").exists():
        why = f"{found_by} has no bin/nvcc"
    elif cudart_library(toolkit) is None:
        why = f"the CUDA toolkit at {toolkit} ({found_by}) has no CUDA runtime library (libcudart) to link"
    elif torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build (CUDA toolkit at {toolkit} not used)"
    else:
        # torch guessed its own CUDA_HOME at import, from the nvcc on PATH; build with the one found here
        cpp_extension.CUDA_HOME = str(toolkit)
        os.environ["CUDA_HOME"] = str(toolkit)
        return True, f"CUDA toolkit at {toolkit} (from {found_by}), torch built with CUDA {torch.version.cuda}"
    if env_flag("FORCE_CUDA"):
        raise BuildSetupError(f"FORCE_CUDA=1 but {why}")
    return False, why


def cuda_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST when set; the visible GPUs' when there are any (torch's own choice);
    else DEFAULT_ARCH_LIST, written to the environment for torch's build to read."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        return "the visible GPUs' (torch default)"
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    return DEFAULT_ARCH_LIST


def shared_cxx_runtime_flags() -> list:
    """Link libstdc++.so.6 by name on Linux, ahead of the compiler's own -lstdc++.

    A toolchain that links libstdc++ statically (LDFLAGS=-static-libstdc++, or a compiler that
    finds only libstdc++.a) gives the extension a second copy of the C++ runtime beside the one
    torch loads; the two disagree on locale facets, so an error message that formats a number is
    cut short there, or crashes (SIGSEGV in std::ostream::_M_insert<long> on the GPU machine,
    bench/README.md).  Named first, the shared library resolves every std:: symbol and nothing is
    taken from the archive.  tests/test_build.py checks the result.
    """
    return ["-l:libstdc++.so.6"] if sys.platform == "linux" else []


def openmp_flags():
    """at::parallel_for is a header template: it only runs threads in our code when that code is
    compiled with OpenMP, like torch's own (the default backend) -- the same check as pytorch_scatter."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info() or sys.platform == "darwin":
        return []  # native thread pool (no flag needed), or macOS' clang without OpenMP: serial loops
    return ["-fopenmp"]


def sanitizers(with_cuda: bool) -> list:
    """The sanitizers named by SANITIZE (e.g. "address,undefined"), [] when unset.

    CPU-only builds only: a CUDA build would need the flags forwarded to nvcc's host compiler, and
    the CUDA runtime under ASan needs its own options (protect_shadow_gap=0); neither is tested here.
    """
    names = [name.strip() for name in os.environ.get("SANITIZE", "").split(",") if name.strip()]
    if names and with_cuda:
        raise BuildSetupError(f"SANITIZE={','.join(names)} is supported for the CPU-only build only; "
                              "add FORCE_ONLY_CPU=1")
    return names


def relative_sources(pattern: str):
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))


WITH_CUDA, REASON = choose_variant()
ARCH_LIST = cuda_arch_list() if WITH_CUDA else None
DEBUG = env_flag("DEBUG")
SANITIZE = sanitizers(WITH_CUDA)
print(f"pnn_fast: building the {'CUDA' if WITH_CUDA else 'CPU-only'} variant: {REASON}"
      + (f"; GPU architectures {ARCH_LIST}" if WITH_CUDA else "")
      + (f"; sanitizers {','.join(SANITIZE)}" if SANITIZE else ""), flush=True)

# Limited Python API (one abi3 .so for every Python): torch >= 2.6 defines Py_LIMITED_API itself for
# py_limited_api extensions, as its oldest supported CPython; older torch needs the define from us.
LIMITED_API = getattr(cpp_extension, "min_supported_cpython", None)
defines = ([] if LIMITED_API else ["-DPy_LIMITED_API=0x03090000"]) + (["-DPNN_FAST_WITH_CUDA"] if WITH_CUDA else [])
ABI3_TAG = f"cp3{int((LIMITED_API or '0x03090000')[4:6], 16)}"
# -ffp-contract=off: the score chains fuse exactly where pnn_rows.h says (FusedMultiplyAdd) and nowhere else; -Wno-psabi: the
# AVX2 vectors of cpu/simd.h only cross inlined calls
# A sanitized build keeps frame pointers for the reports' stacks and stops at the first UB report (recovering would
# let a test pass after one); -O1 keeps it fast enough for the property tests while still debuggable.
sanitize_flags = ([f"-fsanitize={','.join(SANITIZE)}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
                  if SANITIZE else [])
optimization = ["-O0", "-g"] if DEBUG else ["-O1", "-g"] if SANITIZE else ["-O3"]
cxx_flags = optimization + ["-ffp-contract=off", "-Wno-psabi"] + sanitize_flags + openmp_flags() + defines
nvcc_flags = (["-O0", "-g", "-lineinfo"] if DEBUG else ["-O3"]) + defines
sources = relative_sources("csrc/*.cpp") + relative_sources("csrc/common/*.cpp") + relative_sources("csrc/cpu/*.cpp")
if WITH_CUDA:  # the op files of csrc/cuda/, as one translation unit (see csrc/cuda_ops.cu)
    sources += ["csrc/cuda_ops.cu"]
extension_type = CUDAExtension if WITH_CUDA else CppExtension
extension = extension_type(
    "pnn_fast._C",
    sources,
    include_dirs=[str(ROOT / "csrc")],
    extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags} if WITH_CUDA else {"cxx": cxx_flags},
    extra_link_args=(["-O0", "-g"] if DEBUG else []) + sanitize_flags + openmp_flags() + shared_cxx_runtime_flags(),
    py_limited_api=True,
)

BUILD_INFO = {
    "with_cuda": WITH_CUDA,
    "variant_reason": REASON,
    "torch_version": torch.__version__,
    "cuda_version": torch.version.cuda if WITH_CUDA else None,
    "cuda_arch_list": ARCH_LIST,
    "debug": DEBUG,
    "sanitize": SANITIZE,
}


class BuildExtensionWithInfo(BuildExtension):
    """BuildExtension that also writes _build_info.json beside the built _C, and keeps its objects.

    pip's editable install (``pip install -e``) points build_temp at a fresh temporary folder, so
    every install recompiled every kernel (most of an install's time with the CUDA variant), even the
    second of the README's two commands right after the first. The objects go to build/ in the
    checkout instead, where ninja reuses those whose sources, headers (its depfiles) and compile
    command are unchanged, and rebuilds the rest.
    """

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = str(ROOT / "build" / "objects")

    def info_path(self) -> Path:
        return Path(self.get_ext_fullpath(extension.name)).parent / "_build_info.json"

    def run(self):
        super().run()
        self.info_path().write_text(json.dumps(BUILD_INFO, indent=2) + "\n")

    def get_outputs(self):
        return super().get_outputs() + [str(self.info_path())]


# The kernels are compiled against this torch's C++ ABI, so a wheel declares exactly this torch (its
# public version: 2.14.1 for 2.14.1+cu130, which any local build of 2.14.1 satisfies).
TORCH_REQUIREMENT = f"torch=={torch.__version__.split('+')[0]}"

setup(
    install_requires=[TORCH_REQUIREMENT, "numpy"],
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtensionWithInfo.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": ABI3_TAG}},
)
