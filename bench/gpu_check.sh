#!/usr/bin/env bash
# The project's GPU check, as one call of the device tool on a bare machine (torch + CUDA toolkit,
# compute-sanitizer, no network). Writes one markdown report, $OUT/gpu_check.md, and aims to finish
# within 8 minutes on an H100: steps run in order of importance, each under its own timeout, and
# the ones that would start after DEADLINE_S seconds are reported as skipped.
#
# Here, before the device call (../shared does not travel; bench/.data is git-ignored):
#   mkdir -p bench/.data && cp -r ../shared/data/ml-1m bench/.data/
# The device call (carry ["bench/.data"]):
#   bash bench/gpu_check.sh
# Without a GPU, the CPU-side steps only (the smoke workload on the CPU, the scripts' arguments):
#   bash bench/gpu_check.sh --dry-run
#
# Steps: build the CUDA extension (TORCH_CUDA_ARCH_LIST, default 9.0); the toolchain that linked it
# (compiler, Python's link flags, libstdc++ shared and not copied in: tests/test_build.py); the CUDA
# cases of the op, backend, loss, attention, parity and id-check tests (opcheck included; pytest-xdist
# workers, so that a crash costs its test and not the rest); bench/gpu_smoke.py, every kernel forward and
# backward against the reference plus torch.compile(PNNLoss) against eager; the same workload under
# compute-sanitizer memcheck; bench_pnn_loss.py on CUDA at B = 2048 and 8192
# (reference, torch.compile(reference), fused: ms and torch.cuda.max_memory_allocated) and
# torch.profiler's top kernels of the fused step at both sizes (--profile); one ML-1M epoch each
# of BPR, DNS, SL, PNN and the dns-anchored preset with MF on the GPU (bench_epochs.py); the CPU
# kernels' tests on the machine's 16 cores (thread-count bugs that 2 cores hide); racecheck over the
# smoke workload; torch.profiler's top kernels of one DNS and one preset epoch (profile_epoch.py).
# The test steps print a line per test (-v), so that one stopped at its timeout still names what
# passed and failed. Every step's whole log comes back in $OUT/logs.tar.gz; the report quotes each
# log's error lines and its end.
set -uo pipefail

DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "gpu_check.sh: unknown argument '$1' (the only option is --dry-run)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
REPORT="$OUT/gpu_check.md"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
DEADLINE_S=${DEADLINE_S:-480}
PYTHON=${PYTHON:-python}
# the data: bench/.data on the device machine (copied there, see above), else the tests' folder
# (pnn_fast.data.default_data_dir: shared/data beside the checkout, or beside the repository it was cloned from)
if [[ -z "${PNN_FAST_DATA:-}" ]]; then
  if [[ -d bench/.data/ml-1m ]]; then PNN_FAST_DATA=$PWD/bench/.data
  else PNN_FAST_DATA=$("$PYTHON" -c 'from pnn_fast.data import default_data_dir; print(default_data_dir())'); fi
fi
export PNN_FAST_DATA
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
START=$(date +%s)
FAILED=0
ROWS=()

# run NAME TIMEOUT_S COMMAND...: runs the step (unless past the deadline), logs its output to
# $LOGS/NAME.log and adds a row to the report's table.
run() {
  local name=$1 limit=$2
  shift 2
  local elapsed=$(( $(date +%s) - START ))
  if (( elapsed + 10 > DEADLINE_S )); then
    ROWS+=("| $name | skipped (the check had run ${elapsed} s of its ${DEADLINE_S} s) | - |")
    return
  fi
  echo "== $name: $*" >&2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  local status="ok"
  if (( rc == 124 )); then status="timed out after ${limit} s"; FAILED=1
  elif (( rc != 0 )); then status="failed (exit $rc)"; FAILED=1; fi
  ROWS+=("| $name | $status | $took |")
  echo "   $status in ${took} s" >&2
}

# The toolchain facts a link problem needs, then the check that libstdc++ was linked shared.
linkage() {
  c++ --version | head -n 1
  "$PYTHON" -c "import sysconfig; print({k: sysconfig.get_config_var(k) for k in ('CXX', 'LDCXXSHARED', 'LDFLAGS')})"
  echo "LDFLAGS in the environment: ${LDFLAGS-unset}"
  ldd pnn_fast/_C*.so | grep -E "libstdc|libgcc|cudart" || true
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_build.py -k "cxx_runtime or every_op"
}
export -f linkage
export PYTHON

if (( DRY_RUN )); then
  run syntax 10 bash -n bench/gpu_check.sh
  run linkage 120 bash -c linkage
  run smoke-cpu 120 "$PYTHON" bench/gpu_smoke.py --device cpu
  run bench-args 60 "$PYTHON" bench/bench_pnn_loss.py --help
  run profile-cpu 120 "$PYTHON" bench/bench_pnn_loss.py --profile --devices cpu --batches 256 --threads 1
  run epochs-collect 60 "$PYTHON" -m pytest bench/bench_epochs.py --collect-only -q -p no:cacheprovider
  if [[ -e "$PNN_FAST_DATA/ml-1m/train.txt" ]]; then
    run profile-epoch-cpu 120 "$PYTHON" bench/profile_epoch.py --device cpu --losses dns --rows 8
  else
    ROWS+=("| profile-epoch-cpu | skipped (no ML-1M under $PNN_FAST_DATA) | - |")
  fi
else
  run build 330 "$PYTHON" -m pip install --no-build-isolation --no-deps -e .
  run extension 60 "$PYTHON" -c "import torch, pnn_fast; info = pnn_fast.build_info(); print(info); \
assert info['with_cuda'] and torch.cuda.is_available(), 'no CUDA kernels or no GPU'"
  run linkage 60 bash -c linkage
  run tests-cuda 300 "$PYTHON" -m pytest -v -p no:cacheprovider -p no:logging -p xdist -n 4 --max-worker-restart 50 -rfE \
    tests/ops tests/test_backends.py tests/test_losses.py tests/test_attention.py tests/test_property_parity.py \
    tests/test_ids_checked_before_launch.py tests/test_deterministic_algorithms.py tests/test_baselines_sl.py -k cuda
  run smoke-and-compile 180 "$PYTHON" bench/gpu_smoke.py --device cuda --compile
  run memcheck 180 compute-sanitizer --tool memcheck --error-exitcode 1 "$PYTHON" bench/gpu_smoke.py --device cuda
  run bench-pnn-loss 180 "$PYTHON" bench/bench_pnn_loss.py --devices cuda --batches 2048 8192 \
    --json "$OUT/bench_pnn_loss.json"
  run profile-cuda 120 "$PYTHON" bench/bench_pnn_loss.py --profile --devices cuda --batches 2048 8192
  run epochs 180 env BENCH_DEVICE=cuda BENCH_ROUNDS=1 BENCH_LOSSES=bpr,dns,pnn,pnn-dns-anchored,sl-t02 "$PYTHON" -m pytest -q \
    -p no:cacheprovider bench/bench_epochs.py --benchmark-columns=median,rounds
  run tests-cpu 150 "$PYTHON" -m pytest -v -p no:cacheprovider -p no:logging -p xdist -n 8 -rfE tests/ops \
    tests/test_losses.py tests/test_attention.py -k "not cuda"
  run racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 1 "$PYTHON" bench/gpu_smoke.py --device cuda
  run profile-epochs 120 "$PYTHON" bench/profile_epoch.py --device cuda --losses dns pnn-dns-anchored
fi

{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')$( (( DRY_RUN )) && echo ' (dry run: CPU-side steps only)')"
  echo
  echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'), \
$(( $(date +%s) - START )) s in all."
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
  echo '```'
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  for log in "$LOGS"/*.log; do
    [[ -e "$log" ]] || continue
    echo
    echo "## $(basename "$log" .log)"
    echo
    # a failure's own lines first (pytest's "E" lines, tracebacks' last words), then the end
    if grep -q -E "^E |Error|FAILED" "$log"; then
      echo '```'
      grep -E "^E |Error|FAILED" "$log" | head -n 60
      echo '```'
      echo
    fi
    echo '```'
    tail -n 40 "$log"
    echo '```'
  done
} > "$REPORT"

# The device tool brings back only a few files: the logs travel as one archive.
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"

echo "gpu_check: report in $REPORT" >&2
exit $FAILED
