#!/usr/bin/env bash
# selkv one-command set-up: system packages, CUTLASS headers, configure + build.
#
#   scripts/setup.sh [--no-build] [-- <extra cmake args>]
#
# Environment:
#   BUILD_DIR (build)  BUILD_TYPE (Release)  JOBS ($(nproc))
#   SELKV_CUTLASS_WHEEL  path to a local nvidia_cutlass-4.2.0.0 wheel (offline install)
#
# Idempotent: every step is skipped when its result is already there, so a second run only
# rebuilds what changed. Works without a network once third_party/cutlass exists (that folder
# is git-ignored; carry it to machines that have no network).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CUTLASS_VERSION="4.2.0.0"
CUTLASS_DIR="$ROOT/third_party/cutlass"
BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
JOBS="${JOBS:-$(nproc)}"
DO_BUILD=1
EXTRA_CMAKE_ARGS=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) DO_BUILD=0; shift ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA_CMAKE_ARGS=("$@"); break ;;
    *) echo "setup.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# ---- 1. system packages (apt only for what is missing) -----------------------------------------
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

missing=()
if ! command -v cmake >/dev/null 2>&1; then
  missing+=(cmake)
elif ! version_ge "$(cmake --version | head -n1 | awk '{print $3}')" "3.24"; then
  missing+=(cmake)
fi
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || missing+=(make)
have_gtest=0
for f in /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h; do
  [[ -f "$f" ]] && have_gtest=1
done
[[ "$have_gtest" == 1 ]] || missing+=(libgtest-dev)
if [[ ! -f "$CUTLASS_DIR/include/cute/tensor.hpp" && -z "${SELKV_CUTLASS_WHEEL:-}" ]]; then
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    log "installing with apt: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    die "missing: ${missing[*]} (install them with your package manager, or run as root on Debian/Ubuntu)"
  fi
else
  log "system packages present (cmake $(cmake --version | head -n1 | awk '{print $3}'), g++ $(g++ -dumpversion), GoogleTest)"
fi

# ---- 2. CUDA toolkit (assumed installed; never installed here) ---------------------------------
if ! command -v nvcc >/dev/null 2>&1; then
  for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0; do
    if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then export PATH="$d/bin:$PATH"; break; fi
  done
fi
if ! command -v nvcc >/dev/null 2>&1; then
  die "CUDA toolkit not found: nvcc is neither on PATH nor in /usr/local/cuda/bin.
        selkv needs the CUDA 13 toolkit (nvcc, cudart, cuBLAS). Install it, or set CUDA_HOME."
fi
NVCC_VERSION="$(nvcc --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')"
if ! version_ge "$NVCC_VERSION" "13.0"; then
  log "WARNING: nvcc $NVCC_VERSION found; selkv is developed and tested with CUDA 13.0"
else
  log "CUDA toolkit: nvcc $NVCC_VERSION ($(command -v nvcc))"
fi

# ---- 3. CUTLASS headers from the nvidia-cutlass wheel -------------------------------------------
if [[ -f "$CUTLASS_DIR/include/cute/tensor.hpp" && -d "$CUTLASS_DIR/tools/util/include/cutlass" ]]; then
  log "CUTLASS headers present: $CUTLASS_DIR ($(cat "$CUTLASS_DIR/VERSION" 2>/dev/null || echo 'version unknown'))"
else
  WHEEL="${SELKV_CUTLASS_WHEEL:-}"
  if [[ -z "$WHEEL" ]]; then
    WHEEL="$(ls "$ROOT"/.whl/nvidia_cutlass-"$CUTLASS_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  fi
  if [[ -z "$WHEEL" ]]; then
    log "downloading nvidia-cutlass==$CUTLASS_VERSION (headers only are kept)"
    mkdir -p "$ROOT/.whl"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      "nvidia-cutlass==$CUTLASS_VERSION" -d "$ROOT/.whl" \
      || die "could not download the nvidia-cutlass wheel (no network?). Copy third_party/cutlass
        from a machine where setup.sh ran, or set SELKV_CUTLASS_WHEEL to a local wheel file."
    WHEEL="$(ls "$ROOT"/.whl/nvidia_cutlass-"$CUTLASS_VERSION"-*.whl | head -n1)"
  fi
  [[ -f "$WHEEL" ]] || die "wheel not found: $WHEEL"
  TMP="$ROOT/third_party/.cutlass.tmp.$$"
  rm -rf "$TMP"
  mkdir -p "$TMP"
  trap 'rm -rf "$TMP"' EXIT
  log "extracting headers from $(basename "$WHEEL")"
  if command -v unzip >/dev/null 2>&1; then
    unzip -q "$WHEEL" 'cutlass_library/source/include/*' \
      'cutlass_library/source/tools/util/include/*' -d "$TMP"
  else
    python3 - "$WHEEL" "$TMP" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefixes = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefixes)])
PY
  fi
  SRC="$TMP/cutlass_library/source"
  [[ -f "$SRC/include/cute/tensor.hpp" ]] || die "the wheel has no cutlass_library/source/include/cute"
  mkdir -p "$TMP/cutlass/tools/util"
  mv "$SRC/include" "$TMP/cutlass/include"
  mv "$SRC/tools/util/include" "$TMP/cutlass/tools/util/include"
  echo "nvidia-cutlass $CUTLASS_VERSION" > "$TMP/cutlass/VERSION"
  rm -rf "$CUTLASS_DIR"
  mkdir -p "$(dirname "$CUTLASS_DIR")"
  mv "$TMP/cutlass" "$CUTLASS_DIR"
  rm -rf "$TMP"
  trap - EXIT
  log "CUTLASS headers installed: $CUTLASS_DIR ($(du -sh "$CUTLASS_DIR" | cut -f1))"
fi

# ---- 4. configure + build ------------------------------------------------------------------------
if [[ "$DO_BUILD" == 0 ]]; then
  log "--no-build: done"
  exit 0
fi
GEN_ARGS=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  GEN_ARGS=(-G Ninja)
fi
log "configuring $BUILD_DIR ($BUILD_TYPE)"
cmake -S "$ROOT" -B "$BUILD_DIR" "${GEN_ARGS[@]}" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${EXTRA_CMAKE_ARGS[@]}" \
  || die "cmake configure failed (see above)"
log "building with $JOBS jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"
log "done: $BUILD_DIR/selkv (main job + benchmarks), $BUILD_DIR/selkv_tests; run scripts/test.sh"
