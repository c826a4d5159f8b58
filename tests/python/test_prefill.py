"""Tests of the sparse prefill (C7), selected-row dequant (C4) and the composed prefill paths
through torch: torch.ops.selkv.{sparse_prefill, dequant_selected, dequant_sparse_prefill,
gather_sparse_prefill} (+ workspace sizes), the selkv wrappers and selkv.flash_mla.flash_mla_sparse_fwd.

- CPU ops (the C++ oracle) against an independent torch fp64 reference written here (and C4
  against selkv.gather_kv_bf16-independent record decoding via the C1 writer's inputs), so a
  binding passing wrong sizes / strides cannot hide;
- composed ops == their two steps, bit for bit (CPU; and CUDA vs CPU within tolerances);
- CUDA vs CPU: prefill tolerances (out |err| < 8e-4 or rel < 3.01/128, cosine distance < 7e-6;
  lse / max_logits |err| < 1e-6 or rel < 2.01/65536), C4 bit-exact; CUDA-graph replay bitwise
  equal to eager; errors name the op and the argument; opcheck; FlashMLA-compatible API.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


# ---- inputs / references -------------------------------------------------------------------------
def _indices(gen, T, K, n, *, bad_frac=0.1):
    idx = torch.randint(0, n, (T, K), generator=gen, dtype=torch.int32)
    bad = torch.tensor([-1, -7, INT32_MAX, INT32_MIN, n, n + 3], dtype=torch.int32)
    mask = torch.rand(T, K, generator=gen) < bad_frac
    idx = torch.where(mask, bad[torch.randint(0, 6, (T, K), generator=gen)], idx)
    if T > 2:
        idx[2] = -1  # an empty token
    return idx


def _topk_length(gen, T, K):
    return torch.randint(-1, K + 2, (T,), generator=gen, dtype=torch.int32)


def _ref_prefill(q, kv, idx, topk_length, scale):
    """fp64 reference: (out fp64 [T, H, 512], max_logits, lse); empty rows 0 / -inf / -inf."""
    T, H, D = q.shape
    K = idx.shape[1]
    n = kv.shape[0]
    idx = idx.long()
    valid = (idx >= 0) & (idx < n)
    if topk_length is not None:
        valid &= torch.arange(K)[None, :] < topk_length.long()[:, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    keys = kv.double()[safe].masked_fill(~valid[..., None], 0.0)  # [T, K, D]; NaN rows unread
    s = torch.einsum("thd,tkd->thk", q.double(), keys) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    ml = s.amax(-1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    p = p.masked_fill(~valid[:, None, :], 0.0)
    out = torch.einsum("thk,tkd->thd", p, keys[..., :512])
    return out, ml.float(), lse.float()


def _check_close(out, ml, lse, r_out, r_ml, r_lse):
    out = out.cpu().double()
    r = r_out.to(torch.bfloat16).double().cpu()
    err = (out - r).abs()
    ok = (err < 8e-4) | (err < 3.01 / 128 * r.abs())
    assert not torch.isnan(out).any()
    assert ok.all(), f"out: {(~ok).sum().item()} elements off, max err {err.max().item()}"
    xx, yy, xy = (out * out).sum(), (r * r).sum(), (out * r).sum()
    if (xx + yy) > 0:
        assert 1 - 2 * xy / (xx + yy) < 7e-6
    for name, g, w in (("lse", lse, r_lse), ("max_logits", ml, r_ml)):
        g, w = g.cpu().double(), w.cpu().double()
        inf = torch.isinf(w)
        assert torch.equal(g[inf], w[inf]), f"{name}: empty-row values differ"
        e = (g - w).abs()[~inf]
        assert ((e < 1e-6) | (e < 2.01 / 65536 * w[~inf].abs())).all(), f"{name}: max err {e.max().item()}"


def _problem(gen, T, H, D, K, N, dynamic):
    q = torch.randn(T, H, D, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(N, D, generator=gen) / 10).to(torch.bfloat16)
    idx = _indices(gen, T, K, N)
    tl = _topk_length(gen, T, K) if dynamic else None
    # rows no valid index points at are NaN: a stray read shows
    used = torch.zeros(N, dtype=torch.bool)
    valid = (idx >= 0) & (idx < N)
    if tl is not None:
        valid &= torch.arange(K)[None, :] < tl.long()[:, None]
    used[idx.long()[valid]] = True
    kv[~used] = float("nan")
    return q, kv, idx, tl


def _fp8_cache(selkv, gen, num_blocks, page, fmt):
    cache = selkv.empty_kv_cache(num_blocks, page, fmt)
    n = num_blocks * page
    lat = (torch.randn(n, 512, generator=gen) / 10).to(torch.bfloat16)
    rope = (torch.randn(n, 64, generator=gen) / 10).to(torch.bfloat16) if fmt == "ds_mla_fp8" else None
    selkv.write_kv_cache(lat, rope, torch.arange(n, dtype=torch.int64), cache, fmt, "amax")
    return cache


# ---- C7 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("D,H,dynamic", [(576, 64, False), (512, 128, True)])
def test_cpu_prefill_matches_torch_reference(selkv, gen, D, H, dynamic):
    q, kv, idx, tl = _problem(gen, 5, H, D, 64, 300, dynamic)
    out, ml, lse = selkv.sparse_prefill(q, kv, idx, 0.05, topk_length=tl)
    _check_close(out, ml, lse, *_ref_prefill(q, kv, idx, tl, 0.05))
    assert torch.all(out[2] == 0) and torch.all(torch.isneginf(lse[2])) and torch.all(torch.isneginf(ml[2]))


def test_cpu_prefill_strided_views(selkv, gen):
    q, kv, idx, _ = _problem(gen, 4, 64, 576, 128, 200, False)
    qp = torch.zeros(4, 64, 640, dtype=torch.bfloat16)
    qp[..., :576] = q
    kvp = torch.zeros(200, 584, dtype=torch.bfloat16)
    kvp[:, :576] = kv
    outp = torch.full((4, 64, 520), 7.0, dtype=torch.bfloat16)
    a = selkv.sparse_prefill(q, kv, idx, 0.04)
    b = selkv.sparse_prefill(qp[..., :576], kvp[:, :576], idx, 0.04, out=outp[..., :512])
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert torch.all(outp[..., 512:] == 7.0)


@pytest.mark.parametrize("D,H,K,dynamic", [(576, 128, 128, True), (512, 64, 576, False)])
def test_cuda_prefill_matches_cpu(selkv, cuda_device, gen, D, H, K, dynamic):
    q, kv, idx, tl = _problem(gen, 37, H, D, K, 1000, dynamic)
    want = selkv.sparse_prefill(q, kv, idx, D**-0.55, topk_length=tl)
    dev = lambda t: None if t is None else t.to(cuda_device)  # noqa: E731
    got = selkv.sparse_prefill(dev(q), dev(kv), dev(idx), D**-0.55, topk_length=dev(tl))
    _check_close(*got, want[0].double(), want[1], want[2])


def test_cuda_prefill_graph_replay_bitwise_equal(selkv, cuda_device, gen):
    q, kv, idx, tl = (t.to(cuda_device) for t in _problem(gen, 16, 128, 576, 256, 500, True))
    eager = [t.clone() for t in selkv.sparse_prefill(q, kv, idx, 0.05, topk_length=tl)]
    out = torch.empty_like(eager[0])
    ml, lse = torch.empty_like(eager[1]), torch.empty_like(eager[2])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selkv.sparse_prefill(q, kv, idx, 0.05, topk_length=tl, out=out, max_logits=ml, lse=lse)
    out.zero_()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager[0]) and torch.equal(ml, eager[1]) and torch.equal(lse, eager[2])


# ---- C4 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["ds_mla_fp8", "nope_fp8"])
@pytest.mark.parametrize("blocks", [40, 3])  # P = 40 * 61 > N (selected), 3 * 61 < N (full pool)
def test_dequant_selected_cpu_semantics_and_cuda_bit_exact(selkv, gen, fmt, blocks):
    cache = _fp8_cache(selkv, gen, blocks, 61, fmt)
    P = blocks * 61
    T, K = 7, 100
    idx = _indices(gen, T, K, P)
    tl = _topk_length(gen, T, K)
    ws, oi = selkv.dequant_selected(cache, idx, fmt, topk_length=tl)
    D = selkv.dequant_dim(fmt)
    assert ws.shape == (min(T * K, P), D)
    assert selkv.dequant_selected_workspace_rows(T, K, P) == min(T * K, P)
    # every valid entry reads back its own record: compare with gathering that slot through C3
    valid = (idx >= 0) & (idx < P) & (torch.arange(K)[None, :] < tl.long()[:, None])
    assert torch.equal(oi[~valid], torch.full_like(oi[~valid], -1))
    bt = torch.arange(blocks, dtype=torch.int32)[None, :]
    full = selkv.gather_kv_bf16(cache, bt, torch.zeros(1, dtype=torch.int32),
                                torch.tensor([P], dtype=torch.int32), torch.zeros(1, dtype=torch.int32), fmt)
    assert torch.equal(ws[oi[valid].long()].view(torch.int16), full[idx[valid].long()].view(torch.int16))
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        ws_g = torch.full_like(ws, float("nan"), device=dev)
        ws_c = torch.full_like(ws, float("nan"))
        _, oi_c = selkv.dequant_selected(cache, idx, fmt, topk_length=tl, workspace=ws_c)
        _, oi_g = selkv.dequant_selected(cache.to(dev), idx.to(dev), fmt, topk_length=tl.to(dev), workspace=ws_g)
        assert torch.equal(oi_g.cpu(), oi_c)
        assert torch.equal(ws_g.cpu().view(torch.int16), ws_c.view(torch.int16))


# ---- composed ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("fmt,blocks", [("ds_mla_fp8", 30), ("nope_fp8", 2)])
def test_dequant_sparse_prefill_equals_two_steps(selkv, gen, device, fmt, blocks):
    D = selkv.dequant_dim(fmt)
    cache = _fp8_cache(selkv, gen, blocks, 64, fmt)
    T, K = 9, 128
    idx = _indices(gen, T, K, blocks * 64)
    tl = _topk_length(gen, T, K)
    q = torch.randn(T, 64, D, generator=gen).to(torch.bfloat16)
    ws, oi = selkv.dequant_selected(cache, idx, fmt, topk_length=tl)
    want = selkv.sparse_prefill(q, ws, oi, 0.05, topk_length=tl)
    n = selkv.dequant_prefill_workspace_size(T, K, blocks * 64, fmt)
    w = torch.empty(n, dtype=torch.uint8, device=device)
    d = lambda t: t.to(device)  # noqa: E731
    got = selkv.dequant_sparse_prefill(d(q), d(cache), d(idx), 0.05, fmt, topk_length=d(tl), workspace=w)
    if device == "cpu":
        for g_, w_ in zip(got, want):
            assert torch.equal(g_, w_)
    else:
        _check_close(*got, want[0].double(), want[1], want[2])
        g = torch.cuda.CUDAGraph()
        outs = [torch.empty_like(t) for t in got]
        qd, cd, idd, tld = d(q), d(cache), d(idx), d(tl)  # host->device copies stay outside the capture
        with torch.cuda.graph(g):
            selkv.dequant_sparse_prefill(qd, cd, idd, 0.05, fmt, topk_length=tld, workspace=w,
                                         out=outs[0], max_logits=outs[1], lse=outs[2])
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(outs, got):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", _devices())
def test_gather_sparse_prefill_equals_two_steps(selkv, gen, device):
    fmt = "ds_mla_fp8"
    cache = _fp8_cache(selkv, gen, 12, 61, fmt)
    bt = torch.randperm(12, generator=gen).to(torch.int32).view(3, 4)
    starts = torch.tensor([3, 70, 1], dtype=torch.int32)
    lens = torch.tensor([100, 40, 150], dtype=torch.int32)
    ws_starts = torch.tensor([0, 100, 140], dtype=torch.int32)
    rows = 290
    T, K = 6, 64
    idx = _indices(gen, T, K, rows)
    q = torch.randn(T, 128, 576, generator=gen).to(torch.bfloat16)
    kv = selkv.gather_kv_bf16(cache, bt, starts, lens, ws_starts, fmt, num_rows=rows)
    want = selkv.sparse_prefill(q, kv, idx, 0.05)
    d = lambda t: t.to(device)  # noqa: E731
    got = selkv.gather_sparse_prefill(d(q), d(cache), d(bt), d(starts), d(lens), d(ws_starts), d(idx), rows, 0.05, fmt)
    if device == "cpu":
        for g_, w_ in zip(got, want):
            assert torch.equal(g_, w_)
    else:
        _check_close(*got, want[0].double(), want[1], want[2])


# ---- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_errors_name_argument(selkv, gen, device):
    q, kv, idx = (t.to(device) for t in _problem(gen, 3, 64, 576, 64, 100, False)[:3])
    with pytest.raises(RuntimeError, match=r"selkv::sparse_prefill: q: expected dtype BFloat16"):
        selkv.sparse_prefill(q.float(), kv, idx, 0.1)
    with pytest.raises(RuntimeError, match=r"selkv::sparse_prefill: kv: expected size 576"):
        selkv.sparse_prefill(q, kv[:, :512], idx, 0.1)
    with pytest.raises(RuntimeError, match=r"selkv::sparse_mla_prefill: topk"):
        selkv.sparse_prefill(q, kv, idx[:, :40], 0.1)
    with pytest.raises(RuntimeError, match=r"selkv::sparse_mla_prefill: sm_scale"):
        selkv.sparse_prefill(q, kv, idx, float("nan"))
    with pytest.raises(RuntimeError, match=r"selkv::sparse_mla_prefill: num_heads"):
        selkv.sparse_prefill(q[:, :32], kv, idx, 0.1)
    cache = selkv.empty_kv_cache(4, 64, "ds_mla_fp8", device=device)
    with pytest.raises(RuntimeError, match=r"workspace_bytes: need \d+ bytes"):
        selkv.dequant_sparse_prefill(q, cache, idx, 0.1, workspace=torch.empty(16, dtype=torch.uint8, device=device))
    with pytest.raises(RuntimeError, match=r"selkv::dequant_sparse_mla_prefill: attn.d_qk"):
        selkv.dequant_sparse_prefill(q, selkv.empty_kv_cache(4, 64, "nope_fp8", device=device), idx, 0.1, "nope_fp8")
    with pytest.raises(RuntimeError, match=r"selkv::dequant_selected: workspace"):
        selkv.dequant_selected(cache, idx, workspace=torch.empty(3, 512, dtype=torch.bfloat16, device=device))


def test_opcheck_cpu(selkv, gen):
    q, kv, idx, tl = _problem(gen, 3, 64, 512, 64, 100, True)
    out = torch.empty(3, 64, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(3, 64), torch.empty(3, 64)
    torch.library.opcheck(torch.ops.selkv.sparse_prefill.default, (q, torch.nan_to_num(kv), idx, tl, 0.1, out, ml, lse))


# ---- FlashMLA-compatible API -------------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_flash_mla_sparse_fwd(selkv, gen, device):
    from selkv import flash_mla

    q, kv, idx, tl = _problem(gen, 6, 64, 576, 128, 400, True)
    sink = torch.tensor([0.5, -math.inf, math.inf] + [0.1] * 61, dtype=torch.float32)
    d = lambda t: t.to(device)  # noqa: E731
    out, ml, lse = flash_mla.flash_mla_sparse_fwd(d(q), d(kv)[:, None, :], d(idx)[:, None, :], 0.05,
                                                 attn_sink=d(sink), topk_length=d(tl))
    r_out, r_ml, r_lse = _ref_prefill(q, kv, idx, tl, 0.05)
    factor = torch.nan_to_num(torch.sigmoid(r_lse.double() - sink.double()[None, :]), nan=0.0)
    assert out.shape == (6, 64, 512) and ml.shape == (6, 64) and lse.shape == (6, 64)
    empty = torch.isneginf(r_lse)
    assert torch.all(torch.isposinf(lse.cpu()[empty])) and torch.all(torch.isneginf(ml.cpu()[empty]))
    r_lse = torch.where(empty, torch.full_like(r_lse, math.inf), r_lse)
    # one extra bf16 rounding after the sink scale: allow 2 bf16 ulps on out
    o, r = out.cpu().double(), r_out * factor[..., None]
    assert ((o - r).abs() <= 1e-3 + 2 * 2.0**-8 * r.abs()).all()
    assert torch.all(out.cpu()[:, 2] == 0)  # +inf sink zeroes the output
    _check_close(torch.zeros(1), ml, lse, torch.zeros(1), r_ml, r_lse)
    with pytest.raises(ValueError, match="d_v"):
        flash_mla.flash_mla_sparse_fwd(d(q), d(kv), d(idx), 0.05, d_v=576)
