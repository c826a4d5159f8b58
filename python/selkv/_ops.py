"""Finding and loading the compiled operator library ``_selkv_ops.so``.

The library is a plain shared object (no Python module inside) whose static initializers
register the ``torch.ops.selkv.*`` operators with the torch dispatcher. It is looked up in this
order:

1. ``$SELKV_OPS_LIBRARY`` -- an explicit path, e.g. a CMake build tree's
   ``build/python/selkv/_selkv_ops.so`` used with ``PYTHONPATH=<repo>/python``;
2. next to this file -- where ``pip install .`` and ``cmake --install`` put it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

LIBRARY_NAME = "_selkv_ops.so"
ENV_VAR = "SELKV_OPS_LIBRARY"

_lock = threading.Lock()
_loaded_path: str | None = None


class OpsLibraryNotFoundError(ImportError):
    """The operator library was not built or cannot be found (as opposed to failing to load)."""


def expect_dims(op: str, name: str, t: torch.Tensor, n: int, doc: str) -> None:
    """The shape defaults of a wrapper read ``t``'s dims: a tensor of another rank is an error
    naming the op and the argument (as the C++ binding's TensorArg.dims does), not an IndexError."""
    if t.dim() != n:
        raise RuntimeError(f"{op}: {name}: expected a {n}-d tensor {doc}, got shape {list(t.shape)}")


def library_path() -> str:
    """Path of the operator library that :func:`load_library` loads (or would load)."""
    if _loaded_path is not None:
        return _loaded_path
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not path.is_file():
            raise OpsLibraryNotFoundError(f"selkv: ${ENV_VAR}={env!r} is not a file")
        return str(path.resolve())
    path = Path(__file__).resolve().parent / LIBRARY_NAME
    if not path.is_file():
        raise OpsLibraryNotFoundError(
            f"selkv: operator library {LIBRARY_NAME} not found next to {Path(__file__).parent}. "
            "Install the package with `pip install . --no-build-isolation` (needs a CUDA "
            "torch), or build it with CMake (-DSELKV_BUILD_TORCH=ON) and point "
            f"${ENV_VAR} at build/python/selkv/{LIBRARY_NAME}."
        )
    return str(path)


def load_library() -> str:
    """Loads the operator library once per process and returns its path."""
    global _loaded_path
    with _lock:
        if _loaded_path is None:
            path = library_path()
            # Registers torch.ops.selkv.*; a second copy from another path would fail inside
            # torch (the `selkv` namespace is defined once), which is the intended behaviour.
            torch.ops.load_library(path)
            _loaded_path = path
        return _loaded_path


ops = torch.ops.selkv
"""The raw operator namespace, ``torch.ops.selkv`` (valid once :func:`load_library` ran)."""
