"""Issue 15 contract tests through torch, on the CPU ops (the C++ oracle behind the same checks)
and the CUDA ops alike:

- sm_scale: one rule for every op that takes a scale (decode, prefill, the composed routes, the
  FlashMLA-compatible layer): finite, > 0 and ``sm_scale * log2(e)`` finite in fp32, else an
  error naming the scale as the caller called it; a Python float that fp32 cannot hold (1e-50
  would become 0) is named by the binding; the smallest valid scales give finite results that
  agree between CPU and CUDA;
- outputs that overlap another output or an input (expanded outputs included) are rejected,
  with the documented in-place forms still allowed;
- zero-row calls return correctly shaped empty outputs, eagerly and inside CUDA-graph capture.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

QK, V, REC = 576, 512, 656
FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
# Rejected by the C++ rule (the fp32 value breaks it: <= 0, NaN, inf, or * log2(e) overflows).
BAD_SCALES = [0.0, -0.0, -0.1, float("nan"), float("inf"), -float("inf"), FLT_MAX,
              FLT_MAX / LOG2E * 1.000001]
# Finite doubles fp32 cannot hold (1e-50 would become 0, 1e39 inf): named by the binding.
NOT_FP32 = [1e-50, 1e-46, 1e39, -1e39]
# The smallest valid scales: FLT_MIN and a subnormal.
TINY = [1.1754943508222875e-38, 1e-40]


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


# ---- decode -------------------------------------------------------------------------------------
def _decode_case(selkv, device, B=2, S=2, H=64, K=64, page=64, num_blocks=4, seed=0):
    """Random records in every slot, indices over all slots (some invalid)."""
    gen = torch.Generator().manual_seed(seed)
    cache = selkv.empty_kv_cache(num_blocks, page, "ds_mla_fp8")
    n = num_blocks * page
    lat = (torch.randn(n, 512, generator=gen) / 10).to(torch.bfloat16)
    rope = (torch.randn(n, 64, generator=gen) / 10).to(torch.bfloat16)
    selkv.write_kv_cache(lat, rope, torch.arange(n, dtype=torch.int64), cache)
    q = torch.randn(B, S, H, QK, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, n, (B, S, K), generator=gen, dtype=torch.int32)
    idx[..., ::7] = -1
    return q.to(device), cache.to(device), idx.to(device)


@pytest.mark.parametrize("device", _devices())
def test_decode_sm_scale_rule(selkv, device):
    from selkv import flash_mla

    q, cache, idx = _decode_case(selkv, device)
    md = selkv.get_decode_metadata(2, 2, 64, 64, device=device)
    for s in BAD_SCALES:
        with pytest.raises(RuntimeError, match=r"selkv::sparse_mla_decode: sm_scale: must be finite and > 0"):
            selkv.sparse_mla_decode(q, cache, idx, md, s)
    for s in NOT_FP32:
        with pytest.raises(RuntimeError, match=r"selkv::sparse_mla_decode: sm_scale: .* not representable in fp32"):
            selkv.sparse_mla_decode(q, cache, idx, md, s)
    # The compat layer names the argument as FlashMLA's callers call it.
    k_cache = cache.unsqueeze(2)
    for s in BAD_SCALES[:3] + NOT_FP32[:1]:
        sched, _ = flash_mla.get_mla_metadata()
        with pytest.raises((ValueError, RuntimeError), match="softmax_scale"):
            flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, softmax_scale=s,
                                             is_fp8_kvcache=True, indices=idx)
    for s in TINY:
        out, lse = selkv.sparse_mla_decode(q, cache, idx, md, s)
        assert bool(torch.isfinite(lse).all()) and bool(torch.isfinite(out.float()).all()), s


def test_decode_tiny_scale_cuda_matches_cpu(selkv, cuda_device):
    qc, cc, ic = _decode_case(selkv, "cpu", B=3, S=2, H=128, K=128, seed=3)
    qg, cg, ig = qc.to(cuda_device), cc.to(cuda_device), ic.to(cuda_device)
    for s in TINY:
        want = selkv.sparse_mla_decode(qc, cc, ic, selkv.get_decode_metadata(3, 2, 128, 128, device="cpu"), s)
        got = selkv.sparse_mla_decode(qg, cg, ig, selkv.get_decode_metadata(3, 2, 128, 128, num_sms=3), s)
        # softmax weights are all 1 at these scales: out is the mean of the valid rows
        err = (got[0].cpu().double() - want[0].double()).abs()
        assert bool((err <= 1e-3 + 2.01 / 128 * want[0].double().abs()).all()), s
        lerr = (got[1].cpu().double() - want[1].double()).abs()
        assert bool((lerr <= 1e-6 + 8.01 / 65536 * want[1].double().abs()).all()), s


@pytest.mark.parametrize("device", _devices())
def test_decode_rejects_overlapping_outputs(selkv, device):
    q, cache, idx = _decode_case(selkv, device)
    md = selkv.get_decode_metadata(2, 2, 64, 64, device=device)
    p = "selkv::sparse_mla_decode: "
    lse_row = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    out_row = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    cases = [
        (dict(lse=lse_row.expand(2, 2, 64)), p + "lse: strides make distinct elements share memory"),
        (dict(out=out_row.expand(2, 2, 64, V)), p + "out: strides make distinct elements share memory"),
        (dict(out=q[..., :V]), p + "out: overlaps q"),
    ]
    big = torch.empty(2 * 2 * 64 * V + 2 * 2 * 64 * 2, dtype=torch.bfloat16, device=device)
    out = big[: 2 * 2 * 64 * V].view(2, 2, 64, V)
    cases.append((dict(out=out, lse=big[2 * 2 * 64 * V - 64:][: 2 * 2 * 64 * 2].view(torch.float32).view(2, 2, 64)),
                  p + "out: overlaps lse"))
    for kw, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            selkv.sparse_mla_decode(q, cache, idx, md, 0.05, **kw)
    # Disjoint views of one buffer are fine.
    lse = big[2 * 2 * 64 * V:].view(torch.float32).view(2, 2, 64)
    selkv.sparse_mla_decode(q, cache, idx, md, 0.05, out=out, lse=lse)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("B,S", [(0, 2), (3, 0)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_decode_zero_rows(selkv, device, B, S, dynamic):
    from selkv import flash_mla

    _, cache, _ = _decode_case(selkv, device)
    q = torch.empty(B, S, 128, QK, dtype=torch.bfloat16, device=device)
    idx = torch.empty(B, S, 128, dtype=torch.int32, device=device)
    tl = torch.empty(B, dtype=torch.int32, device=device) if dynamic else None
    md = selkv.get_decode_metadata(B, S, 128, 128, tl, device=device)
    out, lse = selkv.sparse_mla_decode(q, cache, idx, md, 0.05, topk_length=tl)
    assert out.shape == (B, S, 128, V) and lse.shape == (B, S, 128)
    sched, _ = flash_mla.get_mla_metadata()
    o, l_ = flash_mla.flash_mla_with_kvcache(q, cache.unsqueeze(2), None, None, 512, sched,
                                             softmax_scale=0.05, is_fp8_kvcache=True, indices=idx,
                                             topk_length=tl)
    assert o.shape == (B, S, 128, V) and l_.shape == (B, 128, S)
    if device == "cuda":  # plan + decode captured into a graph
        marker = torch.zeros(1, device=device)  # a kernel node: the graph is not empty
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            marker.add_(1)
            selkv.get_decode_metadata(B, S, 128, 128, tl, out=md)
            selkv.sparse_mla_decode(q, cache, idx, md, 0.05, topk_length=tl, out=out, lse=lse)
        graph.replay()
        torch.cuda.synchronize()
        assert marker.item() == 1


# ---- prefill and the composed routes ---------------------------------------------------------------
def _prefill_case(device, T=3, H=64, D=576, K=64, N=100, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(N, D, generator=gen) / 10).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, K), generator=gen, dtype=torch.int32)
    return q.to(device), kv.to(device), idx.to(device)


@pytest.mark.parametrize("device", _devices())
def test_prefill_sm_scale_rule(selkv, device):
    from selkv import flash_mla

    q, kv, idx = _prefill_case(device)
    cache = selkv.empty_kv_cache(4, 64, "ds_mla_fp8", device=device)
    cache.zero_()
    bt = torch.arange(4, dtype=torch.int32, device=device).view(1, 4)
    z = torch.zeros(1, dtype=torch.int32, device=device)
    n = torch.full((1,), 100, dtype=torch.int32, device=device)
    calls = {
        "selkv::sparse_mla_prefill": lambda s: selkv.sparse_prefill(q, kv, idx, s),
        "selkv::dequant_sparse_mla_prefill": lambda s: selkv.dequant_sparse_prefill(q, cache, idx, s),
        "selkv::gather_sparse_mla_prefill": lambda s: selkv.gather_sparse_prefill(q, cache, bt, z, n, z, idx, 100, s),
        "flash_mla": lambda s: flash_mla.flash_mla_sparse_fwd(q, kv[:, None, :], idx[:, None, :], s),
    }
    for op, call in calls.items():
        for s in BAD_SCALES:
            with pytest.raises(RuntimeError, match=r"sm_scale: must be finite and > 0"):
                call(s)
        for s in NOT_FP32:
            with pytest.raises(RuntimeError, match=r"sm_scale: .* not representable in fp32"):
                call(s)
        for s in TINY:
            out, ml, lse = call(s)
            assert bool(torch.isfinite(out.float()).all()) and bool(torch.isfinite(lse).all()), (op, s)


def test_prefill_tiny_scale_cuda_matches_cpu(selkv, cuda_device):
    q, kv, idx = _prefill_case("cpu", T=5, H=128, K=128, N=300, seed=4)
    for s in TINY:
        want = selkv.sparse_prefill(q, kv, idx, s)
        got = selkv.sparse_prefill(q.to(cuda_device), kv.to(cuda_device), idx.to(cuda_device), s)
        err = (got[0].cpu().double() - want[0].double()).abs()
        assert bool((err <= 1e-3 + 3.01 / 128 * want[0].double().abs()).all()), s
        lerr = (got[2].cpu().double() - want[2].double()).abs()
        assert bool((lerr <= 1e-6 + 2.01 / 65536 * want[2].double().abs()).all()), s


@pytest.mark.parametrize("device", _devices())
def test_prefill_rejects_overlapping_outputs(selkv, device):
    q, kv, idx = _prefill_case(device)
    p = "selkv::sparse_mla_prefill: "
    ml = torch.empty(3, 64, device=device)
    with pytest.raises(RuntimeError, match=p + "out: overlaps q"):
        selkv.sparse_prefill(q, kv, idx, 0.05, out=q[..., :V])
    with pytest.raises(RuntimeError, match=p + "max_logits: overlaps lse"):
        selkv.sparse_prefill(q, kv, idx, 0.05, max_logits=ml, lse=ml)
    with pytest.raises(RuntimeError, match=p + "lse: overlaps kv"):
        selkv.sparse_prefill(q, kv, idx, 0.05, lse=kv.view(-1).view(torch.float32)[:192].view(3, 64))
    # the composed route: its workspace against the caller's tensors
    cache = selkv.empty_kv_cache(4, 64, "ds_mla_fp8", device=device)
    cache.zero_()
    n = selkv.dequant_prefill_workspace_size(3, 64, 256)
    ws = torch.empty(n + 4096, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match=r"selkv::dequant_sparse_mla_prefill: .*lse: overlaps"):
        selkv.dequant_sparse_prefill(q, cache, idx, 0.05, workspace=ws,
                                     lse=ws[n - 256:n - 256 + 3 * 64 * 4].view(torch.float32).view(3, 64))


@pytest.mark.parametrize("device", _devices())
def test_prefill_zero_tokens(selkv, device):
    from selkv import flash_mla

    q, kv, idx = _prefill_case(device, T=0)
    cache = selkv.empty_kv_cache(4, 64, "ds_mla_fp8", device=device)
    bt = torch.zeros(1, 4, dtype=torch.int32, device=device)
    z = torch.zeros(1, dtype=torch.int32, device=device)
    calls = [
        lambda: selkv.sparse_prefill(q, kv, idx, 0.05),
        lambda: selkv.dequant_sparse_prefill(q, cache, idx, 0.05),
        lambda: selkv.gather_sparse_prefill(q, cache, bt, z, z, z, idx, 16, 0.05),
        lambda: flash_mla.flash_mla_sparse_fwd(q, kv[:, None, :], idx[:, None, :], 0.05),
    ]
    for call in calls:
        out, ml, lse = call()
        assert out.shape == (0, 64, V) and ml.shape == (0, 64) and lse.shape == (0, 64)
    w, oi = selkv.dequant_selected(cache, idx)
    assert w.shape[0] == 0 and oi.shape == (0, 64)
    if device == "cuda":
        out = torch.empty(0, 64, V, dtype=torch.bfloat16, device=device)
        ml, lse = torch.empty(0, 64, device=device), torch.empty(0, 64, device=device)
        ws = torch.empty(16, dtype=torch.uint8, device=device)
        marker = torch.zeros(1, device=device)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            marker.add_(1)
            selkv.sparse_prefill(q, kv, idx, 0.05, out=out, max_logits=ml, lse=lse)
            selkv.dequant_sparse_prefill(q, cache, idx, 0.05, workspace=ws, out=out, max_logits=ml, lse=lse)
        graph.replay()
        torch.cuda.synchronize()
        assert marker.item() == 1


# ---- cache ops -------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_cache_ops_reject_overlaps(selkv, device):
    gen = torch.Generator().manual_seed(5)
    T, K = 4, 64
    pos = torch.randint(0, 256, (T, K), generator=gen, dtype=torch.int32).to(device)
    req = torch.zeros(T, dtype=torch.int32, device=device)
    bt = torch.arange(4, dtype=torch.int32, device=device).view(1, 4)
    with pytest.raises(RuntimeError, match=r"valid_counts: overlaps req_id_per_token"):
        selkv.convert_req_indices_to_slots(pos, req, bt, 64, 4, valid_counts=req)
    with pytest.raises(RuntimeError, match=r"out_slots: overlaps req_local_indices"):
        selkv.convert_req_indices_to_slots(pos[:2], req[:2], bt, 64, 4, out=pos[1:3])
    # in place stays allowed
    inplace = pos.clone()
    slots, _ = selkv.convert_req_indices_to_slots(inplace, req, bt, 64, 4, out=inplace)
    assert slots.data_ptr() == inplace.data_ptr()
    # C4: a workspace inside the cache
    cache = selkv.empty_kv_cache(8, 64, "nope_fp8", device=device)
    cache.zero_()
    idx = torch.randint(0, 512, (2, 64), generator=gen, dtype=torch.int32).to(device)
    ws = cache.view(-1)[: 128 * 512 * 2].view(torch.bfloat16).view(128, 512)
    with pytest.raises(RuntimeError, match=r"workspace: overlaps cache"):
        selkv.dequant_selected(cache, idx, "nope_fp8", workspace=ws)
    # C1: latent inside the cache
    lat = cache.view(-1)[: 2 * 512 * 2].view(torch.bfloat16).view(2, 512)
    with pytest.raises(RuntimeError, match=r"cache: overlaps latent"):
        selkv.write_kv_cache(lat, None, torch.arange(2, dtype=torch.int64, device=device), cache, "nope_fp8")


@pytest.mark.parametrize("device", _devices())
def test_cache_ops_zero_rows(selkv, device):
    cache = selkv.empty_kv_cache(4, 64, "ds_mla_fp8", device=device)
    lat = torch.empty(0, 512, dtype=torch.bfloat16, device=device)
    rope = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    slots = torch.empty(0, dtype=torch.int64, device=device)
    pos = torch.empty(0, 64, dtype=torch.int32, device=device)
    req = torch.empty(0, dtype=torch.int32, device=device)
    bt = torch.zeros(1, 4, dtype=torch.int32, device=device)
    z = torch.empty(0, dtype=torch.int32, device=device)

    def calls():
        selkv.write_kv_cache(lat, rope, slots, cache)
        s, c = selkv.convert_req_indices_to_slots(pos, req, bt, 64, 4, compact=True)
        assert s.shape == (0, 64) and c.shape == (0,)
        g = selkv.gather_kv_bf16(cache, bt, z, z, z, num_rows=0)
        assert g.shape == (0, 576)

    before = cache.clone()
    calls()
    if device == "cuda":
        marker = torch.zeros(1, device=device)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            marker.add_(1)
            calls()
        graph.replay()
        torch.cuda.synchronize()
        assert marker.item() == 1
    assert torch.equal(cache, before)




# ---- wrappers: a tensor of the wrong rank is the op's error, not an IndexError -------------------
def test_wrappers_name_a_wrong_rank(selkv):
    """The Python wrappers read shapes for their defaults (outputs, workspaces); a tensor of another
    rank is an error naming the op and the argument before any of that."""
    q1 = torch.zeros(QK, dtype=torch.bfloat16)
    idx1 = torch.zeros(64, dtype=torch.int32)
    kv = torch.zeros(4, QK, dtype=torch.bfloat16)
    cache = torch.zeros(1, 64, REC, dtype=torch.uint8)
    md = selkv.get_decode_metadata(1, 1, 64, 64, device="cpu")
    cases = [
        (lambda: selkv.sparse_mla_decode(q1, cache, idx1, md), "selkv::sparse_mla_decode: q: expected a 4-d"),
        (lambda: selkv.sparse_prefill(q1, kv, idx1), "selkv::sparse_prefill: q: expected a 3-d"),
        (lambda: selkv.dequant_selected(cache, idx1), "selkv::dequant_selected: indices: expected a 2-d"),
        (lambda: selkv.dequant_selected(cache[0], idx1[None]), "selkv::dequant_selected: cache: expected a 3-d"),
        (lambda: selkv.dequant_sparse_prefill(q1, cache, idx1), "selkv::dequant_sparse_prefill: indices"),
        (lambda: selkv.dcp.dcp_local_decode(q1, cache, idx1, None, md, rank=0, world_size=1),
         "selkv.dcp_local_decode: topk_positions: expected a 3-d"),
    ]
    for call, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            call()


# ---- Meta kernels run the C++ API's checks (torch.compile traces fail as the run would) -----------
def _meta_cases(selkv):
    bf, i32, i64 = torch.bfloat16, torch.int32, torch.int64
    T = 4

    def cache(d, nb=4, ps=16, fmt="ds_mla_fp8"):
        c = selkv.empty_kv_cache(nb, ps, fmt, device=d)
        return c if d == "meta" else c.zero_()

    def lat(d, n=512):
        return torch.zeros(T, n, dtype=bf, device=d)

    def rope(d):
        return torch.zeros(T, 64, dtype=bf, device=d)

    packed = lambda d: torch.zeros(selkv.packed_kv_workspace_size(1, 1, 64), dtype=torch.uint8, device=d)  # noqa: E731
    valid = [
        lambda d: selkv.write_kv_cache(lat(d), rope(d), torch.arange(T, device=d), cache(d)),
        lambda d: selkv.convert_req_indices_to_slots(torch.zeros(T, 8, dtype=i32, device=d),
                                                     torch.zeros(T, dtype=i32, device=d),
                                                     torch.zeros(2, 4, dtype=i32, device=d), 16, 8),
        lambda d: selkv.gather_kv_bf16(cache(d), torch.zeros(1, 2, dtype=i32, device=d), torch.zeros(1, dtype=i32, device=d),
                                       torch.ones(1, dtype=i32, device=d), torch.zeros(1, dtype=i32, device=d), num_rows=1),
        lambda d: selkv.dequant_selected(cache(d), torch.zeros(1, 2, dtype=i32, device=d)),
        lambda d: selkv.pack_selected_kv(cache(d), torch.zeros(1, 1, 64, dtype=i32, device=d)),
        lambda d: selkv.patch_packed_kv(packed(d), torch.zeros(2, dtype=i64, device=d),
                                        torch.zeros(2, 656, dtype=torch.uint8, device=d), batch=1, seq_q=1, topk=64),
    ]
    bad = [  # (call, the argument the error names)
        (lambda d: selkv.write_kv_cache(lat(d), rope(d), torch.arange(T, device=d), cache(d, 1).expand(4, 16, 656)),
         "block_stride_bytes"),
        (lambda d: selkv.write_kv_cache(lat(d, 448), rope(d), torch.arange(T, device=d),
                                        torch.zeros(4, 16, 584, dtype=torch.uint8, device=d), "model1_fp8"),
         "block_stride_bytes"),
        (lambda d: selkv.convert_req_indices_to_slots(torch.zeros(T, 8, dtype=i32, device=d),
                                                      torch.zeros(T, dtype=i32, device=d),
                                                      torch.zeros(2, 4, dtype=i32, device=d), 0, 8), "page_size"),
        (lambda d: selkv.convert_req_indices_to_slots(torch.zeros(T, 8, dtype=i32, device=d),
                                                      torch.zeros(T, dtype=i32, device=d),
                                                      torch.zeros(2, 4, dtype=i32, device=d), 16, -1), "num_blocks"),
        (lambda d: selkv.gather_kv_bf16(cache(d, 1).expand(4, 16, 656), torch.zeros(1, 2, dtype=i32, device=d),
                                        torch.zeros(1, dtype=i32, device=d), torch.ones(1, dtype=i32, device=d),
                                        torch.zeros(1, dtype=i32, device=d), num_rows=1), "block_stride_bytes"),
        (lambda d: selkv.dequant_selected(cache(d), torch.zeros(1, 2, dtype=i32, device=d),
                                          workspace=torch.zeros(1, 576, dtype=bf, device=d).expand(4, 576)),
         "workspace_row_stride"),
        (lambda d: selkv.pack_selected_kv(cache(d, 1).expand(4, 16, 656), torch.zeros(1, 1, 64, dtype=i32, device=d)),
         "block_stride_bytes"),
        (lambda d: selkv.patch_packed_kv(packed(d), torch.zeros(2, dtype=i64, device=d),
                                         torch.zeros(2, 657, dtype=torch.uint8, device=d)[:, :656],
                                         batch=1, seq_q=1, topk=64), "record_stride_bytes"),
        (lambda d: selkv.dequant_sparse_prefill(torch.zeros(2, 64, QK, dtype=bf, device=d), cache(d),
                                                torch.zeros(2, 64, dtype=i32, device=d),
                                                workspace=torch.zeros(16, dtype=torch.uint8, device=d)),
         "workspace_bytes"),
        (lambda d: selkv.gather_sparse_prefill(torch.zeros(2, 64, QK, dtype=bf, device=d), cache(d),
                                               torch.zeros(1, 2, dtype=i32, device=d), torch.zeros(1, dtype=i32, device=d),
                                               torch.ones(1, dtype=i32, device=d), torch.zeros(1, dtype=i32, device=d),
                                               torch.zeros(2, 64, dtype=i32, device=d), -5,
                                               workspace=torch.zeros(4096, dtype=torch.uint8, device=d)),
         "num_kv_rows"),
    ]
    return valid, bad


def test_meta_kernels_run_the_cpp_checks(selkv):
    """Every call the CPU op rejects for a value the C++ API checks (strides, sizes, counts), the
    Meta kernel rejects too, naming the same argument; valid calls pass on Meta."""
    valid, bad = _meta_cases(selkv)
    for call in valid:
        call("cpu")
        call("meta")
    for call, arg in bad:
        for d in ("cpu", "meta"):
            with pytest.raises(RuntimeError, match=f"[ .]{arg}:"):  # (pack names cache.block_stride_bytes)
                call(d)


def test_cpu_ops_apply_the_cuda_rules(selkv):
    """The CPU kernels (the oracle) run the C++ API's checks first, the GPU's alignment and vector
    rules included, so a layout the CUDA op rejects is rejected on the CPU with the same message
    (was: the CPU cache ops accepted it and ran)."""
    T = 4
    cache = selkv.empty_kv_cache(2, 64, "ds_mla_fp8")
    lat = torch.randn(T, 516).to(torch.bfloat16)[:, :512]  # rows 1032 bytes apart: not 16-byte aligned
    rope = torch.randn(T, 64).to(torch.bfloat16)
    slots = torch.arange(T, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=r"selkv::write_kv_cache: latent_row_stride: must be a multiple of 8"):
        selkv.write_kv_cache(lat, rope, slots, cache, "ds_mla_fp8")
    selkv.write_kv_cache(lat.contiguous(), rope, slots, cache, "ds_mla_fp8")  # the dense copy runs


def test_meta_sees_views_of_one_storage(selkv):
    """Meta stand-ins place views of one storage in one region at their offsets: a partial overlap
    between two arguments is rejected when traced as when run (was: every tensor its own region,
    so the traced call passed), and a shifted view's alignment is the one the run sees."""
    T, K = 4, 64
    table = torch.zeros(2, 4, dtype=torch.int32)
    req = torch.zeros(T, dtype=torch.int32)

    def convert(device, shift):
        buf = torch.zeros(T * K + K, dtype=torch.int32, device=device)
        idx = buf[:T * K].view(T, K)
        out = buf[shift:shift + T * K].view(T, K)
        torch.ops.selkv.convert_req_indices_to_slots(idx, req.to(device), table.to(device), 64, 2, out, None, False)

    for d in ("cpu", "meta"):
        convert(d, 0)  # the documented in-place form
        with pytest.raises(RuntimeError, match="out_slots"):
            convert(d, K)  # out starts one row later: overlaps, not in place
