#!/usr/bin/env bash
# Benchmark-only environment for bench/bench_recbole.py: RecBole 1.2.1 and pnn_fast in ONE
# Python process, so that both are timed side by side in one run.
#
# RecBole is not a dependency of pnn_fast.  This venv lives outside the repository
# (default: ../recbole-venv beside the checkout; override with RECBOLE_VENV=...).
#
# torch: by default the venv borrows the project's own torch (and its dependencies) from the
# project venv through a .pth file, so that the compiled pnn_fast._C, which refuses to load
# under another torch version, loads here too and the fused backend is what gets timed.  The
# .pth entry comes after this venv's own site-packages, so this venv's numpy 1.26 (RecBole
# 1.2.1 uses np.float_ etc., removed in numpy 2) shadows the project's numpy 2; torch runs
# with either.  RECBOLE_TORCH=2.13.0 (any version) installs that torch into the venv instead
# (then pnn_fast runs without its compiled kernels unless they are rebuilt for it).
#
# Usage:  bash bench/_recbole_setup.sh
#         cd <repo> && PYTHONPATH=$PWD ../recbole-venv/bin/python -m pytest bench/bench_recbole.py -p no:cacheprovider
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${RECBOLE_VENV:-$(dirname "$ROOT")/recbole-venv}
PROJECT_VENV=${PROJECT_VENV:-$ROOT/.venv}
TORCH=${RECBOLE_TORCH:-project}
PY=${PYTHON:-python3}

"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# RecBole 1.2.1's requirements, minus ray (only recbole.quick_start imports it, for
# hyper-parameter tuning; the benchmark builds config, dataset, model and trainer itself)
# and minus torch (below).  thop also requires torch, hence --no-deps for it.
"${PIP[@]}" "numpy<2" "pandas<2.3" "scipy>=1.6,<1.13" "tqdm>=4.48.2" colorlog==4.7.2 colorama==0.4.4 \
    "scikit-learn>=0.23.2" "pyyaml>=5.1" "tensorboard>=2.5" "tabulate>=0.8.10" "plotly>=4" \
    "texttable>=0.9" "psutil>=5.9" pytest pytest-benchmark
"${PIP[@]}" --no-deps "thop>=0.1.1.post2207130030" recbole==1.2.1

if [ "$TORCH" = project ]; then
    # Written last, so that the pip runs above never see (or try to replace) the project's packages.
    site_of "$PROJECT_VENV/bin/python" > "$(site_of "$VENV/bin/python")/zz_pnn_fast_project_site.pth"
else
    rm -f "$(site_of "$VENV/bin/python")/zz_pnn_fast_project_site.pth"
    "${PIP[@]}" "torch==$TORCH"
fi

PYTHONPATH=$ROOT "$VENV/bin/python" -W ignore -c '
import numpy, torch, recbole, pnn_fast
from recbole.config import Config  # noqa: F401  (fails on numpy 2)
from scipy.sparse import dok_matrix
dok_matrix((1, 1))._update  # used by the adjacency of RecBole LightGCN; removed in scipy 1.13 (hence the pin)
print("recbole", recbole.__version__, "torch", torch.__version__, "numpy", numpy.__version__,
      "pnn_fast kernels compiled:", pnn_fast.build_info()["compiled"])'
