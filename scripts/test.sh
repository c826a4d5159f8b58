#!/usr/bin/env bash
# selkv test suite: builds if needed, runs the C++ tests through ctest (CPU tests always; GPU
# tests skip themselves without a GPU), then pytest tests/python when a GPU, a CUDA torch and
# the selkv torch extension are available (pytest runs first, ctest last). Exits nonzero on
# any failure; the last lines printed are ctest's summary.
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

# ---- pytest: only where it can run -----------------------------------------------------------
run_pytest=0
if [[ "${SELKV_SKIP_PYTEST:-0}" != 1 ]] && ls tests/python/test_*.py >/dev/null 2>&1; then
  if python3 - <<'PY' >/dev/null 2>&1
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
  then
    ops_lib="${SELKV_OPS_LIBRARY:-$(find "$BUILD_DIR" -name '_selkv_ops*.so' 2>/dev/null | head -n1)}"
    if [[ -n "$ops_lib" && -f "$ops_lib" ]]; then
      export SELKV_OPS_LIBRARY="$ops_lib"
      run_pytest=1
    else
      log "a CUDA torch is importable but no selkv torch extension was built: pytest skipped"
    fi
  else
    log "no GPU or no CUDA-enabled torch: pytest tests/python skipped"
  fi
fi

# ---- pytest first (when it can run), ctest last so its summary closes the output ------------
pytest_rc=0
if [[ "$run_pytest" == 1 ]]; then
  PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" SELKV_BUILD_DIR="$ROOT/$BUILD_DIR" \
    python3 -m pytest tests/python -q || pytest_rc=$?
  [[ "$pytest_rc" == 5 ]] && pytest_rc=0   # no tests collected is not a failure
  [[ "$pytest_rc" == 0 ]] || log "pytest FAILED (exit $pytest_rc)"
fi

ctest_rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" || ctest_rc=$?
if [[ "$ctest_rc" != 0 ]]; then exit "$ctest_rc"; fi
exit "$pytest_rc"
