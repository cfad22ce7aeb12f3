#!/usr/bin/env bash
# The project's GPU check, as one call of the device tool on a bare machine (torch + CUDA toolkit,
# compute-sanitizer, no network). Writes one markdown report, $OUT/gpu_check.md, and ends within its
# budget, build included: BUDGET_S seconds (default 360; 180 with --quick), since a task's device
# time is 15 minutes with the machine's start. Steps run in order of importance; each step's timeout
# is clipped to the time left (less RESERVE_S, default 15, for the report), and a step with under
# 10 s left is reported as skipped. The report and the logs' archive are rewritten after every step,
# so a call stopped at any point still returns what ran.
#
# Here, before the device call (../shared does not travel; bench/.data is git-ignored):
#   mkdir -p bench/.data && cp -r ../shared/data/ml-1m bench/.data/
# The device call (carry ["bench/.data"]; give it a timeout_s that leaves time to rerun):
#   bash bench/gpu_check.sh            # everything, within 6 minutes
#   bash bench/gpu_check.sh --quick    # within 3 minutes: the build, the CUDA-graph capture and
#                                      # reduce-overhead tests, the CUDA tests of the kernels
#                                      # rewritten without a GPU, a training step of each loss under
#                                      # torch.cuda.set_sync_debug_mode("error"), the benchmark
# Without a GPU, the CPU-side steps only (the smoke workload on the CPU, the scripts' arguments):
#   bash bench/gpu_check.sh --dry-run [--quick]
# STEP_DELAY_S=N makes every step sleep N seconds first, inside its timeout: tests/test_gpu_check.py
# checks the time-keeping on the CPU with it.
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
# smoke workload; torch.profiler's top kernels of one DNS and one preset epoch (profile_epoch.py);
# a training step of each loss under sync debug mode (sync_debug_step.py).
# The test steps print a line per test (-v), so that one stopped at its timeout still names what
# passed and failed. Every step's whole log comes back in $OUT/logs.tar.gz; the report quotes each
# log's error lines and its end.
set -uo pipefail

DRY_RUN=0
QUICK=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --quick) QUICK=1 ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (the options are --dry-run and --quick)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
REPORT="$OUT/gpu_check.md"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
if (( QUICK )); then BUDGET_S=${BUDGET_S:-180}; else BUDGET_S=${BUDGET_S:-360}; fi
RESERVE_S=${RESERVE_S:-15}
STEP_DELAY_S=${STEP_DELAY_S:-0}
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
# read once: the report is rewritten after every step
MACHINE="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi")
$("$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1)"
TITLE="# GPU check$( (( DRY_RUN )) && echo ', dry run (CPU-side steps only)')$( (( QUICK )) && echo ', quick')"

# The report as it stands, and the logs as one archive (the device tool returns only a few files);
# each written beside and renamed, so a stop mid-write leaves the previous whole one.
write_report() {
  {
    echo "$TITLE, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'), \
$(( $(date +%s) - START )) s of its ${BUDGET_S} s budget so far."
    echo
    echo '```'
    echo "$MACHINE"
    echo '```'
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---|"
    (( ${#ROWS[@]} )) && printf '%s\n' "${ROWS[@]}"
    for log in "$LOGS"/*.log; do
      [[ -e "$log" ]] || continue
      echo
      echo "## $(basename "$log" .log)"
      echo
      # a failure's own lines first (pytest's "E" lines, tracebacks' last words), then the end
      if grep -q -E "^E |Error|FAILED|synchronised at" "$log"; then
        echo '```'
        grep -E "^E |Error|FAILED|synchronised at" "$log" | head -n 60
        echo '```'
        echo
      fi
      echo '```'
      tail -n 40 "$log"
      echo '```'
    done
  } > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$OUT" logs && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

# run NAME TIMEOUT_S COMMAND...: runs the step under its timeout clipped to the budget left (or
# skips it when under 10 s are left), logs its output to $LOGS/NAME.log, adds a row to the
# report's table and rewrites the report.
run() {
  local name=$1 limit=$2
  shift 2
  local elapsed=$(( $(date +%s) - START ))
  local left=$(( BUDGET_S - RESERVE_S - elapsed ))
  if (( left < 10 )); then
    ROWS+=("| $name | skipped (the check had run ${elapsed} s of its ${BUDGET_S} s) | - |")
    write_report
    return
  fi
  local clipped=""
  if (( limit > left )); then limit=$left; clipped=", clipped to the budget"; fi
  echo "== $name (${limit} s): $*" >&2
  local t0=$(date +%s)
  # -k: a step that outlives SIGTERM (a hung CUDA call) is killed 5 s later
  timeout -k 5 "$limit" bash -c 'sleep "$0" && exec "$@"' "$STEP_DELAY_S" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  local status="ok"
  if (( rc == 124 || rc == 137 )); then status="timed out after ${limit} s${clipped}"; FAILED=1
  elif (( rc != 0 )); then status="failed (exit $rc)"; FAILED=1; fi
  ROWS+=("| $name | $status | $took |")
  echo "   $status in ${took} s" >&2
  write_report
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

# the CUDA-graph tests: every op captured with fresh outputs from its pool, the id-checked ops, and
# a compiled training loop under reduce-overhead (CUDA graphs) against eager
CAPTURE_TESTS=("tests/ops/test_registry.py::test_every_op_captures_into_a_cuda_graph_with_fresh_outputs_from_its_pool"
               "tests/test_ids_checked_before_launch.py::test_checked_ops_capture_into_a_cuda_graph"
               "tests/test_losses.py::test_compiled_training_matches_eager")

write_report  # an empty table: the call returns a report even if stopped before the first step
if (( DRY_RUN && QUICK )); then
  run syntax 10 bash -n bench/gpu_check.sh
  run capture-collect 60 "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "${CAPTURE_TESTS[@]}"
  run sync-debug-cpu 120 "$PYTHON" bench/sync_debug_step.py --device cpu
  run bench-args 60 "$PYTHON" bench/bench_pnn_loss.py --help
elif (( DRY_RUN )); then
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
  run sync-debug-cpu 120 "$PYTHON" bench/sync_debug_step.py --device cpu
elif (( QUICK )); then
  run build 150 "$PYTHON" -m pip install --no-build-isolation --no-deps -e .
  run extension 30 "$PYTHON" -c "import torch, pnn_fast; info = pnn_fast.build_info(); print(info); \
assert info['with_cuda'] and torch.cuda.is_available(), 'no CUDA kernels or no GPU'"
  run capture 60 "$PYTHON" -m pytest -v -p no:cacheprovider -rfE "${CAPTURE_TESTS[@]}"
  # the kernels rewritten without a GPU (warp-per-row class_terms and hard_negative_argmax, the
  # warp-aggregated radix histogram, the bitmap of uncached rows, wave-sized score tiles) against
  # the reference, before anything times them
  run kernels-cuda 45 "$PYTHON" -m pytest -q -p no:cacheprovider -rfE tests/ops/test_class_terms.py \
    tests/ops/test_hard_negative_argmax.py tests/ops/test_class_centroids.py tests/ops/test_lowest_k_mask.py -k cuda
  run sync-debug 60 "$PYTHON" bench/sync_debug_step.py --device cuda
  run bench-pnn-loss 60 "$PYTHON" bench/bench_pnn_loss.py --devices cuda --batches 2048 8192 \
    --json "$OUT/bench_pnn_loss.json"
else
  run build 240 "$PYTHON" -m pip install --no-build-isolation --no-deps -e .
  run extension 30 "$PYTHON" -c "import torch, pnn_fast; info = pnn_fast.build_info(); print(info); \
assert info['with_cuda'] and torch.cuda.is_available(), 'no CUDA kernels or no GPU'"
  run capture 60 "$PYTHON" -m pytest -v -p no:cacheprovider -rfE "${CAPTURE_TESTS[@]}"
  run sync-debug 60 "$PYTHON" bench/sync_debug_step.py --device cuda
  run tests-cuda 150 "$PYTHON" -m pytest -v -p no:cacheprovider -p no:logging -p xdist -n 4 --max-worker-restart 50 -rfE \
    tests/ops tests/test_backends.py tests/test_losses.py tests/test_attention.py tests/test_property_parity.py \
    tests/test_ids_checked_before_launch.py tests/test_deterministic_algorithms.py tests/test_baselines_sl.py -k cuda
  run bench-pnn-loss 60 "$PYTHON" bench/bench_pnn_loss.py --devices cuda --batches 2048 8192 \
    --json "$OUT/bench_pnn_loss.json"
  run memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 "$PYTHON" bench/gpu_smoke.py --device cuda
  run epochs 90 env BENCH_DEVICE=cuda BENCH_ROUNDS=1 BENCH_LOSSES=dns,pnn-dns-anchored,sl-t02 "$PYTHON" -m pytest -q \
    -p no:cacheprovider bench/bench_epochs.py --benchmark-columns=median,rounds
  run linkage 60 bash -c linkage
  run smoke-and-compile 90 "$PYTHON" bench/gpu_smoke.py --device cuda --compile
  run profile-cuda 60 "$PYTHON" bench/bench_pnn_loss.py --profile --devices cuda --batches 2048 8192
  run racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 1 "$PYTHON" bench/gpu_smoke.py --device cuda
  run tests-cpu 90 "$PYTHON" -m pytest -v -p no:cacheprovider -p no:logging -p xdist -n 8 -rfE tests/ops \
    tests/test_losses.py tests/test_attention.py -k "not cuda"
  run profile-epochs 60 "$PYTHON" bench/profile_epoch.py --device cuda --losses dns pnn-dns-anchored
fi

write_report
rm -rf "$LOGS"  # the archive holds them

echo "gpu_check: report in $REPORT" >&2
exit $FAILED
