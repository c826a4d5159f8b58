#!/usr/bin/env bash
# selkv one-command set-up: system packages, CUTLASS headers, configure + build.
#
#   scripts/setup.sh [--with-torch] [--no-build] [--cutlass-only] [-- <extra cmake args>]
#
#   --with-torch    also build the torch extension so that scripts/test.sh runs pytest: uses the
#                   torch of python3 when it has one, else installs torch (PyPI's Linux wheel, a
#                   CUDA build that also runs on CPU-only machines: ~3 GB download, ~5 GB on disk)
#                   with pytest and numpy into a venv at $SELKV_TORCH_VENV, reused by later runs
#   --no-build      set up only (packages, CUTLASS headers, torch), no configure or build
#   --cutlass-only  only fetch the CUTLASS headers (what `pip install .` needs from this script)
#
# Environment:
#   BUILD_DIR (build)  BUILD_TYPE (Release)  JOBS ($(nproc))
#   SELKV_CUTLASS_WHEEL  path to a local nvidia_cutlass-4.2.0.0 wheel (offline install)
#   SELKV_TORCH_VENV     venv for --with-torch (${XDG_CACHE_HOME:-~/.cache}/selkv/torch-venv)
#   SELKV_NVCC12_WHEEL   path to a local nvidia_cuda_nvcc_cu12-12.9.86 wheel (its ptxas runs the
#                        sm_70 check of the QSA simple kernel; third_party/nvcc12)
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
WITH_TORCH=0
CUTLASS_ONLY=0
TORCH_VENV="${SELKV_TORCH_VENV:-${XDG_CACHE_HOME:-${HOME:-$ROOT}/.cache}/selkv/torch-venv}"
EXTRA_CMAKE_ARGS=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) DO_BUILD=0; shift ;;
    --with-torch) WITH_TORCH=1; shift ;;
    --cutlass-only) CUTLASS_ONLY=1; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA_CMAKE_ARGS=("$@"); break ;;
    *) echo "setup.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# ---- 1. system packages (apt only for what is missing) -----------------------------------------
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

if [[ "$CUTLASS_ONLY" == 0 ]]; then
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
if [[ ! -f "$CUTLASS_DIR/include/cute/tensor.hpp" && -z "${SELKV_CUTLASS_WHEEL:-}" ]] || [[ "$WITH_TORCH" == 1 ]]; then
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
fi
if [[ "$WITH_TORCH" == 1 ]] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
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
fi  # CUTLASS_ONLY

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

if [[ "$CUTLASS_ONLY" == 1 ]]; then
  log "--cutlass-only: done"
  exit 0
fi

# ---- 3b. CUDA 12's ptxas for the sm_70 check of the C8 simple kernel ------------------------------
# CUDA 13's nvcc cannot target sm_70 (V100), which the QSA simple kernel promises to serve. PyPI's
# nvidia-cuda-nvcc-cu12 wheel holds only ptxas, libnvvm and libdevice (no nvcc driver, cicc or
# fatbinary), so the ctest QsaSm70.SimpleKernelAssembles (cmake/qsa_sm70_check.cmake) compiles the
# kernel's TU to PTX with CUDA 13's nvcc (compute_75, the lowest it knows), relabels it PTX 7.0 /
# sm_70 and assembles it with this ptxas for sm_70: any instruction sm_70 lacks is an error.
# Required like CUTLASS (CI has the network for torch anyway; a skipped check would let an
# SM75+-only construct in unnoticed). Offline: put the wheel in .whl/ or set SELKV_NVCC12_WHEEL.
NVCC12_VERSION="12.9.86"
NVCC12_DIR="$ROOT/third_party/nvcc12"
if [[ -x "$NVCC12_DIR/bin/ptxas" ]]; then
  log "CUDA 12 ptxas (sm_70 check): $NVCC12_DIR/bin/ptxas"
else
  WHEEL="${SELKV_NVCC12_WHEEL:-}"
  if [[ -z "$WHEEL" ]]; then
    WHEEL="$(ls "$ROOT"/.whl/nvidia_cuda_nvcc_cu12-"$NVCC12_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  fi
  if [[ -z "$WHEEL" ]]; then
    log "downloading nvidia-cuda-nvcc-cu12==$NVCC12_VERSION (its ptxas is kept)"
    mkdir -p "$ROOT/.whl"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      "nvidia-cuda-nvcc-cu12==$NVCC12_VERSION" -d "$ROOT/.whl" \
      || die "could not download the nvidia-cuda-nvcc-cu12 wheel (no network?). Put
        nvidia_cuda_nvcc_cu12-$NVCC12_VERSION-*.whl in .whl/ or set SELKV_NVCC12_WHEEL"
    WHEEL="$(ls "$ROOT"/.whl/nvidia_cuda_nvcc_cu12-"$NVCC12_VERSION"-*.whl | head -n1)"
  fi
  mkdir -p "$NVCC12_DIR/bin"
  python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("nvidia/cuda_nvcc/bin/ptxas"))' \
    "$WHEEL" > "$NVCC12_DIR/bin/ptxas.tmp" || die "$WHEEL has no nvidia/cuda_nvcc/bin/ptxas"
  chmod +x "$NVCC12_DIR/bin/ptxas.tmp" && mv "$NVCC12_DIR/bin/ptxas.tmp" "$NVCC12_DIR/bin/ptxas"
  "$NVCC12_DIR/bin/ptxas" --version >/dev/null || die "the CUDA 12 ptxas does not run on this machine"
  log "CUDA 12 ptxas installed: $NVCC12_DIR/bin/ptxas"
fi

# ---- 4. torch for the Python tests (--with-torch) ------------------------------------------------
# PyPI has no CPU-only torch for Linux: its wheel is the CUDA build with the nvidia-* wheels it
# pins (an older system CUDA/NCCL cannot stand in for them). It imports and runs the CPU ops on a
# machine without a GPU. A venv outside the tree keeps it out of the user's Python and lets fresh
# clones on the same machine reuse it.
TORCH_CMAKE_ARGS=(-DSELKV_BUILD_TORCH=AUTO)  # a per-run choice: a failed ON is not kept in the cache
has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; }
if [[ "$WITH_TORCH" == 1 ]]; then
  if has_cuda_torch python3; then
    PY="$(python3 -c 'import sys; print(sys.executable)')"
  else
    PY="$TORCH_VENV/bin/python"
    if [[ -x "$PY" ]] && has_cuda_torch "$PY"; then
      :
    else
      log "installing torch (PyPI, CUDA build; ~3 GB download, ~5 GB on disk) with pytest and numpy into $TORCH_VENV"
      python3 -m venv "$TORCH_VENV" || die "could not create a venv at $TORCH_VENV: install python3-venv, or set SELKV_TORCH_VENV"
      "$PY" -m pip install --quiet torch pytest numpy \
        || die "pip could not install torch into $TORCH_VENV (no network?); without --with-torch setup.sh builds the C++ library and its tests only"
      has_cuda_torch "$PY" || die "torch installed into $TORCH_VENV but '$PY -c \"import torch\"' fails (see above)"
    fi
  fi
  if ! "$PY" -c 'import pytest, numpy' >/dev/null 2>&1; then
    log "installing pytest and numpy for $PY"
    "$PY" -m pip install --quiet pytest numpy || die "pip could not install pytest and numpy for $PY"
  fi
  log "torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) for the extension and pytest: $PY"
  TORCH_CMAKE_ARGS=(-DSELKV_BUILD_TORCH=ON "-DPython3_EXECUTABLE=$PY")
fi

# ---- 5. configure + build ------------------------------------------------------------------------
if [[ "$DO_BUILD" == 0 ]]; then
  log "--no-build: done"
  exit 0
fi
GEN_ARGS=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  GEN_ARGS=(-G Ninja)
fi
log "configuring $BUILD_DIR ($BUILD_TYPE)"
# Extra arguments come last so that they win over the defaults above.
cmake -S "$ROOT" -B "$BUILD_DIR" "${GEN_ARGS[@]}" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${TORCH_CMAKE_ARGS[@]}" \
  "${EXTRA_CMAKE_ARGS[@]}" || die "cmake configure failed (see above)"
log "building with $JOBS jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"
log "done: $BUILD_DIR/selkv (main job + benchmarks), $BUILD_DIR/selkv_tests; run scripts/test.sh"
