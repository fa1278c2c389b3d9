#!/usr/bin/env bash
# Builds and checks mixtrain on a GPU machine (docs/gpu.md), from the repository root, in one
# call that leaves device time for one warm follow-up call. Phases, in the order that protects
# the essential checks:
#   env        nvidia-smi, torch's view of the GPU, the tools' versions
#   configure  Ninja, Release, the deps bundle (scripts/device_deps.sh), CUDA arch 90
#   build      mixtrain, the tests labelled cuda, SANITY_TESTS, the bench_*cuda* programs, the
#              Python package's module (when configured)
#   cuda       ctest -L cuda with MIXTRAIN_REQUIRE_CUDA=1 (no device = a failure, not a skip)
#   smoke      `mixtrain train --set train.device=cuda` for SMOKE_STEPS steps with train.profile:
#              it used the GPU when its own rows say peak_device_bytes > 0 (CPU run beside it)
#   sanity     SANITY_TESTS (a few fast CPU tests: the bundle's libraries at work)
#   bench      BENCH_SET, one program after the other, in what is left of the budget
# Each phase runs under `timeout`, is timed, and its failure is recorded without stopping the
# phases that do not need it. A phase's limit is its own, cut to what is left of the budget
# less SMOKE_RESERVE_S while smoke is still to come: an overrun of build or cuda never costs the
# smoke run. The exit code is non-zero when any phase failed or was not run.
# Results in $OUT (at most 6 files; the tool brings back 8):
#   device_check.log   everything, the summary table last
#   summary.txt        phase | status | seconds | exit code
#   build.log          configure and build output (the last 8 MiB)
#   ctest_cuda.xml     JUnit report of the cuda tests (with CMake >= 3.21)
#   bench.json         {"bench_<name>": the program's own JSON, or {"error": ...}}
#   smoke.jsonl        the GPU smoke run's metrics.jsonl, then the CPU run's
# Environment (defaults for the GPU machine; scripts/device_rehearse.sh sets them here):
#   OUT (required), MIXTRAIN_PYTHON (python3 on PATH), MIXTRAIN_DEPS_DIR (.device-deps),
#   JOBS (nproc), BUILD_DIR (build-device), MIXTRAIN_CMAKE_ARGS (extra configure arguments),
#   BUDGET_S (400: all phases; the warm follow-up in docs/gpu.md passes less), PHASES (every
#   phase: a comma-separated subset runs only those, e.g. for the warm follow-up), LIMIT_SCALE
#   (1: multiplies the budget and every phase's limit, for a slower machine), SANITY_TESTS,
#   SMOKE_STEPS (5), SMOKE_RESERVE_S (60), CUDA_TEST_JOBS (4), BENCH_SET (below).
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1

: "${OUT:?OUT must name the folder for the results}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export MIXTRAIN_PYTHON=${MIXTRAIN_PYTHON:-$(command -v python3 || echo python3)}
# A relative path, absolute (not resolved: a venv's python is a link that must stay one).
[[ $MIXTRAIN_PYTHON == */* && $MIXTRAIN_PYTHON != /* ]] && MIXTRAIN_PYTHON=$PWD/$MIXTRAIN_PYTHON
export MIXTRAIN_DEPS_DIR=${MIXTRAIN_DEPS_DIR:-$PWD/.device-deps}
export JOBS=${JOBS:-$(nproc)}
export BUILD_DIR=${BUILD_DIR:-build-device}
export MIXTRAIN_CMAKE_ARGS=${MIXTRAIN_CMAKE_ARGS:-}
export SMOKE_STEPS=${SMOKE_STEPS:-5}
export CUDA_TEST_JOBS=${CUDA_TEST_JOBS:-4}
# The first run's benchmarks: "program args...;program args...", run in this order, each under
# its own limit (BENCH_PROGRAM_S, 150 s) cut to what is left. The train bench at one round of
# 4 steps, 60 s per child, fits a first run; the full figures (2 rounds x 10 steps) are a
# follow-up's.
export BENCH_SET=${BENCH_SET:-"bench_adamw_cuda_bench;bench_newton_schulz_cuda_bench;bench_train_cuda_bench --rounds 1 --steps 4 --child-timeout-s 60;bench_swap_optimizer_cuda_bench --steps 5"}
export BENCH_PROGRAM_S=${BENCH_PROGRAM_S:-150}
PHASES=${PHASES:-env,configure,build,cuda,smoke,sanity,bench}
# Fast CPU tests of what the bundle provides, and of how the binaries load the C++ runtime
# (unit_core_build_info_test): yaml-cpp, toml11, nlohmann-json, xxHash (checksums),
# CLI11 and a whole CPU training run (tools_train_command_test), and the CPU AdamW numerics.
export SANITY_TESTS=${SANITY_TESTS:-"unit_core_build_info_test unit_config_yaml_reader_test unit_config_toml_reader_test unit_core_json_reader_test unit_checkpoint_metadata_test unit_optim_adamw_test tools_train_command_test"}
export LIMIT_SCALE=${LIMIT_SCALE:-1}
BUDGET_S=$((${BUDGET_S:-400} * LIMIT_SCALE))
SMOKE_RESERVE_S=$((${SMOKE_RESERVE_S:-60} * LIMIT_SCALE))
export OUT LOG="$OUT/device_check.log" BUILD_LOG="$OUT/build.log"
export WORK="$BUILD_DIR/device-check"  # scratch inside the build folder: bench JSON, smoke runs
: >"$LOG"
: >"$BUILD_LOG"

START=$(date +%s)
export DEADLINE=$((START + BUDGET_S))
RESULTS=()
FAILED=0
RESERVE=0  # seconds held back for the smoke run while it is still to come

log() { echo "$*" | tee -a "$LOG"; }

# run_phase NAME LIMIT_S FUNCTION: FUNCTION under `timeout`, stopped at LIMIT_S or at the
# budget's end less RESERVE, whichever is first; output to the log. A phase not in PHASES is
# recorded as skipped (not a failure) and returns 0.
run_phase() {
  local name=$1 limit=$(($2 * LIMIT_SCALE)) fn=$3 now left t0 rc status secs
  if [[ ,$PHASES, != *,$name,* ]]; then
    RESULTS+=("$name|skipped (PHASES)|0|-")
    return 0
  fi
  now=$(date +%s)
  left=$((DEADLINE - now - RESERVE))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    record "$name" "NOT RUN (budget spent)" 0 -
    return 1
  fi
  log ""
  log "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" bash -c "$fn" >>"$LOG" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT after ${limit}s" ;;
    *) status=FAILED ;;
  esac
  record "$name" "$status" "$secs" "$rc"
  log "=== $name: $status (${secs}s, exit $rc)"
  return $((rc != 0))
}

record() {
  RESULTS+=("$1|$2|$3|$4")
  [[ $2 == ok ]] || FAILED=1
}

# --- phases (each a function run by `bash -c` under timeout: exported) ---------------------------
phase_env() {
  date -u
  echo "tree: $(git rev-parse HEAD 2>/dev/null || echo 'no .git: the caller knows the commit')"
  uname -a
  ldd --version 2>&1 | head -1
  echo "CPUs: $(nproc)"
  nvidia-smi || echo "nvidia-smi: not available"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || true
  "$MIXTRAIN_PYTHON" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name} sm_{p.major}{p.minor} {p.total_memory / 2**30:.1f} GiB "
          f"{p.multi_processor_count} SMs")
sys.exit(0 if torch.cuda.device_count() > 0 else "torch sees no CUDA device")
EOF
  local py_ok=$?
  echo "CXX=${CXX:-} CUDAHOSTCXX=${CUDAHOSTCXX:-}"
  for tool in nvcc cmake ninja c++ g++ pkg-config; do
    printf '%-10s ' "$tool"
    if command -v "$tool" >/dev/null; then "$tool" --version 2>&1 | grep -m1 -iE 'version|release|[0-9]+\.[0-9]'; else echo "not found"; fi
  done
  echo "deps bundle: $MIXTRAIN_DEPS_DIR"
  head -3 "$MIXTRAIN_DEPS_DIR/README.md" 2>/dev/null || echo "  (none)"
  return $py_ok
}

phase_configure() {
  # The Python package needs Python's headers, which an image without -dev packages may lack:
  # then the build leaves the package out (MIXTRAIN_PYTHON_PACKAGE=OFF) and says so here.
  local python_package=ON
  if ! "$MIXTRAIN_PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    python_package=OFF
    echo "  no Python.h for $MIXTRAIN_PYTHON: building without the Python package"
  fi
  # shellcheck disable=SC2086  # MIXTRAIN_CMAKE_ARGS: several words
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMIXTRAIN_PYTHON="$MIXTRAIN_PYTHON" -DMIXTRAIN_DEPS_DIR="$MIXTRAIN_DEPS_DIR" \
    -DMIXTRAIN_PYTHON_PACKAGE=$python_package \
    -DMIXTRAIN_CUDA=ON -DMIXTRAIN_CUDA_ARCHITECTURES=90 $MIXTRAIN_CMAKE_ARGS >>"$BUILD_LOG" 2>&1
  local rc=$?
  grep -E 'mixtrain:|Found (Torch|CUDA|GTest|nlohmann|PkgConfig)|Found (sleef|libxxhash)|CMake Error' \
    "$BUILD_LOG" | sed 's/^/  /'
  grep -E '^(CMAKE_CXX_COMPILER|MIXTRAIN_LIBSTDCXX|yaml-cpp_DIR|toml11_DIR|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|benchmark_DIR|MIXTRAIN_CUDART|MIXTRAIN_SLEEF_LIBRARY|MIXTRAIN_XXHASH_LIBRARY|pkgcfg_lib_[A-Z]+_[a-z]+|MIXTRAIN_DEPS_DIR)[:=]' \
    "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | sed 's/^/  cache: /'
  return $rc
}

# The targets: the executables of the tests labelled cuda and of SANITY_TESTS (one executable
# holds a test folder: tests/tests.cmake), and bench_*cuda* that exist as Ninja targets.
phase_build() {
  local all wanted=() t tests missing=0
  all=$(ninja -C "$BUILD_DIR" -t targets all | sed -n 's/^\([A-Za-z0-9_]*\): .*/\1/p' | sort -u)
  # shellcheck disable=SC2046,SC2086
  tests=$(test_executables $(ctest --test-dir "$BUILD_DIR" -N -L cuda | sed -n 's/^ *Test *#[0-9]*: //p') \
          $SANITY_TESTS) || { echo "the test executables could not be listed"; return 1; }
  [[ -n $tests ]] || { echo "no test executable found for the cuda tests and SANITY_TESTS"; return 1; }
  # The Python package's module when configured (a shared object: it links what the executables
  # link, so a dependency that is not position-independent fails here).
  for t in $tests $(grep -E '^bench_[A-Za-z0-9_]*cuda' <<<"$all") \
    $(grep -xE 'mixtrain_python(_files)?' <<<"$all"); do
    if grep -qx "$t" <<<"$all"; then wanted+=("$t"); else echo "no target $t"; missing=1; fi
  done
  echo "targets: mixtrain ${wanted[*]}"
  # -k 0: build every target that can be built, so one broken test does not hide the others.
  cmake --build "$BUILD_DIR" -j "$JOBS" --target mixtrain "${wanted[@]}" -- -k 0 >>"$BUILD_LOG" 2>&1
  local rc=$?
  grep -E 'FAILED:|error:|undefined reference' "$BUILD_LOG" | head -40
  tail -3 "$BUILD_LOG"
  ((rc == 0)) && rc=$missing
  return $rc
}

# The executables that run the named CTest tests, from the table the configure writes
# (tests/tests.cmake: test_executables.txt; ctest's own listing names a test's command only
# once its executable has been built).
test_executables() {
  local table=$BUILD_DIR/test_executables.txt
  [[ -s $table ]] || { echo "no $table: configure first" >&2; return 1; }
  "$MIXTRAIN_PYTHON" - "$table" "$@" <<'EOF'
import sys
table, wanted = sys.argv[1], set(sys.argv[2:])
rows = dict(line.split() for line in open(table) if line.strip())
missing = sorted(wanted - rows.keys())
if missing:
    sys.exit(f"tests not in {table}: {' '.join(missing)}")
print(" ".join(sorted({rows[name] for name in wanted})))
EOF
}

phase_sanity() {
  # shellcheck disable=SC2086
  ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$JOBS" \
    -R "^($(tr ' ' '|' <<<"$SANITY_TESTS"))\$"
}

phase_cuda() {
  local junit=()
  ctest --help | grep -q -- --output-junit && junit=(--output-junit "$OUT/ctest_cuda.xml")
  MIXTRAIN_REQUIRE_CUDA=1 ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure \
    --no-tests=error -j "$CUDA_TEST_JOBS" "${junit[@]}"
}

# BENCH_SET's programs in order, each under BENCH_PROGRAM_S cut to what is left of the budget;
# its JSON (or why there is none) goes into one file.
phase_bench() {
  local entry b name rc status=0 found=0 limit args entries
  mkdir -p "$WORK/bench"
  IFS=';' read -ra entries <<<"$BENCH_SET"
  for entry in "${entries[@]}"; do
    read -ra args <<<"$entry"
    ((${#args[@]})) || continue
    name=${args[0]}
    b=$BUILD_DIR/$name
    if [[ ! -x $b ]]; then
      echo "--- $name: not built"
      status=1
      continue
    fi
    found=1
    limit=$((BENCH_PROGRAM_S * LIMIT_SCALE))
    (($(date +%s) + limit > DEADLINE - 5)) && limit=$((DEADLINE - 5 - $(date +%s)))
    if ((limit < 10)); then
      echo "--- $name: not run (budget spent)"
      status=1
      continue
    fi
    echo "--- $name ${args[*]:1} (limit ${limit}s)"
    timeout -k 5 "$limit" "$b" "${args[@]:1}" --out "$WORK/bench/$name.json"
    rc=$?
    echo "--- $name: exit $rc"
    # A program that skipped (it saw no CUDA device) measured nothing: a failure on this machine.
    if [[ $rc -eq 0 && -s $WORK/bench/$name.json ]] && grep -q '"skipped"' "$WORK/bench/$name.json"; then
      rc=77
    fi
    [[ $rc -eq 0 && -s $WORK/bench/$name.json ]] || { status=1; echo "$rc" >"$WORK/bench/$name.failed"; }
  done
  ((found)) || { echo "no program of BENCH_SET was built"; status=1; }
  return $status
}

# bench.json from whatever the programs left, also after a timeout.
collect_bench() {
  "$MIXTRAIN_PYTHON" - "$WORK/bench" "$OUT/bench.json" <<'EOF'
import glob, json, os, sys
src, dst = sys.argv[1], sys.argv[2]
out = {}
for path in sorted(glob.glob(os.path.join(src, "*.json"))):
    name = os.path.basename(path)[:-5]
    try:
        with open(path) as f:
            out[name] = json.load(f)
    except (OSError, ValueError) as e:
        out[name] = {"error": f"unreadable JSON: {e}"}
for path in sorted(glob.glob(os.path.join(src, "*.failed"))):
    name = os.path.basename(path)[:-7]
    out.setdefault(name, {})["error_exit_code"] = open(path).read().strip()
with open(dst, "w") as f:
    json.dump(out, f, indent=1)
print(f"bench.json: {len(out)} programs")
EOF
}

# A short GPU training run; the same config on CPU beside it (its losses are for the reader:
# the numerics checks are the cuda tests). The GPU run fails unless it writes SMOKE_STEPS rows
# and its own rows (train.profile) report peak_device_bytes > 0: the caching allocator's peak on
# the run's device, which a run that stayed on the CPU does not have. nvidia-smi's reading of
# the device's memory is printed for information only.
phase_smoke() {
  local status=0 device
  rm -rf "$WORK/smoke"
  mkdir -p "$WORK/smoke"
  for device in cuda cpu; do
    echo "--- mixtrain train, train.device=$device, $SMOKE_STEPS steps"
    "$BUILD_DIR/mixtrain" train --config configs/qwen2_moe_tiny.yaml --run-dir "$WORK/smoke/$device" \
      --set train.device=$device --set train.steps="$SMOKE_STEPS" --set train.log_every=1 \
      --set train.profile=true
    echo "--- exit $?"
    [[ $device == cuda ]] || continue
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null || true
    "$MIXTRAIN_PYTHON" - "$WORK/smoke/cuda/metrics.jsonl" "$SMOKE_STEPS" <<'EOF' || status=1
import json, sys
path, steps = sys.argv[1], int(sys.argv[2])
try:
    rows = [json.loads(line) for line in open(path) if line.strip()]
except (OSError, ValueError) as e:
    sys.exit(f"SMOKE: {path}: {e}")
train = [r for r in rows if "loss" in r]
peaks = [r.get("peak_device_bytes", 0) for r in train]
print(f"--- metrics.jsonl: {len(train)} step rows; peak_device_bytes per row: {peaks}")
if len(train) != steps:
    sys.exit(f"SMOKE: {len(train)} step rows, not {steps}")
if not all(p > 0 for p in peaks):
    sys.exit("SMOKE: a row without peak_device_bytes > 0: the run did not use the GPU")
EOF
  done
  return $status
}

# smoke.jsonl from whatever the runs wrote, also after a timeout.
collect_smoke() {
  local device
  for device in cuda cpu; do
    echo "# train.device=$device"
    cat "$WORK/smoke/$device/metrics.jsonl" 2>/dev/null
  done >"$OUT/smoke.jsonl"
}

export -f phase_env phase_configure phase_build phase_sanity phase_cuda phase_bench phase_smoke \
  collect_bench test_executables

# --- the run ------------------------------------------------------------------------------------
log "device_check: OUT=$OUT BUILD_DIR=$BUILD_DIR JOBS=$JOBS MIXTRAIN_PYTHON=$MIXTRAIN_PYTHON budget ${BUDGET_S}s"
run_phase env 45 phase_env
if run_phase configure 90 phase_configure; then
  # Until smoke has run, each phase leaves SMOKE_RESERVE_S of the budget to it.
  [[ ,$PHASES, == *,smoke,* ]] && RESERVE=$SMOKE_RESERVE_S
  run_phase build 240 phase_build
  # Tests and programs that built run even when others did not.
  run_phase cuda 150 phase_cuda
  RESERVE=0
  if [[ -x $BUILD_DIR/mixtrain || ,$PHASES, != *,smoke,* ]]; then
    run_phase smoke 90 phase_smoke
    collect_smoke
  else
    record smoke "NOT RUN (no mixtrain binary)" 0 -
  fi
  run_phase sanity 60 phase_sanity
  # The benchmarks last: they take what is left.
  run_phase bench 600 phase_bench
  collect_bench >>"$LOG" 2>&1
else
  for p in build cuda smoke sanity bench; do record "$p" "NOT RUN (configure failed)" 0 -; done
fi

# The build log within the tool's 16 MiB per file.
if (($(stat -c %s "$BUILD_LOG") > 8 * 1024 * 1024)); then
  tail -c $((8 * 1024 * 1024)) "$BUILD_LOG" >"$BUILD_LOG.tail" && mv "$BUILD_LOG.tail" "$BUILD_LOG"
fi
{
  printf '%-10s | %-30s | %8s | %s\n' phase status seconds exit
  for p in "${RESULTS[@]}"; do
    IFS='|' read -r name status secs rc <<<"$p"
    printf '%-10s | %-30s | %8s | %s\n' "$name" "$status" "$secs" "$rc"
  done
  echo "total $(($(date +%s) - START))s; $([[ $FAILED -eq 0 ]] && echo 'all phases ok' || echo 'SOME PHASES FAILED')"
} >"$OUT/summary.txt"
log ""
tee -a "$LOG" <"$OUT/summary.txt"
exit $FAILED
