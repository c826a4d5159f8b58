#!/usr/bin/env bash
# selkv test suite: builds if needed, then runs pytest tests/python (when the torch extension
# was built: scripts/setup.sh --with-torch) and the C++ tests through ctest, ctest last so that
# its summary closes the output. Without a GPU the GPU tests skip themselves and the CPU tests
# (oracle, golden vectors, argument checks, the torch ops' CPU kernels, the installed CMake
# package) run. Exits nonzero on any failure.
#
#   scripts/test.sh [extra ctest args, e.g. -R Oracle]
#
# Environment: BUILD_DIR (build), JOBS ($(nproc)), SELKV_SKIP_PYTEST=1 to skip pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"

log() { echo "[test] $*"; }

if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  log "no configured build in $BUILD_DIR: running scripts/setup.sh"
  BUILD_DIR="$BUILD_DIR" JOBS="$JOBS" bash "$ROOT/scripts/setup.sh"
else
  command -v nvcc >/dev/null 2>&1 || { [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"; } || true
  log "building $BUILD_DIR (incremental)"
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi

# ---- pytest: wherever the torch extension was built ------------------------------------------
# The Python that CMake built the extension against is the one with a matching torch.
PY="$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | head -n1)"
[[ -n "$PY" ]] || PY=python3
ops_lib="$(find "$BUILD_DIR/python" -name '_selkv_ops*.so' 2>/dev/null | head -n1)"
[[ -z "$ops_lib" ]] || ops_lib="$(realpath "$ops_lib")"
run_pytest=0
if [[ "${SELKV_SKIP_PYTEST:-0}" == 1 ]]; then
  log "SELKV_SKIP_PYTEST=1: pytest skipped"
elif [[ -z "$ops_lib" ]]; then
  log "pytest skipped: no torch extension in $BUILD_DIR (scripts/setup.sh --with-torch builds it)"
elif ! "$PY" -c 'import pytest' >/dev/null 2>&1; then
  log "pytest skipped: pytest is not importable by $PY ($PY -m pip install pytest)"
else
  run_pytest=1
fi

pytest_rc=0
if [[ "$run_pytest" == 1 ]]; then
  log "pytest tests/python with $PY and $ops_lib"
  # The library was built, so failing to find or load it is a failure, not a skip.
  PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" SELKV_BUILD_DIR="$(realpath "$BUILD_DIR")" \
    SELKV_OPS_LIBRARY="$ops_lib" SELKV_REQUIRE_OPS=1 \
    "$PY" -m pytest tests/python -q -rs || pytest_rc=$?
  [[ "$pytest_rc" == 5 ]] && pytest_rc=0   # no tests collected is not a failure
  [[ "$pytest_rc" == 0 ]] || log "pytest FAILED (exit $pytest_rc)"
fi

ctest_rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" || ctest_rc=$?
if [[ "$ctest_rc" != 0 ]]; then exit "$ctest_rc"; fi
exit "$pytest_rc"
