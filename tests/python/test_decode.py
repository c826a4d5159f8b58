"""Tests of the sparse MLA decode (C5) through torch: torch.ops.selkv.{get_decode_metadata,
sparse_mla_decode}, the selkv wrappers and the FlashMLA-compatible selkv.flash_mla names.

- CPU op (the fp64 C++ oracle) against an independent torch fp64 reference (record decoding
  and attention written here), so a binding that passes wrong sizes/strides cannot hide;
- CUDA op against the CPU op within the DESIGN §5 tolerances (H 64/128, page 61/64, invalid
  indices incl. INT_MAX / INT_MIN / num_slots, dynamic topk_length with a poisoned suffix, an
  all-invalid row, attn_sink); slots no valid index points at hold NaN records;
- CUDA-graph replay (plan + decode captured) bitwise equal to eager;
- errors name the op and the argument (tensor checks and the C++ API's plan checks);
- FlashMLA-compatible API: shapes, dtypes, lse layout (B, H, S_q) and its +inf convention (the
  packed names: test_packed_decode.py);
- opcheck and a torch.compile smoke test of sparse_mla_decode.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _design_checks import assert_close_design  # noqa: E402 (after the torch skip)

QK, V, REC = 576, 512, 656
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
SM_SCALE = QK**-0.55


# ---- inputs -----------------------------------------------------------------------------------
class Case:
    """q, a NaN-filled paged cache with real records only at slots a valid index points at,
    indices with invalid entries mixed in, optional topk_length / attn_sink."""

    def __init__(self, selkv, gen, B, S, H, K, page, *, dynamic=False, sink=False,
                 garbage=True, empty_row=True, s_kv=256, pad_bytes=0):
        self.B, self.S, self.H, self.K, self.page = B, S, H, K, page
        num_blocks = (B * s_kv + page - 1) // page + 1
        num_slots = num_blocks * page
        stride = page * REC + pad_bytes
        base = torch.full((num_blocks * stride,), 0xFF, dtype=torch.uint8)  # NaN everywhere
        self.cache = base.as_strided((num_blocks, page, REC), (stride, REC, 1))
        self.q = torch.randn(B, S, H, QK, generator=gen).to(torch.bfloat16)
        idx = torch.empty(B, S, K, dtype=torch.int32)
        for b in range(B):
            for s in range(S):
                idx[b, s] = (b * s_kv + torch.randperm(s_kv, generator=gen)[:K]).to(torch.int32)
        if garbage:
            bad = torch.tensor([-1, -7, INT32_MAX, num_slots, num_slots + 5, INT32_MIN],
                               dtype=torch.int32)
            mask = torch.rand(B, S, K, generator=gen) < 0.06
            pick = bad[torch.randint(0, 6, (B, S, K), generator=gen)]
            idx = torch.where(mask, pick, idx)
        if empty_row and B * S > 1:
            idx[B - 1, 0] = torch.tensor([-1, INT32_MAX, INT32_MIN, num_slots])[
                torch.arange(K) % 4]
        self.topk_length = None
        if dynamic:
            lens = torch.tensor([0, 1, 17, 63, 64, 65, 127, 128], dtype=torch.int32)
            self.topk_length = torch.minimum(lens[torch.arange(B) % 8] + (torch.arange(B) // 8) * 64,
                                             torch.tensor(K)).to(torch.int32)
            k = torch.arange(K)
            tail = k[None, None, :] >= self.topk_length[:, None, None].long()
            poison = torch.where(k % 3 == 0, -1, INT32_MAX).to(torch.int32)
            idx = torch.where(tail, poison.expand(B, S, K), idx)
        self.indices = idx
        self.num_slots = num_slots
        # Write real records (randn/10 latents + RoPE, pow2 scales) at every referenced slot.
        valid = (idx >= 0) & (idx < num_slots)
        if self.topk_length is not None:
            valid &= torch.arange(K)[None, None, :] < self.topk_length[:, None, None]
        slots = torch.unique(idx[valid]).long()
        latent = (torch.randn(slots.numel(), 512, generator=gen) / 10).clamp(-1, 1)
        rope = (torch.randn(slots.numel(), 64, generator=gen) / 10).clamp(-1, 1)
        selkv.write_kv_cache(latent.to(torch.bfloat16), rope.to(torch.bfloat16), slots,
                             self.cache)
        self.sink = torch.randn(H, generator=gen) if sink else None

    def to(self, device):
        """Tensors on `device` (the cache keeps its block stride)."""
        span = self.cache.as_strided((self.cache.untyped_storage().nbytes(),), (1,), 0)
        cache = span.to(device).as_strided(self.cache.shape, self.cache.stride(), 0)
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return (mv(self.q), cache, mv(self.indices), mv(self.topk_length), mv(self.sink))


# ---- independent torch reference --------------------------------------------------------------
def ref_records(rec: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 656] ds_mla_fp8 records -> float64 [N, 576] (bf16 values)."""
    nope = rec[:, :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = rec[:, 512:528].contiguous().view(torch.float32)
    latent = (nope * scales.repeat_interleave(128, dim=1)).to(torch.bfloat16)
    rope = rec[:, 528:656].contiguous().view(torch.bfloat16)
    return torch.cat([latent, rope], dim=1).double()


def ref_decode(case: Case, sm_scale=SM_SCALE):
    B, S, H, K = case.B, case.S, case.H, case.K
    idx = case.indices
    valid = (idx >= 0) & (idx < case.num_slots)
    if case.topk_length is not None:
        valid &= torch.arange(K)[None, None, :] < case.topk_length[:, None, None]
    safe = torch.where(valid, idx, 0).long()
    blocks, offs = safe // case.page, safe % case.page
    rec = case.cache[blocks.flatten(), offs.flatten()]
    kv = ref_records(rec).view(B, S, K, QK)
    kv = torch.where(valid[..., None], kv, torch.zeros((), dtype=torch.float64))
    scores = torch.einsum("bshd,bskd->bshk", case.q.double(), kv) * sm_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isinf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bshk,bskd->bshd", p, kv[..., :V])
    if case.sink is not None:
        out = out / (1 + torch.exp(case.sink.double()[None, None, :] - lse))[..., None]
    out = torch.where(empty[..., None], torch.zeros((), dtype=torch.float64), out)
    return out, lse


def run_decode(selkv, q, cache, idx, tl, sink, *, num_sms=0):
    B, S, H, _ = q.shape
    md = selkv.get_decode_metadata(B, S, H, idx.shape[-1], tl, num_sms=num_sms, device=q.device)
    return selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink)


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


# ---- CPU op vs the torch reference ------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("page", [61, 64])
@pytest.mark.parametrize("dynamic", [False, True])
def test_cpu_matches_torch_reference(selkv, gen, H, page, dynamic):
    case = Case(selkv, gen, 3, 2, H, 128, page, dynamic=dynamic, sink=(page == 61),
                pad_bytes=16 if page == 61 else 0)
    out, lse = run_decode(selkv, *case.to("cpu"))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, H, V)
    assert lse.dtype == torch.float32 and lse.shape == (3, 2, H)
    ref_out, ref_lse = ref_decode(case)
    assert_close_design(out, lse, ref_out, ref_lse, f"cpu H{H} page{page} dyn{dynamic}")


def test_cpu_dynamic_equals_fixed_with_invalid_suffix(selkv, gen):
    case = Case(selkv, gen, 8, 1, 64, 256, 64, dynamic=True)
    q, cache, idx, tl, _ = case.to("cpu")
    out_d, lse_d = run_decode(selkv, q, cache, idx, tl, None)
    fixed = torch.where(torch.arange(256)[None, None, :] < tl[:, None, None], idx, -1)
    out_f, lse_f = run_decode(selkv, q, cache, fixed.to(torch.int32), None, None)
    assert torch.equal(out_d.view(torch.int16), out_f.view(torch.int16))
    assert torch.equal(lse_d.view(torch.int32), lse_f.view(torch.int32))


# ---- CUDA op vs CPU op --------------------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("page", [61, 64])
@pytest.mark.parametrize("dynamic", [False, True])
def test_cuda_matches_cpu(selkv, cuda_device, gen, H, page, dynamic):
    K = 256 if dynamic else 576
    case = Case(selkv, gen, 9, 2, H, K, page, dynamic=dynamic, sink=(H == 128),
                s_kv=1024, pad_bytes=48 if page == 61 else 0)
    cpu_out, cpu_lse = run_decode(selkv, *case.to("cpu"))
    ref_out = cpu_out.double()  # bf16-rounded oracle; compare with the design tolerances
    for num_sms in (0, 5):  # all SMs, and few parts (long runs, rows split across parts)
        out, lse = run_decode(selkv, *case.to(cuda_device), num_sms=num_sms)
        torch.cuda.synchronize()
        assert_close_design(out, lse, ref_out, cpu_lse.double(),
                            f"cuda H{H} page{page} dyn{dynamic} sms{num_sms}")


def test_cuda_graph_replay_bitwise_equal(selkv, cuda_device, gen):
    case = Case(selkv, gen, 8, 2, 128, 256, 61, dynamic=True, sink=True)
    q, cache, idx, tl, sink = case.to(cuda_device)
    B, S, H, K = case.B, case.S, case.H, case.K
    md = selkv.get_decode_metadata(B, S, H, K, tl)
    eager_out, eager_lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE,
                                                    topk_length=tl, attn_sink=sink)
    again_out, again_lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE,
                                                    topk_length=tl, attn_sink=sink)
    out = torch.full_like(eager_out, float("nan"))
    lse = torch.full_like(eager_lse, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch recommends
        selkv.get_decode_metadata(B, S, H, K, tl, out=md)
        selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink,
                                out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(side)
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        selkv.get_decode_metadata(B, S, H, K, tl, out=md)
        selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink,
                                out=out, lse=lse)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    for a, b, name in ((eager_out, again_out, "rerun out"), (eager_lse, again_lse, "rerun lse"),
                       (eager_out, out, "graph out"), (eager_lse, lse, "graph lse")):
        iview = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.view(iview), b.view(iview)), f"{name} differs from eager"


# ---- errors -------------------------------------------------------------------------------------
def _small(selkv, device):
    gen = torch.Generator().manual_seed(1)
    case = Case(selkv, gen, 2, 1, 64, 64, 64, garbage=False, empty_row=False, s_kv=128)
    q, cache, idx, _, _ = case.to(device)
    md = selkv.get_decode_metadata(2, 1, 64, 64, device=device)
    return q, cache, idx, md


@pytest.mark.parametrize("device", _devices())
def test_plan_fields_named_by_the_binding(selkv, device):
    """The plan's layout is the C++ binding's: DecodeMetadata reads its fields by the names
    torch.ops.selkv.decode_plan_fields() returns, and the op names a field it rejects."""
    names = list(torch.ops.selkv.decode_plan_fields())
    assert len(names) == len(set(names))
    for name in ("batch", "seq_q", "num_heads", "topk", "topk_length", "num_sm_parts",
                 "workspace_bytes", "min_blocks_per_part"):
        assert name in names, name
    md = selkv.get_decode_metadata(3, 2, 128, 192, device=device)
    assert len(md.plan) == len(names)
    assert (md.batch, md.seq_q, md.num_heads, md.topk) == (3, 2, 128, 192)
    assert md.field("topk_length") == 0
    assert md.num_sm_parts >= 1 and md.min_blocks_per_part >= 1
    assert md.workspace.numel() >= md.field("workspace_bytes")
    q, cache, idx, md = _small(selkv, device)
    plan = list(md.plan)
    plan[names.index("num_heads")] = 2**40
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    with pytest.raises(RuntimeError, match=r"plan\[num_heads\]: 1099511627776 does not fit"):
        torch.ops.selkv.sparse_mla_decode(q, cache, idx, None, None, md.metadata, plan,
                                          md.workspace, SM_SCALE, out, lse)


@pytest.mark.parametrize("device", _devices())
def test_errors_name_argument(selkv, device):
    op = torch.ops.selkv.sparse_mla_decode
    q, cache, idx, md = _small(selkv, device)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    tl = torch.full((2,), 64, dtype=torch.int32, device=device)

    def call(**kw):
        a = dict(q=q, kv_cache=cache, indices=idx, topk_length=None, attn_sink=None,
                 metadata=md.metadata, plan=md.plan, workspace=md.workspace, sm_scale=SM_SCALE,
                 out=out, lse=lse)
        a.update(kw)
        op(a["q"], a["kv_cache"], a["indices"], a["topk_length"], a["attn_sink"], a["metadata"],
           a["plan"], a["workspace"], a["sm_scale"], a["out"], a["lse"])

    call()  # the valid call works
    p = "selkv::sparse_mla_decode: "
    cases = [
        (dict(q=q.float()), p + "q: expected dtype BFloat16"),
        (dict(q=q[..., :512].contiguous()), p + "q: expected size 576 in dim 3"),
        (dict(q=q.transpose(2, 3).contiguous().transpose(2, 3)), p + "q: expected stride 1"),
        (dict(kv_cache=cache[..., :528].contiguous()),
         p + r"kv_cache: expected size 656 \(ds_mla_fp8\) or 584 \(model1_fp8\) in dim 2"),
        (dict(indices=idx.long()), p + "indices: expected dtype Int"),
        (dict(indices=idx[:1]), p + "indices: expected size 2 in dim 0"),
        (dict(topk_length=tl.long()), p + "topk_length: expected dtype Int"),
        (dict(attn_sink=torch.zeros(32, device=device)), p + "attn_sink: expected size 64 in dim 0"),
        (dict(out=out[..., :256]), p + "out: expected size 512 in dim 3"),
        (dict(lse=lse.double()), p + "lse: expected dtype Float"),
        (dict(plan=md.plan[:5]), p + f"plan: expected the {len(md.plan)} values"),
        (dict(workspace=md.workspace[:16]), p + "workspace: needs"),
        (dict(metadata=md.metadata.long()), p + "metadata: expected dtype Int"),
        # the C++ API's plan checks
        (dict(topk_length=tl), p + "metadata: made with a different topk_length"),
        (dict(q=q[:1], indices=idx[:1], out=out[:1], lse=lse[:1]), p + "metadata: made for"),
        (dict(indices=torch.cat([idx, idx], -1)), p + "metadata: made for"),
    ]
    for kw, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            call(**kw)
    # unsupported shapes, checked by the C++ API against each call
    md96 = selkv.get_decode_metadata(2, 1, 96, 64, device=device) if device == "cpu" else None
    if md96 is not None:
        q96 = torch.zeros(2, 1, 96, QK, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match=p + "num_heads: must be 64 or 128"):
            selkv.sparse_mla_decode(q96, cache, idx, md96)
    else:
        with pytest.raises(RuntimeError, match="make_decode_metadata: num_heads: must be 64 or 128"):
            selkv.get_decode_metadata(2, 1, 96, 64, device=device)
        with pytest.raises(RuntimeError, match="make_decode_metadata: topk: must be a positive multiple of 64"):
            selkv.get_decode_metadata(2, 1, 64, 100, device=device)
    g = "selkv::get_decode_metadata: "
    with pytest.raises(RuntimeError, match=g + "metadata: expected dtype Int"):
        torch.ops.selkv.get_decode_metadata(2, 1, 64, 64, None, 0, md.metadata.float())
    with pytest.raises(RuntimeError, match=g + "topk_length: expected size 2 in dim 0"):
        torch.ops.selkv.get_decode_metadata(2, 1, 64, 64, tl[:1], 0, md.metadata)


def test_meta_kernel_runs_the_cpp_checks(selkv):
    """The Meta kernel (torch.compile's tracing) runs the C++ API's checks on stand-in pointers:
    a call that would fail when run fails when traced, naming the argument."""
    q, cache, idx, md = _small(selkv, "cpu")
    tl = torch.full((2,), 64, dtype=torch.int32)
    md_tl = selkv.get_decode_metadata(2, 1, 64, 64, tl)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device="meta")

    def call(plan_md=md, indices=idx, topk_length=None, sm_scale=SM_SCALE, workspace=None):
        m = lambda t: None if t is None else t.to("meta")  # noqa: E731
        torch.ops.selkv.sparse_mla_decode(
            m(q), m(cache), m(indices), m(topk_length), None, m(plan_md.metadata), plan_md.plan,
            m(plan_md.workspace if workspace is None else workspace), sm_scale, out, lse)

    call()
    call(plan_md=md_tl, topk_length=tl)  # the plan's lengths tensor, traced as a meta tensor
    p = "selkv::sparse_mla_decode: "
    for kw, msg in [
        (dict(sm_scale=-1.0), p + "sm_scale: must be finite and > 0"),
        (dict(indices=torch.cat([idx, idx], -1)), p + "metadata: made for"),
        (dict(topk_length=tl), p + "metadata: made with a different topk_length"),
        (dict(plan_md=md_tl), p + "metadata: made with a different topk_length"),
        (dict(workspace=md.workspace[:16]), p + "workspace: needs"),
    ]:
        with pytest.raises(RuntimeError, match=msg):
            call(**kw)


def test_misaligned_metadata_rejected(selkv):
    """The kernels read the plan with 16-byte loads: a copy of it at another offset is an error
    naming metadata, not a misaligned-address fault."""
    q, cache, idx, md = _small(selkv, "cpu")
    shifted = torch.empty(md.metadata.numel() + 1, dtype=torch.int32)[1:]
    shifted.copy_(md.metadata)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16)
    lse = torch.empty(2, 1, 64, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="sparse_mla_decode: metadata: data must be 16-byte aligned"):
        torch.ops.selkv.sparse_mla_decode(q, cache, idx, None, None, shifted, md.plan, md.workspace,
                                          SM_SCALE, out, lse)
    # Meta: the stand-in addresses keep the views' storage offsets, so the traced call fails alike
    meta = [t.to("meta") for t in (q, cache, idx, md.metadata, md.workspace, out, lse)]
    torch.ops.selkv.sparse_mla_decode(*meta[:3], None, None, meta[3], md.plan, meta[4], SM_SCALE, *meta[5:])
    shifted_meta = torch.empty(md.metadata.numel() + 1, dtype=torch.int32, device="meta")[1:]
    with pytest.raises(RuntimeError, match="sparse_mla_decode: metadata: data must be 16-byte aligned"):
        torch.ops.selkv.sparse_mla_decode(*meta[:3], None, None, shifted_meta, md.plan, meta[4], SM_SCALE,
                                          *meta[5:])


def test_errors_name_wrong_device(selkv, cuda_device):
    q, cache, idx, md = _small(selkv, cuda_device)
    with pytest.raises(RuntimeError, match=r"sparse_mla_decode: indices: expected a CUDA"):
        selkv.sparse_mla_decode(q, cache, idx.cpu(), md)
    with pytest.raises(RuntimeError, match=r"sparse_mla_decode: metadata: expected a CUDA"):
        md_cpu = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu")
        selkv.sparse_mla_decode(q, cache, idx, md_cpu)


# ---- FlashMLA-compatible API --------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_flash_mla_api(selkv, gen, device, dynamic):
    from selkv import flash_mla

    case = Case(selkv, gen, 3, 2, 64, 128, 64, dynamic=dynamic, sink=True)
    q, cache, idx, tl, sink = case.to(device)
    # FlashMLA's cache view: [num_blocks, page_block_size, 1, 656], here as float8_e4m3fn.
    k_cache = cache.unsqueeze(2).view(torch.float8_e4m3fn)
    sched, none = flash_mla.get_mla_metadata()
    assert none is None and not sched.have_initialized
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, sched, None, SM_SCALE, False, True,
        indices=idx, attn_sink=sink, topk_length=tl)
    assert sched.have_initialized
    assert out.shape == (3, 2, 64, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (3, 64, 2) and lse.dtype == torch.float32  # (B, H, S_q)
    nat_out, nat_lse = run_decode(selkv, q, cache, idx, tl, sink)
    nat_lse_t = nat_lse.transpose(1, 2)
    empty = torch.isinf(nat_lse_t) & (nat_lse_t < 0)
    assert bool(empty[2, :, 0].all()), "the all-invalid row must be empty in the native API"
    assert bool((lse[empty] == float("inf")).all()), "FlashMLA convention: lse +inf for empty rows"
    assert torch.equal(lse[~empty], nat_lse_t[~empty])
    assert torch.equal(out.view(torch.int16), nat_out.view(torch.int16))
    # reuse across layers; a configuration change is an error naming the argument
    out2, _ = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, sched, softmax_scale=SM_SCALE, is_fp8_kvcache=True,
        indices=idx, attn_sink=sink, topk_length=tl)
    assert torch.equal(out2.view(torch.int16), out.view(torch.int16))
    if tl is not None:  # another tensor with the same values: planned again, same result
        out3, _ = flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, None, 512, sched, softmax_scale=SM_SCALE, is_fp8_kvcache=True,
            indices=idx, attn_sink=sink, topk_length=tl.clone())
        assert torch.equal(out3.view(torch.int16), out.view(torch.int16))
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(
            q[:2], k_cache, None, None, 512, sched, is_fp8_kvcache=True,
            indices=idx[:2], topk_length=None if tl is None else tl[:2])
    fresh, _ = flash_mla.get_mla_metadata()
    # An extra cache goes with its indices; with the V3.2 layout it is not supported (FlashMLA has
    # it for MODEL1 only): the C++ API names extra_cache.
    with pytest.raises(ValueError, match="extra_k_cache"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, fresh, is_fp8_kvcache=True,
                                         indices=idx, extra_k_cache=k_cache)
    with pytest.raises(RuntimeError, match="extra_cache: an extra KV cache needs format model1_fp8"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0],
                                         is_fp8_kvcache=True, indices=idx, extra_k_cache=k_cache,
                                         extra_indices_in_kvcache=idx)
    with pytest.raises(NotImplementedError, match="is_fp8_kvcache"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, fresh, indices=idx)
    with pytest.raises(ValueError, match="head_dim_v"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 576, fresh,
                                         is_fp8_kvcache=True, indices=idx)
    with pytest.raises(ValueError, match="k_cache"):
        flash_mla.flash_mla_with_kvcache(q, k_cache.view(torch.uint8).to(torch.float32), None,
                                         None, 512, fresh, is_fp8_kvcache=True, indices=idx)
    # (the packed names, C6: tests/python/test_packed_decode.py)


# ---- torch.library / torch.compile --------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_opcheck(selkv, device):
    q, cache, idx, md = _small(selkv, device)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    torch.library.opcheck(
        torch.ops.selkv.sparse_mla_decode.default,
        (q, cache, idx, None, None, md.metadata, md.plan, md.workspace, SM_SCALE, out, lse),
    )


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_smoke(selkv, device):
    torch._dynamo.reset()
    q, cache, idx, md = _small(selkv, device)
    expected = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE)

    def step(q, cache, idx):
        out, lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE)
        return out.float() * 2, lse

    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, cache, idx)
    assert torch.equal(got[0], expected[0].float() * 2)
    assert torch.equal(got[1], expected[1])


# ---- issue 15: streams, the lengths snapshot, NaN rows --------------------------------------------
def _bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def test_cuda_two_streams_same_plan(selkv, cuda_device, gen):
    """One plan, decodes of different inputs on two streams at once: each gets its own split
    accumulators (the plan's on the planning stream, a fresh one elsewhere), so the bits equal
    those of sequential runs; the side stream is ordered after the planning stream."""
    case_a = Case(selkv, gen, 2, 1, 64, 2048, 64, s_kv=4096)  # split rows: the workspace is used
    q, cache, idx, _, _ = case_a.to(cuda_device)
    q2 = torch.randn(q.shape, generator=gen).to(torch.bfloat16).to(cuda_device)
    md = selkv.get_decode_metadata(2, 1, 64, 2048)
    seq = [selkv.sparse_mla_decode(x, cache, idx, md, SM_SCALE) for x in (q, q2)]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the plan was made on the current stream
    for _ in range(3):
        out_a, lse_a = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE)
        with torch.cuda.stream(side):
            out_b, lse_b = selkv.sparse_mla_decode(q2, cache, idx, md, SM_SCALE)
        torch.cuda.synchronize()
        assert torch.equal(_bits(out_a), _bits(seq[0][0])) and torch.equal(_bits(lse_a), _bits(seq[0][1]))
        assert torch.equal(_bits(out_b), _bits(seq[1][0])) and torch.equal(_bits(lse_b), _bits(seq[1][1]))


@pytest.mark.parametrize("device", _devices())
def test_topk_length_changed_in_place_uses_planned_lengths(selkv, gen, device):
    """The plan snapshots topk_length: changing the values in place without a new plan gives
    exactly the result for the planned lengths; a new plan gives the new result."""
    case = Case(selkv, gen, 4, 2, 64, 256, 64, garbage=False, empty_row=False)  # all entries real
    q, cache, idx, _, _ = case.to(device)
    tl = torch.tensor([256, 100, 64, 1], dtype=torch.int32, device=device)
    md = selkv.get_decode_metadata(4, 2, 64, 256, tl, device=device)
    old = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl)
    tl.copy_(torch.tensor([3, 256, 200, 130], dtype=torch.int32))
    stale = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl)
    assert torch.equal(_bits(stale[0]), _bits(old[0])) and torch.equal(_bits(stale[1]), _bits(old[1]))
    selkv.get_decode_metadata(4, 2, 64, 256, tl, out=md)
    new = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl)
    case.topk_length = tl.cpu()
    ref_out, ref_lse = ref_decode(case)
    assert_close_design(new[0], new[1], ref_out, ref_lse, f"{device} re-planned")
    case.topk_length = torch.tensor([256, 100, 64, 1], dtype=torch.int32)
    ref_out, ref_lse = ref_decode(case)
    assert_close_design(stale[0], stale[1], ref_out, ref_lse, f"{device} planned lengths")


@pytest.mark.parametrize("device", _devices())
def test_nan_reaching_softmax_is_nan_not_empty(selkv, gen, device):
    """A NaN in q (one head) gives that head NaN out and lse; every other row and head keeps its
    bits; the compat layer keeps NaN (only -inf becomes +inf)."""
    case = Case(selkv, gen, 2, 2, 64, 128, 64, garbage=False, empty_row=True)
    q, cache, idx, _, _ = case.to(device)
    md = selkv.get_decode_metadata(2, 2, 64, 128, device=device)
    base_out, base_lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE)
    qn = q.clone()
    qn[0, 1, 5, 17] = float("nan")
    out, lse = selkv.sparse_mla_decode(qn, cache, idx, md, SM_SCALE)
    assert torch.isnan(lse[0, 1, 5]) and torch.isnan(out[0, 1, 5].float()).all()
    keep = torch.ones(2, 2, 64, dtype=torch.bool, device=lse.device)
    keep[0, 1, 5] = False
    assert torch.equal(_bits(lse)[keep], _bits(base_lse)[keep])
    assert torch.equal(_bits(out)[keep], _bits(base_out)[keep])
    assert torch.isneginf(lse[1, 0]).all() and (out[1, 0] == 0).all()  # the empty row stays empty
    from selkv import flash_mla

    sched, _ = flash_mla.get_mla_metadata()
    _, f_lse = flash_mla.flash_mla_with_kvcache(qn, cache.unsqueeze(2).view(torch.float8_e4m3fn), None, None,
                                                512, sched, None, SM_SCALE, False, True, indices=idx)
    assert torch.isnan(f_lse[0, 5, 1]) and torch.isposinf(f_lse[1, :, 0]).all()


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_empty_lse_pos_inf(selkv, gen, device, dynamic):
    """empty_lse_pos_inf=True (FlashMLA's convention, written by the kernels): the lse of a row
    with no valid entry is +inf; every other lse bit and every out bit as without it. One-part
    plans and split plans (min_blocks_per_part=1: split rows go through the combine)."""
    case = Case(selkv, gen, 3, 2, 64, 256, 64, dynamic=dynamic, empty_row=True)
    q, cache, idx, tl, _ = case.to(device)
    for mb in (0, 1):
        md = selkv.get_decode_metadata(3, 2, 64, 256, tl, min_blocks_per_part=mb, device=device)
        out, lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl)
        out_p, lse_p = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, empty_lse_pos_inf=True)
        empty = torch.isneginf(lse)
        assert bool(empty[2, 0].all()), "the case's empty row"
        assert bool(torch.isposinf(lse_p[empty]).all()) and not bool(torch.isneginf(lse_p).any())
        assert torch.equal(_bits(lse_p)[~empty], _bits(lse)[~empty])
        assert torch.equal(_bits(out_p), _bits(out))
