#!/usr/bin/env bash
# Everything selkv checks on a GPU machine (H200), in one call:
#   1. build (Release, with the torch extension when a CUDA torch is importable)
#   2. C++ GPU tests (gtest)            3. pytest tests/python
#   4. compute-sanitizer memcheck over the GPU tests (C++ and pytest)
#   5. main job + benchmark grid -> CSV
#   6. side by side with FlashMLA (bench/compare_flash_mla.py -> compare.csv) when `flash_mla` is
#      importable (PYTHONPATH; built ad hoc, never part of this tree) and the torch extension built
# and a last line:  GPU SUITE: gtest N passed/M failed; pytest ...; memcheck ...; bench ...; flash_mla ...
#
#   scripts/gpu_suite.sh [--no-bench] [--no-memcheck] [--only-bench] [--quick] [--no-torch]
#                        [--no-pytest]
#
#   --no-bench     skip stage 5            --no-memcheck  skip stage 4
#   --only-bench   build (without torch), then stage 5 only (cheapest way to get numbers)
#   --quick        quick benchmark subset, fewer repetitions
#   --no-torch     build without the torch extension (and skip pytest)
#   --no-pytest    skip pytest (plain and under memcheck)
#
# Environment: OUT (out) for logs and CSVs, BUILD_DIR (build), JOBS ($(nproc)),
#   SELKV_GTEST_FILTER (GPU tests; default *Gpu*:*GPU*:*Cuda*, every test when none matches),
#   SELKV_GIT_HASH (recorded in the CSVs; the GPU machine's copy of the tree has no .git),
#   SELKV_TEST_TIMEOUT / SELKV_MEMCHECK_TIMEOUT / SELKV_BENCH_TIMEOUT (seconds per run),
#   SELKV_MEMCHECK_FUZZ_CASES (FuzzGpu cases under memcheck, default 12; SELKV_FUZZ_CASES /
#   SELKV_FUZZ_SEED set the plain run's), SELKV_TEST_BIG=0 (skip the >4 GiB cache tests) and
#   SELKV_TEST_FULL=0 (trimmed contract-test grids; memcheck sets both),
#   SELKV_CUDA_FLAGS (extra CUDA flags, e.g. a kernel variant's "-DNAME=1" switch, to run the
#   whole suite on a variant before it becomes the default).
# Needs no network when third_party/cutlass is present (carry it with the tree).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-out}"
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"

do_tests=1 do_memcheck=1 do_bench=1 do_pytest=1 quick=0 torch=auto
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-bench) do_bench=0 ;;
    --no-memcheck) do_memcheck=0 ;;
    --only-bench) do_tests=0; do_memcheck=0; do_pytest=0; do_bench=1; torch=OFF ;;
    --quick) quick=1 ;;
    --no-torch) torch=OFF; do_pytest=0 ;;
    --no-pytest) do_pytest=0 ;;
    -h|--help) sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "[gpu_suite $(date +%H:%M:%S)] $*"; }
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"

if ! nvidia-smi -L >"$LOGS/nvidia-smi.txt" 2>&1; then
  log "WARNING: nvidia-smi failed; GPU tests will skip themselves"
fi
cat "$LOGS/nvidia-smi.txt" 2>/dev/null | head -4

torch_ok=0
if python3 -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; then torch_ok=1; fi
if [[ "$torch" == auto ]]; then
  if [[ "$torch_ok" == 1 ]]; then torch=ON; else torch=OFF; do_pytest=0; log "no CUDA torch importable: torch extension and pytest skipped"; fi
fi

overall=0
gtest_summary="not run" pytest_summary="not run" memcheck_summary="not run" bench_summary="not run"

# ---- 1. build ------------------------------------------------------------------------------------
[[ -f third_party/cutlass/include/cute/tensor.hpp ]] || log "WARNING: third_party/cutlass missing: CuTe kernels will not be built (run scripts/setup.sh with network, then carry third_party/cutlass)"
GEN_ARGS=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then GEN_ARGS=(-G Ninja); fi
log "build: $BUILD_DIR (Release, torch $torch, $JOBS jobs), log $LOGS/build.log"
t0=$SECONDS
[[ -n "${SELKV_CUDA_FLAGS:-}" ]] && GEN_ARGS+=("-DCMAKE_CUDA_FLAGS=$SELKV_CUDA_FLAGS") && log "CUDA flags: $SELKV_CUDA_FLAGS"
if ! { cmake -S . -B "$BUILD_DIR" "${GEN_ARGS[@]}" -DCMAKE_BUILD_TYPE=Release -DSELKV_BUILD_TORCH="$torch" \
       && cmake --build "$BUILD_DIR" -j "$JOBS"; } >"$LOGS/build.log" 2>&1; then
  tail -40 "$LOGS/build.log"
  echo "GPU SUITE: BUILD FAILED (see $LOGS/build.log)"
  exit 1
fi
log "build done in $((SECONDS - t0)) s"
grep -E "bytes spill|ptxas warning" "$LOGS/build.log" | head -20 || true

# ---- GPU test filter -----------------------------------------------------------------------------
FILTER="${SELKV_GTEST_FILTER:-*Gpu*:*GPU*:*Cuda*}"
TESTS_BIN="$BUILD_DIR/selkv_tests"
if [[ -x "$TESTS_BIN" ]]; then
  n_match=$("$TESTS_BIN" --gtest_list_tests --gtest_filter="$FILTER" 2>/dev/null | grep -c '^  ' || true)
  if [[ "$n_match" == 0 ]]; then
    log "no test matches '$FILTER': running every C++ test"
    FILTER='*'
  fi
fi

# Counts from a gtest log: "N passed/M failed[/K skipped]".
gtest_counts() {
  local f="$1" p fl sk
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$f" | tail -1 | grep -oE '[0-9]+$' || true)
  fl=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+' || true)
  sk=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+' || true)
  echo "${p:-0} passed/${fl:-0} failed${sk:+/$sk skipped}"
}
# The torch operator library from this build (python/selkv/_ops.py reads $SELKV_OPS_LIBRARY).
if [[ -z "${SELKV_OPS_LIBRARY:-}" ]]; then
  SELKV_OPS_LIBRARY="$(find "$ROOT/$BUILD_DIR" -name '_selkv_ops*.so' 2>/dev/null | head -n1)"
  [[ -n "$SELKV_OPS_LIBRARY" ]] && export SELKV_OPS_LIBRARY
fi
pytest_env() { env PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" SELKV_BUILD_DIR="$ROOT/$BUILD_DIR" "$@"; }
have_pytests() { ls tests/python/test_*.py >/dev/null 2>&1; }

# ---- 2. C++ GPU tests ----------------------------------------------------------------------------
if [[ "$do_tests" == 1 ]]; then
  if [[ -x "$TESTS_BIN" ]]; then
    log "gtest ($FILTER), log $LOGS/gtest.log"
    timeout "${SELKV_TEST_TIMEOUT:-300}" "$TESTS_BIN" --gtest_filter="$FILTER" --gtest_output="xml:$OUT/gtest.xml" >"$LOGS/gtest.log" 2>&1
    rc=$?
    gtest_summary="$(gtest_counts "$LOGS/gtest.log")"
    [[ $rc == 0 ]] || { overall=1; grep -E '^\[  FAILED  \]' "$LOGS/gtest.log" | head -20; gtest_summary+=" (exit $rc)"; }
    log "gtest: $gtest_summary"
  else
    gtest_summary="no test binary"; overall=1
  fi
fi

# ---- 3. pytest -----------------------------------------------------------------------------------
if [[ "$do_pytest" == 1 && -z "${SELKV_OPS_LIBRARY:-}" ]]; then
  log "no _selkv_ops.so in $BUILD_DIR: pytest cannot load the torch ops"
  pytest_summary="no torch extension built"; overall=1; do_pytest=0
fi
if [[ "$do_pytest" == 1 ]]; then
  if have_pytests; then
    log "pytest tests/python, log $LOGS/pytest.log"
    pytest_env python3 -m pytest tests/python -q -rfEs --junitxml="$OUT/pytest.xml" >"$LOGS/pytest.log" 2>&1
    rc=$?
    pytest_summary="$(grep -E '(passed|failed|error|skipped|no tests ran)' "$LOGS/pytest.log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')"
    if [[ $rc != 0 && $rc != 5 ]]; then overall=1; tail -30 "$LOGS/pytest.log"; pytest_summary+=" (exit $rc)"; fi
    log "pytest: $pytest_summary"
  else
    pytest_summary="no tests/python/test_*.py"
  fi
fi

# ---- 4. memcheck ---------------------------------------------------------------------------------
if [[ "$do_memcheck" == 1 ]]; then
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    memcheck_summary="compute-sanitizer not found"; overall=1
  else
    mc_errors=0 mc_runs=""
    mc() {  # name, command...
      local name="$1"; shift
      log "memcheck: $name, log $LOGS/memcheck_$name.log"
      timeout "${SELKV_MEMCHECK_TIMEOUT:-400}" \
        compute-sanitizer --tool memcheck --print-limit 100 --error-exitcode 86 "$@" >"$LOGS/memcheck_$name.log" 2>&1
      local rc=$?
      local errs
      errs=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$LOGS/memcheck_$name.log" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
      if [[ $rc == 86 || "$errs" != 0 ]]; then
        mc_errors=1
        grep -E '^========= (Invalid|Program hit|Error|  +at )' "$LOGS/memcheck_$name.log" | head -20
      elif [[ $rc == 124 ]]; then
        log "memcheck $name: timed out after ${SELKV_MEMCHECK_TIMEOUT:-400} s (SELKV_MEMCHECK_TIMEOUT)"
        errs="timeout"; mc_errors=1
      elif [[ $rc != 0 ]]; then
        log "memcheck $name: tests failed under the sanitizer (exit $rc), no memory errors reported"
        overall=1
      fi
      mc_runs+="$name:$errs "
    }
    # Under the sanitizer (10-50x slower): no multi-GiB caches, the contract tests' trimmed grids,
    # a short fuzz run, a longer hang deadline per GPU wait.
    if [[ -x "$TESTS_BIN" ]]; then
      SELKV_TEST_BIG=0 SELKV_TEST_FULL=0 SELKV_FUZZ_CASES="${SELKV_MEMCHECK_FUZZ_CASES:-12}" SELKV_TEST_HANG_S=300 \
        mc gtest "$TESTS_BIN" --gtest_filter="$FILTER"
    fi
    if [[ "$do_pytest" == 1 ]] && have_pytests; then
      export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # so out-of-bounds accesses land outside allocations
      mc pytest env PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" SELKV_BUILD_DIR="$ROOT/$BUILD_DIR" \
        python3 -m pytest tests/python -q -x -p no:cacheprovider
      unset PYTORCH_NO_CUDA_MEMORY_CACHING
    fi
    if [[ "$mc_errors" == 0 ]]; then memcheck_summary="clean (${mc_runs% })"; else memcheck_summary="ERRORS (${mc_runs% })"; overall=1; fi
    log "memcheck: $memcheck_summary"
  fi
fi

# ---- 5. main job + benchmarks --------------------------------------------------------------------
if [[ "$do_bench" == 1 ]]; then
  CLI="$BUILD_DIR/selkv"
  qflag=(); [[ "$quick" == 1 ]] && qflag=(--quick)
  log "main job: $CLI ${qflag[*]}, log $LOGS/main_job.log"
  timeout "${SELKV_BENCH_TIMEOUT:-300}" "$CLI" "${qflag[@]}" --csv "$OUT/main_job.csv" 2>"$LOGS/main_job.stderr" | tee "$LOGS/main_job.log"
  job_rc=${PIPESTATUS[0]}
  log "benchmarks: $CLI --bench ${qflag[*]}, log $LOGS/bench.log"
  timeout "${SELKV_BENCH_TIMEOUT:-300}" "$CLI" --bench "${qflag[@]}" --csv "$OUT/bench.csv" 2>"$LOGS/bench.stderr" | tee "$LOGS/bench.log"
  bench_rc=${PIPESTATUS[0]}
  rows=0; [[ -f "$OUT/bench.csv" ]] && rows=$(($(wc -l <"$OUT/bench.csv") - 1))
  bench_summary="written to $OUT/bench.csv ($rows rows)"
  if [[ $job_rc != 0 || $bench_rc != 0 ]]; then
    overall=1
    bench_summary+=" with FAILURES (main job exit $job_rc, bench exit $bench_rc)"
  fi
fi

# ---- 6. side by side with FlashMLA -----------------------------------------------------------------
compare_summary="not run"
if [[ "$do_bench" == 1 ]]; then
  ops_lib="$(find "$BUILD_DIR" -name '_selkv_ops*.so' 2>/dev/null | head -n1)"
  if [[ -z "$ops_lib" ]]; then
    compare_summary="skipped (no torch extension)"
  elif ! python3 -c 'import flash_mla' >/dev/null 2>&1; then
    compare_summary="skipped (flash_mla not importable)"
  else
    qflag=(); [[ "$quick" == 1 ]] && qflag=(--quick)
    log "FlashMLA side by side: bench/compare_flash_mla.py ${qflag[*]}, log $LOGS/compare.log"
    timeout "${SELKV_BENCH_TIMEOUT:-300}" env PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
      SELKV_OPS_LIBRARY="$ops_lib" PYTHONUNBUFFERED=1 python3 bench/compare_flash_mla.py "${qflag[@]}" \
      --csv "$OUT/compare.csv" >"$LOGS/compare.log" 2>&1
    crc=$?
    tail -n 30 "$LOGS/compare.log"
    if [[ $crc == 0 ]]; then compare_summary="written to $OUT/compare.csv"; else compare_summary="FAILED (exit $crc)"; overall=1; fi
  fi
fi

echo "GPU SUITE: gtest $gtest_summary; pytest $pytest_summary; memcheck $memcheck_summary; bench $bench_summary; flash_mla $compare_summary"
exit "$overall"
