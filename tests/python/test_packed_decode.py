"""Tests of C6, the sparse MLA decode over a packed KV buffer, through torch:
torch.ops.selkv.sparse_mla_decode_packed, selkv.sparse_mla_decode_packed (over buffers made by
selkv.pack_selected_kv) and the FlashMLA-compatible packed names of selkv.flash_mla.

- CPU op (the packed oracle) against an independent torch fp64 model that reads the buffer
  itself (records at entry * 656, validity bits after them) and against test_decode's model over
  the cache and indices the buffer was packed from; the CPU packed op equals the CPU native op
  bitwise (same plan);
- CUDA: packed == native bitwise with the same plan (H 64/128, fixed / dynamic top-k, page 61
  with a padded block stride, all SMs and few parts), and within the DESIGN §5 tolerances of the
  CPU op; pack + decode captured in a CUDA graph and replayed bitwise equal to eager (also after
  q and the cache changed); pack on a side stream ordered by an event;
- selkv.flash_mla: seed 000's five cases, flash_mla_with_packed_kvcache against
  flash_mla_with_kvcache on the same inputs (bitwise), the packed layout, metadata reuse; every
  argument error names the argument;
- op errors name the op and the argument; zero rows; opcheck and torch.compile.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _design_checks import assert_close_design  # noqa: E402  (tests/python is on sys.path under pytest)
from test_decode import (  # noqa: E402
    QK,
    REC,
    SM_SCALE,
    V,
    Case,
    ref_decode,
    ref_records,
)


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _same_bits(a, b):
    return torch.equal(_bits(a), _bits(b))


def packed_size(B, S, K):
    """include/selkv/packed.h: B * S_q * K records of 656 bytes, one validity bit each, then the
    16 bytes of the shape words."""
    return B * S * K * REC + B * S * K // 8 + 16


# ---- independent torch model over the packed buffer -------------------------------------------
def packed_validity(packed, B, S, K):
    """The validity bits of a packed buffer as bool [B, S, K]: uint32 word e / 32, bit e % 32."""
    E = B * S * K
    words = packed.cpu()[E * REC:E * REC + E // 8].view(torch.int32).long() & 0xFFFFFFFF
    e = torch.arange(E)
    return ((words[e // 32] >> (e % 32)) & 1).bool().view(B, S, K)


def ref_packed_decode(q, packed, B, S, K, topk_length=None, sink=None, sm_scale=SM_SCALE):
    """fp64 attention of q over the records the buffer marks valid (and below topk_length)."""
    q = q.cpu().double()
    E = B * S * K
    rec = packed.cpu()[:E * REC].view(E, REC)
    valid = packed_validity(packed, B, S, K)
    if topk_length is not None:
        valid &= torch.arange(K)[None, None, :] < topk_length.cpu()[:, None, None]
    kv = ref_records(rec).view(B, S, K, QK)
    kv = torch.where(valid[..., None], kv, torch.zeros((), dtype=torch.float64))
    scores = torch.einsum("bshd,bskd->bshk", q, kv) * sm_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isinf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bshk,bskd->bshd", p, kv[..., :V])
    if sink is not None:
        out = out / (1 + torch.exp(sink.cpu().double()[None, None, :] - lse))[..., None]
    out = torch.where(empty[..., None], torch.zeros((), dtype=torch.float64), out)
    return out, lse


def check_packed_layout(cache, indices, topk_length, packed):
    """The buffer holds exactly the selected records (valid entries: a slot of the cache and below
    topk_length), zeros elsewhere, and the validity bits of include/selkv/packed.h."""
    cache, indices, packed = cache.cpu(), indices.cpu(), packed.cpu()
    B, S, K = indices.shape
    nb, page = cache.shape[0], cache.shape[1]
    idx = indices.long()
    valid = (idx >= 0) & (idx < nb * page)
    if topk_length is not None:
        valid &= torch.arange(K)[None, None, :] < topk_length.cpu()[:, None, None]
    safe = torch.where(valid, idx, 0)
    want = torch.where(valid[..., None], cache[safe // page, safe % page],
                       torch.zeros((), dtype=torch.uint8))
    assert packed.numel() >= packed_size(B, S, K)
    assert torch.equal(packed[:B * S * K * REC].view(B, S, K, REC), want), "packed records"
    assert torch.equal(packed_validity(packed, B, S, K), valid), "packed validity bits"


def run_packed(selkv, q, cache, idx, tl, sink, *, num_sms=0, md=None):
    """Packs then decodes (plan made here unless given); returns (out, lse, packed, md)."""
    B, S, H, _ = q.shape
    K = idx.shape[-1]
    if md is None:
        md = selkv.get_decode_metadata(B, S, H, K, tl, num_sms=num_sms, device=q.device)
    packed = selkv.pack_selected_kv(cache, idx, tl)
    out, lse = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=K, topk_length=tl,
                                              attn_sink=sink)
    return out, lse, packed, md


# ---- CPU op vs the torch models ---------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("page", [61, 64])
@pytest.mark.parametrize("dynamic", [False, True])
def test_cpu_matches_torch_reference(selkv, gen, H, page, dynamic):
    case = Case(selkv, gen, 3, 2, H, 128, page, dynamic=dynamic, sink=(page == 61),
                pad_bytes=16 if page == 61 else 0)
    q, cache, idx, tl, sink = case.to("cpu")
    out, lse, packed, md = run_packed(selkv, q, cache, idx, tl, sink)
    assert packed.dtype == torch.uint8 and packed.numel() >= selkv.packed_kv_workspace_size(3, 2, 128)
    assert selkv.packed_kv_workspace_size(3, 2, 128) == packed_size(3, 2, 128)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, H, V)
    assert lse.dtype == torch.float32 and lse.shape == (3, 2, H)
    check_packed_layout(cache, idx, tl, packed)
    what = f"cpu H{H} page{page} dyn{dynamic}"
    m_out, m_lse = ref_packed_decode(q, packed, 3, 2, 128, tl, sink)
    assert_close_design(out, lse, m_out, m_lse, what + " vs the packed-buffer model")
    r_out, r_lse = ref_decode(case)
    assert_close_design(out, lse, r_out, r_lse, what + " vs the cache model")
    # the native CPU op over the cache and indices: the same oracle, the same plan, the same bits
    n_out, n_lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl,
                                           attn_sink=sink)
    assert _same_bits(out, n_out) and _same_bits(lse, n_lse), what + ": packed != native"


@pytest.mark.parametrize("device", _devices())
def test_decode_masks_by_the_plan_lengths(selkv, gen, device):
    """A buffer packed without topk_length (every selected entry valid) decoded with a plan made
    for topk_length attends only the entries below the planned lengths: the bits of a buffer
    packed with those lengths."""
    case = Case(selkv, gen, 4, 1, 64, 256, 64, garbage=False, empty_row=False)
    q, cache, idx, _, _ = case.to(device)
    tl = torch.tensor([256, 100, 1, 0], dtype=torch.int32, device=device)
    md = selkv.get_decode_metadata(4, 1, 64, 256, tl, device=device)
    full = selkv.pack_selected_kv(cache, idx)
    cut = selkv.pack_selected_kv(cache, idx, tl)
    a = selkv.sparse_mla_decode_packed(q, full, md, SM_SCALE, topk=256, topk_length=tl)
    b = selkv.sparse_mla_decode_packed(q, cut, md, SM_SCALE, topk=256, topk_length=tl)
    assert _same_bits(a[0], b[0]) and _same_bits(a[1], b[1])
    assert torch.isneginf(a[1][3]).all() and (a[0][3] == 0).all()  # length 0: an empty row
    # topk defaults to the plan's K
    c = selkv.sparse_mla_decode_packed(q, cut, md, SM_SCALE, topk_length=tl)
    assert _same_bits(c[0], b[0]) and _same_bits(c[1], b[1])


# ---- CUDA: packed vs native, vs CPU -------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("dynamic", [False, True])
def test_cuda_packed_equals_native(selkv, cuda_device, gen, H, dynamic):
    K = 256 if dynamic else 576
    case = Case(selkv, gen, 9, 2, H, K, 61, dynamic=dynamic, sink=(H == 128), s_kv=1024,
                pad_bytes=48)
    cpu_out, cpu_lse, _, _ = run_packed(selkv, *case.to("cpu"))
    q, cache, idx, tl, sink = case.to(cuda_device)
    for num_sms in (0, 5):  # all SMs, and few parts (long runs, rows split across parts)
        md = selkv.get_decode_metadata(9, 2, H, K, tl, num_sms=num_sms)
        n_out, n_lse = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl,
                                               attn_sink=sink)
        out, lse, packed, _ = run_packed(selkv, q, cache, idx, tl, sink, md=md)
        torch.cuda.synchronize()
        what = f"cuda H{H} dyn{dynamic} sms{num_sms}"
        assert _same_bits(out, n_out) and _same_bits(lse, n_lse), what + ": packed != native"
        assert_close_design(out, lse, cpu_out.double(), cpu_lse.double(), what + " vs cpu")
    check_packed_layout(cache, idx, tl, packed)


def test_cuda_graph_pack_and_decode_replay(selkv, cuda_device, gen):
    """Plan, pack and packed decode captured in one CUDA graph: a replay equals the eager run
    bitwise, and a replay after q and the cache records changed equals the eager native decode
    over the new inputs (the graph packs again)."""
    case = Case(selkv, gen, 8, 2, 128, 256, 61, dynamic=True, sink=True)
    q, cache, idx, tl, sink = case.to(cuda_device)
    B, S, H, K = case.B, case.S, case.H, case.K
    md = selkv.get_decode_metadata(B, S, H, K, tl)
    packed = torch.empty(selkv.packed_kv_workspace_size(B, S, K), dtype=torch.uint8,
                         device=cuda_device)
    selkv.pack_selected_kv(cache, idx, tl, out=packed)
    eager = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=K, topk_length=tl,
                                           attn_sink=sink)
    native = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink)
    out = torch.full_like(eager[0], float("nan"))
    lse = torch.full_like(eager[1], float("nan"))

    def step():
        selkv.get_decode_metadata(B, S, H, K, tl, out=md)
        selkv.pack_selected_kv(cache, idx, tl, out=packed)
        selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=K, topk_length=tl,
                                       attn_sink=sink, out=out, lse=lse)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch recommends
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        packed.fill_(0xFF)  # all entries "valid" NaN records unless the replay packs
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    for a, b, name in ((eager[0], native[0], "eager out vs native"),
                       (eager[1], native[1], "eager lse vs native"),
                       (out, eager[0], "graph out"), (lse, eager[1], "graph lse")):
        assert _same_bits(a, b), f"{name} differs"

    # new q and new records at every selected slot, then replay
    valid = (case.indices >= 0) & (case.indices < case.num_slots)
    valid &= torch.arange(K)[None, None, :] < case.topk_length[:, None, None]
    slots = torch.unique(case.indices[valid]).long()
    latent = (torch.randn(slots.numel(), 512, generator=gen) / 10).to(torch.bfloat16)
    rope = (torch.randn(slots.numel(), 64, generator=gen) / 10).to(torch.bfloat16)
    selkv.write_kv_cache(latent.to(cuda_device), rope.to(cuda_device), slots.to(cuda_device), cache)
    q.copy_(torch.randn(q.shape, generator=gen).to(torch.bfloat16))
    want = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink)
    graph.replay()
    torch.cuda.synchronize()
    assert _same_bits(out, want[0]) and _same_bits(lse, want[1]), "replay after new inputs"
    assert not _same_bits(out, eager[0]), "the inputs changed: the result must too"


def test_cuda_pack_on_side_stream_with_event(selkv, cuda_device, gen):
    """The pack runs late on a side stream (a sleep before it); the decode on the main stream
    waits for its event and sees the packed records: the bits of the native decode, every time."""
    case = Case(selkv, gen, 4, 2, 64, 2048, 64, s_kv=4096)  # split rows: the workspace is used
    q, cache, idx, _, _ = case.to(cuda_device)
    md = selkv.get_decode_metadata(4, 2, 64, 2048)
    want = selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE)
    packed = torch.empty(selkv.packed_kv_workspace_size(4, 2, 2048), dtype=torch.uint8,
                         device=cuda_device)
    side = torch.cuda.Stream()
    for _ in range(3):
        packed.fill_(0xFF)  # NaN records marked valid: a decode that ran first would show it
        side.wait_stream(torch.cuda.current_stream())  # the fill and the cache before the pack
        with torch.cuda.stream(side):
            torch.cuda._sleep(5_000_000)
            selkv.pack_selected_kv(cache, idx, out=packed)
            done = torch.cuda.Event()
            done.record()
        torch.cuda.current_stream().wait_event(done)
        out, lse = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=2048)
        torch.cuda.synchronize()
        assert _same_bits(out, want[0]) and _same_bits(lse, want[1])


# ---- errors, zero rows, torch.library ----------------------------------------------------------
def _small(selkv, device):
    gen = torch.Generator().manual_seed(1)
    case = Case(selkv, gen, 2, 1, 64, 64, 64, garbage=False, empty_row=False, s_kv=128)
    q, cache, idx, _, _ = case.to(device)
    packed = selkv.pack_selected_kv(cache, idx).view(-1)
    md = selkv.get_decode_metadata(2, 1, 64, 64, device=device)
    return q, packed, md


@pytest.mark.parametrize("device", _devices())
def test_buffer_of_another_shape_gives_nan_rows(selkv, device):
    """The buffer's size depends only on B * S_q * K: one packed for (2, 1, 64) has the size of one
    for (1, 1, 128). Its shape words make the decode of it as (1, 1, 128) give NaN rows (not the
    attention of one row over both rows' records); a patch at that shape writes no record but
    poisons the buffer's K word, so its own shape's decode then fails closed (NaN) too."""
    q, packed, md = _small(selkv, device)
    out, lse = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=64)
    assert bool(torch.isfinite(lse).all()) and bool(torch.isfinite(out.float()).all())
    md1 = selkv.get_decode_metadata(1, 1, 64, 128, device=device)
    out1, lse1 = selkv.sparse_mla_decode_packed(q[:1], packed, md1, SM_SCALE, topk=128)
    assert bool(torch.isnan(lse1).all()) and bool(torch.isnan(out1.float()).all())
    pos = torch.zeros(1, dtype=torch.int64, device=device)
    rec = torch.full((1, REC), 7, dtype=torch.uint8, device=device)
    before = packed.clone()
    selkv.patch_packed_kv(packed, pos, rec, batch=1, seq_q=1, topk=128)  # another shape
    changed = (packed != before).nonzero().flatten().tolist()
    k_word = packed_size(2, 1, 64) - 4
    assert changed and set(changed) <= set(range(k_word, k_word + 4)), changed  # only the K word
    assert packed[k_word:k_word + 4].tolist() == [255] * 4
    out2, lse2 = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=64)
    assert bool(torch.isnan(lse2).all()) and bool(torch.isnan(out2.float()).all())
    poisoned = packed.clone()
    selkv.patch_packed_kv(packed, pos, rec, batch=2, seq_q=1, topk=64)  # its own shape: refused too
    assert torch.equal(packed, poisoned)


@pytest.mark.parametrize("device", _devices())
def test_errors_name_argument(selkv, device):
    op = torch.ops.selkv.sparse_mla_decode_packed
    q, packed, md = _small(selkv, device)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    tl = torch.full((2,), 64, dtype=torch.int32, device=device)
    names = list(torch.ops.selkv.decode_plan_fields())
    big_plan = list(md.plan)
    big_plan[names.index("num_heads")] = 2**40

    def call(**kw):
        a = dict(q=q, packed_kv=packed, topk=64, topk_length=None, attn_sink=None,
                 metadata=md.metadata, plan=md.plan, workspace=md.workspace, sm_scale=SM_SCALE,
                 out=out, lse=lse)
        a.update(kw)
        op(a["q"], a["packed_kv"], a["topk"], a["topk_length"], a["attn_sink"], a["metadata"],
           a["plan"], a["workspace"], a["sm_scale"], a["out"], a["lse"])

    call()  # the valid call works
    p = "selkv::sparse_mla_decode_packed: "
    cases = [
        (dict(q=q.float()), p + "q: expected dtype BFloat16"),
        (dict(q=q[..., :512].contiguous()), p + "q: expected size 576 in dim 3"),
        (dict(packed_kv=packed.view(torch.int32)), p + "packed_kv: expected dtype Byte"),
        (dict(packed_kv=packed[::2]), p + "packed_kv: expected a contiguous tensor"),
        (dict(packed_kv=packed[:-16]), p + "packed_kv: needs 84000 bytes"),
        (dict(topk=100), p + "topk: must be a positive multiple of 64"),
        (dict(topk=2**40), p + "topk: 1099511627776 does not fit in int32"),
        (dict(topk=128), p + "metadata: made for"),
        (dict(topk_length=tl), p + "metadata: made with a different topk_length"),
        (dict(topk_length=tl.long()), p + "topk_length: expected dtype Int"),
        (dict(attn_sink=torch.zeros(32, device=device)), p + "attn_sink: expected size 64 in dim 0"),
        (dict(out=out[..., :256]), p + "out: expected size 512 in dim 3"),
        (dict(lse=lse.double()), p + "lse: expected dtype Float"),
        (dict(plan=md.plan[:5]), p + f"plan: expected the {len(md.plan)} values"),
        (dict(plan=big_plan), p + r"plan\[num_heads\]: 1099511627776 does not fit"),
        (dict(workspace=md.workspace[:16]), p + "workspace: needs"),
        (dict(metadata=md.metadata.long()), p + "metadata: expected dtype Int"),
        (dict(sm_scale=0.0), p + "sm_scale: must be finite and > 0"),
        (dict(sm_scale=1e-50), p + "sm_scale: .* not representable in fp32"),
        (dict(q=q[:1], out=out[:1], lse=lse[:1]), p + "metadata: made for"),
    ]
    assert packed.numel() == packed_size(2, 1, 64) == 84000
    for kw, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            call(**kw)
    # an output may not overlap an input (here the buffer)
    with pytest.raises(RuntimeError, match=p + "lse: overlaps packed_kv"):
        call(lse=packed[:512].view(torch.float32).view(2, 1, 64))


def test_meta_kernel_runs_the_cpp_checks(selkv):
    """The Meta kernel runs the C++ API's checks on stand-in pointers (torch.compile)."""
    q, packed, md = _small(selkv, "cpu")
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device="meta")

    def call(packed_kv=packed, topk=64, sm_scale=SM_SCALE):
        m = lambda t: t.to("meta")  # noqa: E731
        torch.ops.selkv.sparse_mla_decode_packed(m(q), m(packed_kv), topk, None, None, m(md.metadata),
                                                 md.plan, m(md.workspace), sm_scale, out, lse)

    call()
    p = "selkv::sparse_mla_decode_packed: "
    for kw, msg in [
        (dict(packed_kv=packed[:-16]), p + "packed_kv: needs 84000 bytes"),
        (dict(topk=100), p + "topk: must be a positive multiple of 64"),
        (dict(topk=128), p + "metadata: made for"),
        (dict(sm_scale=0.0), p + "sm_scale: must be finite and > 0"),
    ]:
        with pytest.raises(RuntimeError, match=msg):
            call(**kw)


def test_errors_name_wrong_device(selkv, cuda_device):
    q, packed, md = _small(selkv, cuda_device)
    with pytest.raises(RuntimeError, match=r"sparse_mla_decode_packed: packed_kv: expected a CUDA"):
        selkv.sparse_mla_decode_packed(q, packed.cpu(), md, topk=64)
    md_cpu = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu")
    with pytest.raises(RuntimeError, match=r"sparse_mla_decode_packed: metadata: expected a CUDA"):
        selkv.sparse_mla_decode_packed(q, packed, md_cpu, topk=64)


@pytest.mark.parametrize("device", _devices())
def test_zero_rows(selkv, device):
    """No rows (B = 0): a no-op returning empty outputs, with an empty buffer."""
    md = selkv.get_decode_metadata(0, 1, 64, 64, device=device)
    q = torch.empty(0, 1, 64, QK, dtype=torch.bfloat16, device=device)
    packed = torch.empty(0, dtype=torch.uint8, device=device)
    out, lse = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=64)
    assert out.shape == (0, 1, 64, V) and lse.shape == (0, 1, 64)


@pytest.mark.parametrize("device", _devices())
def test_opcheck(selkv, device):
    q, packed, md = _small(selkv, device)
    out = torch.empty(2, 1, 64, V, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 1, 64, dtype=torch.float32, device=device)
    torch.library.opcheck(
        torch.ops.selkv.sparse_mla_decode_packed.default,
        (q, packed, 64, None, None, md.metadata, md.plan, md.workspace, SM_SCALE, out, lse),
    )


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_smoke(selkv, device):
    torch._dynamo.reset()
    q, packed, md = _small(selkv, device)
    expected = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=64)

    def step(q, packed):
        out, lse = selkv.sparse_mla_decode_packed(q, packed, md, SM_SCALE, topk=64)
        return out.float() * 2, lse

    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, packed)
    assert torch.equal(got[0], expected[0].float() * 2)
    assert torch.equal(got[1], expected[1])


# ---- FlashMLA-compatible names -------------------------------------------------------------------
# seed 000's cases: (batch_size, query_len, num_heads, topk, active lengths per batch row)
SEED_CASES = [
    (1, 1, 64, 64, (64,)),                 # a single full 64-token tile
    (2, 3, 64, 576, (511, 449)),           # H=64, partial tails, heterogeneous lengths
    (2, 8, 64, 2048, (2048, 2048)),        # H=64, B*S_q=16, full K=2048
    (1, 4, 128, 2048, (2048,)),            # H=128, full production top-k
    (2, 2, 128, 256, (193, 129)),          # H=128, heterogeneous partial tails
]


def _flash_case(selkv, gen, device, B, S, H, K, active):
    """q, a page-64 cache with request-disjoint slot ranges (real records everywhere), indices
    with an invalid (-1) suffix past each row's active length, topk_length."""
    s_kv = K + 64
    num_blocks = B * s_kv // 64
    cache = selkv.empty_kv_cache(num_blocks, 64, "ds_mla_fp8")
    n = num_blocks * 64
    latent = (torch.randn(n, 512, generator=gen) / 10).to(torch.bfloat16)
    rope = (torch.randn(n, 64, generator=gen) / 10).to(torch.bfloat16)
    selkv.write_kv_cache(latent, rope, torch.arange(n), cache)
    q = torch.randn(B, S, H, QK, generator=gen).to(torch.bfloat16)
    idx = torch.empty(B, S, K, dtype=torch.int32)
    for b in range(B):
        for s in range(S):
            idx[b, s] = (b * s_kv + torch.randperm(s_kv, generator=gen)[:K]).to(torch.int32)
    tl = torch.tensor(active, dtype=torch.int32)
    idx = idx.masked_fill(torch.arange(K)[None, None, :] >= tl[:, None, None], -1)
    k_cache = cache.unsqueeze(2)  # FlashMLA's [num_blocks, page_block_size, 1, 656]
    return q.to(device), k_cache.to(device), idx.to(device), tl.to(device)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: "B{}_S{}_H{}_K{}".format(*c[:4]))
def test_flash_mla_seed_cases(selkv, gen, device, case):
    from selkv import flash_mla

    B, S, H, K, active = case
    q, k_cache, idx, tl = _flash_case(selkv, gen, device, *case)
    scale = QK**-0.5
    native_sched, _ = flash_mla.get_mla_metadata()
    n_out, n_lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, native_sched,
                                                    None, scale, False, True, indices=idx,
                                                    topk_length=tl)
    nbytes = flash_mla.get_packed_kv_workspace_size(B, S, K)
    assert nbytes == selkv.packed_kv_workspace_size(B, S, K) == packed_size(B, S, K)
    storage = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ws = flash_mla.pack_selected_kv(k_cache, idx, tl, storage)
    assert ws.numel() == nbytes and ws.data_ptr() == storage.data_ptr()
    check_packed_layout(k_cache.squeeze(2), idx, tl, ws)
    sched = flash_mla.get_packed_mla_metadata(batch_size=B, query_len=S, num_heads=H, topk=K,
                                              topk_length=active, device=q.device)
    assert isinstance(sched, flash_mla.FlashMLASchedMeta) and not sched.have_initialized
    out, lse = flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, sched, None, tl)  # default scale
    assert sched.have_initialized and sched.config.topk == K
    assert out.shape == (B, S, H, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (B, H, S) and lse.dtype == torch.float32
    assert _same_bits(out, n_out) and _same_bits(lse, n_lse), f"{case}: packed != native"
    # reuse across layers: the same bits
    out2, lse2 = flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, sched, scale, tl)
    assert _same_bits(out2, out) and _same_bits(lse2, lse)


@pytest.mark.parametrize("device", _devices())
def test_flash_mla_packed_api(selkv, gen, device):
    """Conventions beyond the seed cases: empty rows (lse +inf), attn_sink, a larger `out`, one
    metadata object shared with flash_mla_with_kvcache, the empty get_mla_metadata object, a
    new topk_length tensor, float8 views."""
    from selkv import flash_mla

    case = Case(selkv, gen, 3, 2, 64, 128, 64, dynamic=True, sink=True)
    q, cache, idx, tl, sink = case.to(device)
    k_cache = cache.unsqueeze(2).view(torch.float8_e4m3fn)
    sched, _ = flash_mla.get_mla_metadata()
    n_out, n_lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, None,
                                                    SM_SCALE, False, True, indices=idx,
                                                    attn_sink=sink, topk_length=tl)
    assert bool(torch.isposinf(n_lse[2, :, 0]).all())  # the all-invalid row: FlashMLA's +inf
    nbytes = flash_mla.get_packed_kv_workspace_size(3, 2, 128)
    storage = torch.zeros(nbytes + 4096, dtype=torch.uint8, device=device)
    ws = flash_mla.pack_selected_kv(k_cache, idx, tl, storage)
    assert ws.numel() == nbytes and ws.data_ptr() == storage.data_ptr()
    runs = [
        ("shared with flash_mla_with_kvcache", sched, ws, tl),
        ("get_mla_metadata", flash_mla.get_mla_metadata()[0], ws, tl),
        ("get_packed_mla_metadata", flash_mla.get_packed_mla_metadata(
            batch_size=3, query_len=2, num_heads=64, topk=128, device=device,
            topk_length=case.topk_length.tolist()), ws.view(torch.float8_e4m3fn), tl),
        ("new topk_length tensor", sched, ws, tl.clone()),
    ]
    for what, s, buf, t in runs:
        out, lse = flash_mla.flash_mla_with_packed_kvcache(q, buf, 512, s, SM_SCALE, t, sink)
        assert _same_bits(out, n_out) and _same_bits(lse, n_lse), what
    # without topk_length: the buffer's validity bits alone (it was packed with the lengths);
    # a fixed-top-k plan, so the same bits on the CPU (the oracle) and within DESIGN §5 on CUDA
    out, lse = flash_mla.flash_mla_with_packed_kvcache(
        q, ws, 512, flash_mla.get_mla_metadata()[0], SM_SCALE, None, sink)
    if device == "cpu":
        assert _same_bits(out, n_out) and _same_bits(lse, n_lse), "validity bits alone"
    else:
        native_lse = n_lse.transpose(1, 2).cpu().double()
        native_lse = torch.where(torch.isposinf(native_lse), float("-inf"), native_lse)
        got_lse = lse.transpose(1, 2).cpu().double()
        got_lse = torch.where(torch.isposinf(got_lse), float("-inf"), got_lse)
        assert_close_design(out, got_lse, n_out.cpu().double(), native_lse, "validity bits alone")


@pytest.mark.parametrize("device", _devices())
def test_flash_mla_packed_errors_name_argument(selkv, gen, device):
    from selkv import flash_mla

    q, k_cache, idx, tl = _flash_case(selkv, gen, device, 2, 1, 64, 128, (128, 64))
    ws = flash_mla.pack_selected_kv(k_cache, idx, tl)

    def meta(**kw):
        a = dict(batch_size=2, query_len=1, num_heads=64, topk=128, device=device)
        a.update(kw)
        return flash_mla.get_packed_mla_metadata(**a)

    flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, meta(), topk_length=tl)  # valid
    size = flash_mla.get_packed_kv_workspace_size
    for call, msg in [
        (lambda: size(0, 1, 64), "get_packed_kv_workspace_size: batch_size: must be >= 1"),
        (lambda: size(1, 0, 64), "get_packed_kv_workspace_size: query_len: must be >= 1"),
        (lambda: size(1, 1, 100), "get_packed_kv_workspace_size: topk: must be a positive multiple of 64"),
        (lambda: size(1, 1, 0), "get_packed_kv_workspace_size: topk"),
        (lambda: size(2**14, 2, 2**16), r"get_packed_kv_workspace_size: topk: .*< 2\^31"),
        (lambda: size(1.5, 1, 64), "get_packed_kv_workspace_size: batch_size: expected an int"),
        (lambda: meta(num_heads=96), "get_packed_mla_metadata: num_heads: must be 64 or 128"),
        (lambda: meta(topk=100), "get_packed_mla_metadata: topk"),
        (lambda: meta(batch_size=0), "get_packed_mla_metadata: batch_size"),
        (lambda: meta(query_len=0), "get_packed_mla_metadata: query_len"),
        (lambda: meta(topk_length=(128,)), "get_packed_mla_metadata: topk_length: expected one value per batch row"),
        (lambda: meta(topk_length=(128, 129)), "get_packed_mla_metadata: topk_length: values must be in"),
        (lambda: meta(topk_length=-1), "get_packed_mla_metadata: topk_length: values must be in"),
        (lambda: meta(topk_length=tl), "get_packed_mla_metadata: topk_length: .*tensor"),
        (lambda: meta(topk_length="ab"), "get_packed_mla_metadata: topk_length"),
        (lambda: meta(num_sms=0), "get_packed_mla_metadata: num_sms: must be >= 1"),
        (lambda: meta(device="meta"), "get_packed_mla_metadata: device"),
        (lambda: meta(device="no-such-device"), "get_packed_mla_metadata: device"),
        (lambda: flash_mla.pack_selected_kv(k_cache.float(), idx, tl), "pack_selected_kv: k_cache"),
        (lambda: flash_mla.pack_selected_kv(k_cache, idx[0], tl), "pack_selected_kv: indices"),
        (lambda: flash_mla.pack_selected_kv(k_cache, idx, tl, torch.empty(
            2 * ws.numel(), dtype=torch.uint8, device=device)[::2]), "pack_selected_kv: out"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws, 576, meta(), topk_length=tl),
         "flash_mla_with_packed_kvcache: head_dim_v: must be 512"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q[0], ws, 512, meta(), topk_length=tl),
         "flash_mla_with_packed_kvcache: q"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws[:-1], 512, meta(), topk_length=tl),
         "flash_mla_with_packed_kvcache: packed_k_cache: .* not get_packed_kv_workspace_size"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws.float(), 512, meta(), topk_length=tl),
         "flash_mla_with_packed_kvcache: packed_k_cache: expected a uint8"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, meta(topk=64), topk_length=tl),
         "flash_mla_with_packed_kvcache: tile_scheduler_metadata: made for"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, meta(num_heads=128), topk_length=tl),
         "flash_mla_with_packed_kvcache: tile_scheduler_metadata: made for"),
        (lambda: flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, meta(), 0.0, tl),
         "flash_mla_with_packed_kvcache: softmax_scale"),
    ]:
        with pytest.raises(ValueError, match=msg):
            call()
    with pytest.raises(TypeError, match="flash_mla_with_packed_kvcache: tile_scheduler_metadata"):
        flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, object(), topk_length=tl)
    with pytest.raises(TypeError):  # keyword-only, as FlashMLA's
        flash_mla.get_packed_mla_metadata(2, 1, 64, 128, device)
    # a metadata object used for one configuration rejects another
    sched = meta()
    flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, sched, topk_length=tl)
    ws2 = flash_mla.pack_selected_kv(k_cache, idx[:, :, :64].contiguous(), tl.clamp(max=64))
    with pytest.raises(ValueError, match="tile_scheduler_metadata: made for"):
        flash_mla.flash_mla_with_packed_kvcache(q, ws2, 512, sched, topk_length=tl.clamp(max=64))
    if device == "cuda":
        with pytest.raises(ValueError, match="tile_scheduler_metadata: made for device"):
            flash_mla.flash_mla_with_packed_kvcache(q, ws, 512, meta(device="cpu"), topk_length=tl)
