"""The examples under examples/ run end to end and pass their own checks (CPU: the oracle ops;
CUDA: the kernels, when a GPU is there), so they cannot rot unnoticed."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_qsa_layer_cpu(selkv, capsys):
    assert load("qsa_layer").main([]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_qsa_layer_cuda_both_routes(selkv, capsys):
    mod = load("qsa_layer")
    # 384 rows: the simple kernel; 4096 rows of 384 blocks: the page-4 kernel with its plan.
    assert mod.main(["--device", "cuda", "--prompt-len", "192", "--head-dim", "256"]) == 0
    assert mod.main(["--device", "cuda", "--prompt-len", "2048", "--blocks", "384", "--head-dim", "256",
                     "--check-rows", "32"]) == 0
    out = capsys.readouterr().out
    assert out.count("OK") == 2 and "(simple)" in out
    assert ("(page-4)" in out) == (torch.cuda.get_device_capability() == (9, 0))


def test_dsa_layer_cpu(selkv, capsys):
    assert load("dsa_layer").main([]) == 0
    assert "match the fp64 reference" in capsys.readouterr().out
