"""PEP 517 backend for ``pip install .``: scikit-build-core, preceded by checks that turn the
usual ways a build fails (no backend, no torch, no nvcc, no CMake, no CUTLASS headers) into one
sentence naming the cause and the command that fixes it, before minutes of compiling.

pyproject.toml names this module (``backend-path = ["scripts"]``); every hook is
scikit-build-core's, only ``build_wheel`` and ``build_editable`` run the checks first.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_CMAKE = (3, 24)


def _fail(message: str) -> None:
    raise SystemExit(f"selkv: {message}")


try:
    from scikit_build_core import build as _skbuild
except ImportError:
    _fail(
        f"the build backend scikit-build-core is not installed in {sys.executable}, which "
        "`pip install --no-build-isolation` builds with: run "
        f"`{sys.executable} -m pip install scikit-build-core` first"
    )

from scikit_build_core.build import *  # noqa: E402,F401,F403  (the hooks this module does not wrap)


def _check_torch() -> None:
    probe = "import sys, torch; sys.stdout.write(torch.__version__ + ' ' + str(torch.version.cuda or ''))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        if any("pip-build-env" in p for p in sys.path):
            _fail(
                "pip is building in an isolated environment, which has no torch to compile the "
                "extension against: with a CUDA build of torch and scikit-build-core installed, run "
                "`pip install --no-build-isolation .`"
            )
        lines = r.stderr.strip().splitlines()
        _fail(
            f"torch is not importable by {sys.executable} ({lines[-1] if lines else 'import failed'}): "
            "the extension is compiled against the torch it will run with, so install a CUDA build "
            "of torch first (`pip install torch`) and build without isolation, which never has it: "
            "`pip install --no-build-isolation .`"
        )
    version, _, cuda = r.stdout.partition(" ")
    if not cuda:
        _fail(
            f"torch {version} in {sys.executable} is a CPU-only build: the extension needs a CUDA "
            "build of torch (`pip install torch` from PyPI is one on Linux)"
        )


def _check_nvcc() -> None:
    if os.environ.get("CUDACXX") or shutil.which("nvcc"):
        return
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for home in filter(None, homes):
        nvcc = Path(home) / "bin" / "nvcc"
        if nvcc.is_file():
            os.environ["CUDACXX"] = str(nvcc)  # CMake looks only on PATH and at CUDACXX
            return
    _fail(
        "nvcc not found (not on PATH, nor in $CUDA_HOME/bin or /usr/local/cuda/bin): install the "
        "CUDA 13 toolkit, or point CUDACXX at its nvcc"
    )


def _check_cmake() -> None:
    try:
        import cmake  # noqa: F401  (the PyPI cmake package)

        return
    except ImportError:
        pass
    exe = shutil.which("cmake")
    version = ()
    if exe:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version (\d+)\.(\d+)", out)
        version = (int(m.group(1)), int(m.group(2))) if m else ()
    if version < MIN_CMAKE:
        found = f"cmake {'.'.join(map(str, version))} found" if version else "no cmake found"
        _fail(
            f"selkv needs CMake >= {'.'.join(map(str, MIN_CMAKE))} and {found}: run "
            f"`{sys.executable} -m pip install cmake ninja`"
        )


def _check_cutlass(config_settings) -> None:
    settings = config_settings or {}
    if any("SELKV_CUTLASS_DIR" in key for key in settings):
        return  # the caller points CMake at its own copy
    if (ROOT / "third_party" / "cutlass" / "include" / "cute" / "tensor.hpp").is_file():
        return
    print("selkv: fetching the CUTLASS headers (scripts/setup.sh --cutlass-only)", file=sys.stderr)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--cutlass-only"])
    if r.returncode != 0:
        _fail(
            "could not fetch the CUTLASS headers into third_party/cutlass (see above): run "
            "`scripts/setup.sh --cutlass-only` where there is network, or copy third_party/cutlass in"
        )


def _check(config_settings) -> None:
    _check_torch()
    _check_nvcc()
    _check_cmake()
    _check_cutlass(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _check(config_settings)
    return _skbuild.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _check(config_settings)
    return _skbuild.build_editable(wheel_directory, config_settings, metadata_directory)
