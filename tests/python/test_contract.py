"""DESIGN §2's NaN rule through torch, on the CPU op (the oracle) and on CUDA: a NaN that reaches
a row's softmax (an E4M3 NaN code or a NaN scale in a selected record, a NaN kv row, a NaN in one
head of q) gives out = NaN and lse = NaN (prefill: max_logits too) for exactly the rows and heads
it reaches; every other row and head keeps its bits; a row with no valid index stays empty
(native: lse -inf; the FlashMLA-compatible layer: lse +inf, never for a NaN row).

Covers sparse_mla_decode (fixed / dynamic top-k), flash_mla_with_kvcache, sparse_prefill,
flash_mla_sparse_fwd and dequant_sparse_prefill.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_decode import Case, run_decode  # noqa: E402  (tests/python is on sys.path under pytest)
from test_prefill import _fp8_cache, _indices, _problem  # noqa: E402

SM_SCALE = 576**-0.55


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _same_bits(a, b):
    if a.dtype == torch.bfloat16:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _check_nan_rule(out, lse, base_out, base_lse, nan_mask, what, ml=None, base_ml=None):
    """nan_mask [..., H] (bool, CPU): NaN out (every element) and lse there; elsewhere the bits of
    the run without the NaN."""
    out, lse = out.cpu(), lse.cpu()
    base_out, base_lse = base_out.cpu(), base_lse.cpu()
    assert bool(torch.isnan(lse[nan_mask]).all()), f"{what}: lse must be NaN where a NaN reaches the softmax"
    assert bool(torch.isnan(out[nan_mask].float()).all()), f"{what}: out must be NaN there"
    keep = ~nan_mask
    assert _same_bits(lse[keep], base_lse[keep]), f"{what}: lse changed where no NaN reaches"
    assert _same_bits(out[keep], base_out[keep]), f"{what}: out changed where no NaN reaches"
    if ml is not None:
        ml, base_ml = ml.cpu(), base_ml.cpu()
        assert bool(torch.isnan(ml[nan_mask]).all()), f"{what}: max_logits must be NaN there"
        assert _same_bits(ml[keep], base_ml[keep]), f"{what}: max_logits changed"


def _decode_valid(case):
    idx = case.indices
    valid = (idx >= 0) & (idx < case.num_slots)
    if case.topk_length is not None:
        valid &= torch.arange(case.K)[None, None, :] < case.topk_length[:, None, None]
    return valid


# ---- decode: native op and flash_mla_with_kvcache -------------------------------------------------
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_decode_nan_rows(selkv, gen, device, dynamic):
    from selkv import flash_mla

    B, S, H, K = 4, 2, 64, 128  # dynamic: lengths 0, 1, 17, 63; row (3, 0) has no valid index
    case = Case(selkv, gen, B, S, H, K, 64, dynamic=dynamic, s_kv=300)
    base_out, base_lse = run_decode(selkv, *case.to(device))
    valid = _decode_valid(case)
    live = [(b, s) for b in range(B) for s in range(S) if bool(valid[b, s].any())]
    assert len(live) >= 2
    # A NaN E4M3 code in a record the first live row selects; a NaN in head 5 of q of the last.
    (b0, s0), (b1, s1) = live[0], live[-1]
    slot = int(case.indices[b0, s0][valid[b0, s0]][0])
    case.cache[slot // case.page, slot % case.page, 7] = 0x7F
    case.q[b1, s1, 5, 100] = float("nan")
    row_nan = (valid & (case.indices == slot)).any(-1)  # [B, S]
    nan_mask = row_nan[..., None].expand(B, S, H).clone()
    nan_mask[b1, s1, 5] = True
    out, lse = run_decode(selkv, *case.to(device))
    _check_nan_rule(out, lse, base_out, base_lse, nan_mask, f"decode {device} dyn={dynamic}")
    empty = torch.isneginf(base_lse.cpu())
    assert bool(torch.isneginf(lse.cpu()[empty]).all()), "rows without a valid index stay empty"

    q, cache, idx, tl, _ = case.to(device)
    k_cache = cache.unsqueeze(2).view(torch.float8_e4m3fn)
    sched, _ = flash_mla.get_mla_metadata()
    f_out, f_lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, sched, softmax_scale=SM_SCALE, is_fp8_kvcache=True,
        indices=idx, topk_length=tl)
    f_lse = f_lse.transpose(1, 2).cpu()  # (B, S_q, H)
    assert bool(torch.isnan(f_lse[nan_mask]).all()), "flash_mla: a NaN row is NaN, not +inf"
    assert bool(torch.isposinf(f_lse[empty]).all()), "flash_mla: rows without a valid index: +inf"
    rest = ~nan_mask & ~empty
    assert _same_bits(f_lse[rest], lse.cpu()[rest])
    assert _same_bits(f_out.cpu(), out.cpu())


# ---- prefill: native op and flash_mla_sparse_fwd ------------------------------------------------
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_prefill_nan_rows(selkv, gen, device, dynamic):
    from selkv import flash_mla

    T, H, D, K, N = 20, 64, 576, 128, 300
    q, kv, idx, tl = _problem(gen, T, H, D, K, N, dynamic)
    d = lambda t: None if t is None else t.to(device)  # noqa: E731
    base = selkv.sparse_prefill(d(q), d(kv), d(idx), 0.05, topk_length=d(tl))
    valid = (idx >= 0) & (idx < N)
    if tl is not None:
        valid &= torch.arange(K)[None, :] < tl.long()[:, None]
    live = [t for t in range(T) if bool(valid[t].any())]
    assert len(live) >= 2
    row = int(idx[live[0]][valid[live[0]]][0])
    kv[row, 10] = float("nan")
    q[live[-1], 3, 200] = float("nan")
    nan_mask = (valid & (idx == row)).any(-1)[:, None].expand(T, H).clone()
    nan_mask[live[-1], 3] = True
    out, ml, lse = selkv.sparse_prefill(d(q), d(kv), d(idx), 0.05, topk_length=d(tl))
    _check_nan_rule(out, lse, base[0], base[2], nan_mask, f"prefill {device}", ml, base[1])

    f_out, f_ml, f_lse = flash_mla.flash_mla_sparse_fwd(d(q), d(kv)[:, None, :], d(idx)[:, None, :], 0.05,
                                                       topk_length=d(tl))
    empty = torch.isneginf(base[2].cpu())
    assert bool(torch.isnan(f_lse.cpu()[nan_mask]).all()), "flash_mla_sparse_fwd: NaN rows stay NaN"
    assert bool(torch.isnan(f_ml.cpu()[nan_mask]).all())
    assert bool(torch.isposinf(f_lse.cpu()[empty]).all())
    assert _same_bits(f_out.cpu(), out.cpu())


# ---- composed route (a): dequant_sparse_prefill -------------------------------------------------
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("fmt,blocks", [("ds_mla_fp8", 30), ("nope_fp8", 2)])  # selected / full pool
def test_dequant_sparse_prefill_nan_record(selkv, gen, device, fmt, blocks):
    D = selkv.dequant_dim(fmt)
    page, T, K, H = 64, 9, 128, 64
    cache = _fp8_cache(selkv, gen, blocks, page, fmt)
    idx = _indices(gen, T, K, blocks * page)
    q = torch.randn(T, H, D, generator=gen).to(torch.bfloat16)
    d = lambda t: t.to(device)  # noqa: E731
    base = selkv.dequant_sparse_prefill(d(q), d(cache), d(idx), 0.05, fmt)
    valid = (idx >= 0) & (idx < blocks * page)
    slot = int(idx[0][valid[0]][0])
    cache[slot // page, slot % page, 512:516] = 0xFF  # scale 0 of the record: NaN
    nan_mask = (valid & (idx == slot)).any(-1)[:, None].expand(T, H).clone()
    out, ml, lse = selkv.dequant_sparse_prefill(d(q), d(cache), d(idx), 0.05, fmt)
    _check_nan_rule(out, lse, base[0], base[2], nan_mask, f"dequant_sparse_prefill {fmt} {device}", ml, base[1])
    assert bool(torch.isneginf(lse.cpu()[2]).all()), "token 2 has no valid index: stays empty"
