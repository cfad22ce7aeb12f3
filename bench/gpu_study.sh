#!/usr/bin/env bash
# Trains study cells on the device machine for a fixed time and brings back everything the study
# folder holds (results, summaries, and the checkpoints of the cells it had to stop), so that the
# next device session resumes them: a LightGCN cell on Gowalla takes hours on this project's
# 2-core machine and minutes on a GPU.
#
# Here, before the device call (../shared does not travel; bench/.data is git-ignored):
#   mkdir -p bench/.data && cp -r ../shared/data/gowalla bench/.data/
#   # after an earlier device session, its tar, so that its cells resume:
#   cp <files_at>/gpu-lightgcn-gowalla.tar bench/.data/
# The device call (carry ["bench/.data"]):
#   JOBS=8 bash bench/gpu_study.sh studies/gpu-lightgcn-gowalla.toml '*' 480
# Back here:
#   tar -xf <files_at>/gpu-lightgcn-gowalla.tar -C studies   # results.json and summaries are committed,
#   cp <files_at>/gpu-lightgcn-gowalla.tar bench/.data/       # checkpoints are not (git ignores them)
#
# Arguments: the plan, an --only pattern (dataset/model/config/seedN) and the seconds to train
# (default 300); the running cells are stopped at the deadline with SIGINT, each losing at most its
# epoch in progress. JOBS (default 1) trains that many cells at once, each in its own process on
# the one GPU: one cell leaves most of an H200 idle, and a device session has minutes, not hours.
# STUDY_FOLDER overrides the study's folder (default studies/<the plan's study.name>), RESUME_TAR
# the earlier session's tar (default bench/.data/<study.name>.tar).
set -uo pipefail

if (( $# < 2 || $# > 3 )); then
  echo "usage: gpu_study.sh PLAN PATTERN [SECONDS]" >&2
  exit 2
fi
PLAN=$1
PATTERN=$2
SECONDS_TO_TRAIN=${3:-300}
if ! [[ "$SECONDS_TO_TRAIN" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_study.sh: SECONDS must be a positive integer, got '$SECONDS_TO_TRAIN'" >&2
  exit 2
fi
JOBS=${JOBS:-1}
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_study.sh: JOBS must be a positive integer, got '$JOBS'" >&2
  exit 2
fi

cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python}
NAME=$("$PYTHON" -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['study']['name'])" "$PLAN") || {
  echo "gpu_study.sh: cannot read the study's name from $PLAN" >&2
  exit 2
}
FOLDER=${STUDY_FOLDER:-studies/$NAME}
mkdir -p "$(dirname "$FOLDER")"

# an earlier session's cells, checkpoints included
RESUME_TAR=${RESUME_TAR:-bench/.data/$NAME.tar}
if [[ -f "$RESUME_TAR" ]]; then
  tar -xf "$RESUME_TAR" -C "$(dirname "$FOLDER")"
  echo "gpu_study: unpacked the cells of $RESUME_TAR" >&2
fi

if ! "$PYTHON" -c "import pnn_fast, sys; sys.exit(0 if pnn_fast.build_info()['compiled'] else 1)" 2> /dev/null; then
  "$PYTHON" -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || {
    tail -n 30 "$OUT/build.log" >&2
    exit 1
  }
fi

# its own process group, so that the deadline stops the study's worker process too
# (appending, so that the deadline's line below is not overwritten by the study's own writes)
: > "$OUT/study.log"
setsid "$PYTHON" -m pnn_fast study "$PLAN" --out "$FOLDER" --only "$PATTERN" --jobs "$JOBS" --no-progress \
  >> "$OUT/study.log" 2>&1 &
STUDY=$!
DEADLINE=$(( $(date +%s) + SECONDS_TO_TRAIN ))
while kill -0 "$STUDY" 2> /dev/null && (( $(date +%s) < DEADLINE )); do sleep 2; done
if kill -0 "$STUDY" 2> /dev/null; then
  echo "gpu_study: stopping the study at its deadline (${SECONDS_TO_TRAIN} s); its worker's cell resumes from its checkpoint" \
    >> "$OUT/study.log"
  kill -INT -- "-$STUDY" 2> /dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$STUDY" 2> /dev/null || break; sleep 1; done
  kill -KILL -- "-$STUDY" 2> /dev/null
fi
wait "$STUDY" 2> /dev/null

"$PYTHON" -m pnn_fast study "$PLAN" --out "$FOLDER" --summary-only >> "$OUT/study.log" 2>&1
tar -cf "$OUT/$NAME.tar" -C "$(dirname "$FOLDER")" "$(basename "$FOLDER")"
tail -n 20 "$OUT/study.log"
echo "gpu_study: $(find "$FOLDER" -name results.json | wc -l) finished cells; everything in $OUT/$NAME.tar" >&2
