"""DESIGN §5 checks shared by the decode test files (the native V3.2 and the MODEL1 decode)."""

from __future__ import annotations

import torch


def assert_close_design(out, lse, ref_out, ref_lse, what):
    """DESIGN §5: out |err| < 1e-3 or rel < 2.01/128 per element, cosine distance < 5e-6;
    lse |err| < 1e-6 or rel < 8.01/65536; rows without a valid index exactly out 0, lse -inf."""
    out = out.detach().cpu().double()
    lse = lse.detach().cpu().double()
    r = ref_out.to(torch.bfloat16).double()
    err = (out - r).abs()
    ok = (err < 1e-3) | (err < 2.01 / 128 * r.abs())
    assert bool(ok.all()), f"{what}: {(~ok).sum().item()} out elements off, max err {err.max().item()}"
    xy, xx, yy = (out * r).sum(), (out * out).sum(), (r * r).sum()
    if xx + yy > 0:
        cos = 1 - 2 * xy / (xx + yy)
        assert cos.item() < 5e-6, f"{what}: cosine distance {cos.item()}"
    empty = torch.isinf(ref_lse)
    assert bool((lse[empty] == float("-inf")).all()), f"{what}: empty rows must have lse -inf"
    assert bool((out[empty] == 0).all()), f"{what}: empty rows must have out 0"
    le = (lse[~empty] - ref_lse[~empty]).abs()
    ok = (le < 1e-6) | (le < 8.01 / 65536 * ref_lse[~empty].abs())
    assert bool(ok.all()), f"{what}: {(~ok).sum().item()} lse values off, max err {le.max().item()}"
