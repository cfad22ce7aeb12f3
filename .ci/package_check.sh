#!/bin/bash
# A release check (about 20 minutes on 2 cores, not part of .ci/run): a wheel built here declares the torch
# it was built against, installs into a fresh venv with that torch and imports; an sdist built here builds
# and imports in another fresh venv. Usage: bash .ci/package_check.sh [WORK_DIR]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/package-check}; rm -rf "$W"; mkdir -p "$W"; cd "$W"
git clone -q "$REPO" src
python3 -m venv build-env && . build-env/bin/activate
pip install -q torch==2.14.1 ninja setuptools wheel build
cd src
echo "== wheel $(date +%H:%M:%S) $(git rev-parse --short HEAD)"
pip wheel -q --no-build-isolation --no-deps -w $W/dist . > $W/wheel.log 2>&1
python -m build -q --sdist --no-isolation --outdir $W/dist . > $W/sdist.log 2>&1
deactivate; cd $W
ls -la dist
unzip -p dist/pnn_fast-*.whl 'pnn_fast-*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v extra
echo "== fresh venv with the wheel $(date +%H:%M:%S)"
python3 -m venv fresh && . fresh/bin/activate
pip install -q torch==2.14.1 && pip install -q dist/pnn_fast-*.whl
cd / && python -c "import pnn_fast, torch; print('wheel:', pnn_fast.build_info()); from pnn_fast import SampledSoftmaxLoss, PNNLoss; print('import ok', torch.__version__)"
deactivate; cd $W
echo "== fresh venv from the sdist $(date +%H:%M:%S)"
python3 -m venv fresh-sdist && . fresh-sdist/bin/activate
pip install -q torch==2.14.1 ninja setuptools wheel && pip install -q --no-build-isolation dist/pnn_fast-*.tar.gz > $W/sdist-install.log 2>&1
cd / && python -c "import pnn_fast; print('sdist:', pnn_fast.build_info()); from pnn_fast import BilateralSoftmaxLoss; print('import ok')"
echo "== end $(date +%H:%M:%S)"
