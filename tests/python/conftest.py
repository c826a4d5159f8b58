"""pytest fixtures for the torch-op tests.

Test modules skip themselves when torch is not installed (CI's CPU machine); tests that need a
GPU take the `cuda_device` fixture, which skips when CUDA is unavailable. The CPU tests (the
CPU oracle behind the same ops, error messages, opcheck, torch.compile) run wherever torch and
the built operator library are. A selkv package whose operator library was not built is a skip
too, unless SELKV_REQUIRE_OPS=1; a library that exists but fails to load is an error, never a
skip.

Seeds are fresh per run (DESIGN §5); set SELKV_TEST_SEED to replay one. Each test prints its
seed, which pytest shows when the test fails.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest


def _import_selkv():
    try:
        import selkv
    except ImportError as e:
        not_built = type(e).__name__ == "OpsLibraryNotFoundError"
        if not_built and os.environ.get("SELKV_REQUIRE_OPS") != "1":
            pytest.skip(f"selkv operator library not built: {e}")
        raise
    return selkv


@pytest.fixture(scope="session")
def selkv():
    return _import_selkv()


@pytest.fixture(scope="session")
def cuda_device(selkv):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    return torch.device("cuda", torch.cuda.current_device())


_BASE_SEED = int(os.environ.get("SELKV_TEST_SEED", random.SystemRandom().randrange(2**31)))


@pytest.fixture
def gen(request):
    """A CPU torch.Generator seeded per test from the run's base seed and the test id."""
    import torch

    seed = (_BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**63
    print(f"SELKV_TEST_SEED={_BASE_SEED} (test seed {seed})")
    g = torch.Generator()
    g.manual_seed(seed)
    return g
