"""Tests of the cache ops (C1-C3) through torch: torch.ops.selkv.* and the selkv wrappers.

- CPU ops (the C++ oracle) against an independent torch reference of the record format, so a
  binding that passes wrong sizes/strides to both backends cannot hide;
- CUDA ops bit-exact against the CPU ops on random data (page sizes 2, 61, 64; both formats and
  scale modes; negative / out-of-range slots; strided tensors; compaction; req_id_per_token
  longer than the rows converted; missing blocks);
- CUDA-graph replay bitwise equal to eager;
- errors name the op and the argument;
- torch.library.opcheck (schema / fake / autograd registration) and a torch.compile smoke test.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

NOPE, ROPE, QK = 512, 64, 576
RECORD_BYTES = {"ds_mla_fp8": 656, "nope_fp8": 528}
FORMATS = ("ds_mla_fp8", "nope_fp8")
SCALE_MODES = ("pow2", "amax")
PAGE_SIZES = (2, 61, 64)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


# ---- helpers ----------------------------------------------------------------------------------
def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so NaNs and signed zeros compare by their bits."""
    t = t.detach().cpu().contiguous()
    view = {
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
        torch.float32: torch.int32,
    }.get(t.dtype)
    return t.view(view) if view is not None else t


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a != e).nonzero()
    assert diff.numel() == 0, (
        f"{what}: {diff.shape[0]} of {a.numel()} elements differ; first at "
        f"{tuple(diff[0].tolist())}: {a[tuple(diff[0])]} != {e[tuple(diff[0])]}"
    )


def storage_span(t: torch.Tensor) -> torch.Tensor:
    """The flat range of t's storage that t spans, gaps (e.g. block padding) included."""
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 0)
    return t.as_strided((extent,), (1,), t.storage_offset())


def same_layout(t: torch.Tensor, device) -> torch.Tensor:
    """A copy of t on `device` with the same strides, gaps copied too."""
    flat = storage_span(t).to(device, copy=True)
    return flat.as_strided(t.shape, t.stride(), 0)


def random_tokens(gen: torch.Generator, n: int, width: int) -> torch.Tensor:
    """bf16 [n, width] spanning many magnitudes per token, with some all-zero tiles."""
    x = torch.randn(n, width, generator=gen)
    mag = torch.exp2(torch.randint(-20, 12, (n, 1), generator=gen).float())
    x = x * mag
    if width >= NOPE:  # zero some 128-element tiles of the latent part
        zero_tiles = torch.rand(n, 4, 1, generator=gen) < 0.05
        x[:, :NOPE] = x[:, :NOPE].reshape(n, 4, 128).masked_fill(zero_tiles, 0.0).reshape(n, NOPE)
    return x.to(torch.bfloat16)


def random_cache(
    gen: torch.Generator, num_blocks: int, page_size: int, fmt: str, pad_bytes: int
) -> torch.Tensor:
    """Random bytes; with pad_bytes > 0 a strided view (block stride > page)."""
    rb = RECORD_BYTES[fmt]
    page = page_size * rb
    base = torch.randint(0, 256, (num_blocks, page + pad_bytes), generator=gen, dtype=torch.uint8)
    return base[:, :page].view(num_blocks, page_size, rb)


def split_latent_rope(gen: torch.Generator, n: int):
    """latent [n, 512] and rope [n, 64] as column slices of one [n, 576] tensor (as engines
    split kv_c / k_pe): rows strided by 576 elements."""
    kv = random_tokens(gen, n, QK)
    return kv[:, :NOPE], kv[:, NOPE:]


# ---- an independent torch model of the record format (DESIGN §1) -------------------------------
def ref_encode(latent: torch.Tensor, rope, fmt: str, mode: str) -> torch.Tensor:
    n = latent.shape[0]
    x = latent.float().view(n, 4, 128)
    amax = x.abs().amax(dim=-1)
    ratio = amax / 448.0
    if mode == "pow2":
        v = ratio.clamp_min(1e-4)
        mant, expo = torch.frexp(v)  # v = mant * 2**expo, mant in [0.5, 1)
        expo = torch.where(mant == 0.5, expo - 1, expo)  # ceil(log2(v))
        s = torch.ldexp(torch.ones_like(v), expo)
    else:
        s = ratio.clamp_min(torch.finfo(torch.float32).tiny)
    q = (x / s[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    parts = [q.reshape(n, NOPE), s.contiguous().view(torch.uint8).reshape(n, 16)]
    if fmt == "ds_mla_fp8":
        parts.append(rope.contiguous().view(torch.uint8).reshape(n, 2 * ROPE))
    return torch.cat(parts, dim=1)


def ref_decode(records: torch.Tensor, fmt: str) -> torch.Tensor:
    n = records.shape[0]
    q = records[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float().view(n, 4, 128)
    s = records[:, NOPE : NOPE + 16].contiguous().view(torch.float32)
    out = (q * s[..., None]).view(n, NOPE).to(torch.bfloat16)
    if fmt == "ds_mla_fp8":
        rope = records[:, NOPE + 16 : NOPE + 16 + 2 * ROPE].contiguous().view(torch.bfloat16)
        out = torch.cat([out, rope], dim=1)
    return out


def ref_convert(indices, req_ids, block_table, page_size, num_blocks, compact, seq_lens=None):
    t_rows, topk = indices.shape
    num_reqs, max_blocks = block_table.shape
    out = torch.full((t_rows, topk), -1, dtype=torch.int32)
    counts = torch.zeros(t_rows, dtype=torch.int32)
    for t in range(t_rows):
        r = int(req_ids[t])
        row = []
        for k in range(topk):
            pos = int(indices[t, k])
            slot = -1
            lim = int(seq_lens[t]) if seq_lens is not None else 2**31 - 1
            if 0 <= r < num_reqs and 0 <= pos < lim and pos // page_size < max_blocks:
                blk = int(block_table[r, pos // page_size])
                if 0 <= blk < num_blocks:
                    slot = blk * page_size + pos % page_size
            row.append(slot)
        valid = [s for s in row if s >= 0]
        counts[t] = len(valid)
        if compact:
            row = valid + [-1] * (topk - len(valid))
        out[t] = torch.tensor(row, dtype=torch.int32)
    return out, counts


# ---- input builders ---------------------------------------------------------------------------
def write_case(gen, page_size, fmt, pad_bytes, num_tokens=40, num_blocks=5):
    num_slots = num_blocks * page_size
    latent, rope = split_latent_rope(gen, num_tokens)
    if fmt == "nope_fp8":
        rope = None
    # Distinct valid slots (a duplicate would make the result order-dependent), plus padding
    # (-1), other negatives and slots past the cache, all of which must be skipped.
    n_valid = min(num_tokens, num_slots) * 3 // 4
    slots = torch.randperm(num_slots, generator=gen)[:n_valid].to(torch.int64)
    invalid = torch.tensor([-1, -2, INT32_MIN, num_slots, num_slots + 7, 2**40], dtype=torch.int64)
    invalid = invalid[torch.randint(0, invalid.numel(), (num_tokens - n_valid,), generator=gen)]
    slot_mapping = torch.cat([slots, invalid])[torch.randperm(num_tokens, generator=gen)]
    cache = random_cache(gen, num_blocks, page_size, fmt, pad_bytes)
    return latent, rope, slot_mapping, cache


def convert_case(gen, page_size, num_tokens=37, topk=64, num_reqs=5, max_blocks=9, extra_ids=11):
    num_blocks = 40
    span = max_blocks * page_size
    indices = torch.randint(-3, span + page_size + 3, (num_tokens, topk), generator=gen)
    poison = torch.rand(num_tokens, topk, generator=gen) < 0.05
    indices = torch.where(poison, torch.tensor(INT32_MAX), indices)
    indices[0, 0], indices[-1, -1] = INT32_MIN, -1
    indices = indices.to(torch.int32)
    # Valid block ids mostly, with -1 and out-of-range ids mixed in.
    block_table = torch.randint(0, num_blocks, (num_reqs, max_blocks), generator=gen)
    bad = torch.rand(num_reqs, max_blocks, generator=gen) < 0.15
    bad_vals = torch.tensor([-1, num_blocks, INT32_MAX, INT32_MIN])
    block_table = torch.where(
        bad, bad_vals[torch.randint(0, 4, (num_reqs, max_blocks), generator=gen)], block_table
    ).to(torch.int32)
    req_ids = torch.randint(0, num_reqs, (num_tokens,), generator=gen)
    req_ids[1], req_ids[2] = -1, num_reqs  # invalid request ids: whole row -1
    # A longer vector than the rows converted, with garbage past num_tokens.
    tail = torch.full((extra_ids,), INT32_MAX)
    req_ids = torch.cat([req_ids, tail]).to(torch.int32)
    return indices, req_ids, block_table, num_blocks


def gather_case(gen, page_size, fmt, pad_bytes, num_blocks=12, max_blocks=8):
    # A cache of well-formed records (written by the CPU op from random tokens).
    num_slots = num_blocks * page_size
    latent, rope = split_latent_rope(gen, num_slots)
    cache = torch.empty(num_blocks, page_size, RECORD_BYTES[fmt], dtype=torch.uint8)
    if pad_bytes:
        cache = random_cache(gen, num_blocks, page_size, fmt, pad_bytes)
    torch.ops.selkv.write_kv_cache(
        latent,
        rope if fmt == "ds_mla_fp8" else None,
        torch.arange(num_slots, dtype=torch.int64),
        cache,
        fmt,
        "pow2" if torch.rand(1, generator=gen).item() < 0.5 else "amax",
    )
    num_reqs = 5
    block_table = torch.randint(0, num_blocks, (num_reqs + 2, max_blocks), generator=gen)
    block_table[1, 2] = -1  # missing block -> zero rows
    block_table[2, 0] = num_blocks  # out-of-range block id -> zero rows
    block_table = block_table.to(torch.int32)
    span = max_blocks * page_size
    starts = torch.randint(0, span, (num_reqs,), generator=gen)
    lens = torch.randint(0, 2 * page_size + 5, (num_reqs,), generator=gen)
    lens[3] = 0
    lens[4] = span - starts[4] + 3  # runs past the block table -> zero rows
    lens = lens.clamp_min(0)
    # Workspace rows: packed with a gap, and the last request partly past the end of out.
    ws = torch.zeros(num_reqs, dtype=torch.int64)
    ws[1:] = torch.cumsum(lens[:-1], 0) + 3
    out_rows = int(ws[-1] + lens[-1]) - 2
    return (
        cache,
        block_table,
        starts.to(torch.int32),
        lens.to(torch.int32),
        ws.to(torch.int32),
        out_rows,
    )


def nan_bf16(rows, dim, device="cpu"):
    return torch.full((rows, dim), float("nan"), dtype=torch.bfloat16, device=device)


# ---- CPU ops vs the torch model ---------------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", SCALE_MODES)
def test_write_cpu_matches_model(selkv, gen, page_size, fmt, mode):
    latent, rope, slot_mapping, cache = write_case(gen, page_size, fmt, pad_bytes=32)
    before = same_layout(cache, "cpu")
    selkv.write_kv_cache(latent, rope, slot_mapping, cache, fmt, mode)

    # Expected: the old bytes (block padding included) with the model's records at the valid
    # slots; nothing else may change.
    expected = before  # same layout as cache
    num_slots = cache.shape[0] * cache.shape[1]
    valid = (slot_mapping >= 0) & (slot_mapping < num_slots)
    records = ref_encode(latent, rope, fmt, mode)
    for t in valid.nonzero().flatten().tolist():
        slot = int(slot_mapping[t])
        expected[slot // cache.shape[1], slot % cache.shape[1]] = records[t]
    assert_bitwise_equal(storage_span(cache), storage_span(expected), "cache bytes")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("compact", [False, True])
def test_convert_cpu_matches_model(selkv, gen, page_size, compact):
    indices, req_ids, block_table, num_blocks = convert_case(gen, page_size, num_tokens=9, topk=20)
    slots, counts = selkv.convert_req_indices_to_slots(
        indices, req_ids, block_table, page_size, num_blocks, compact=compact
    )
    exp_slots, exp_counts = ref_convert(
        indices, req_ids, block_table, page_size, num_blocks, compact
    )
    assert_bitwise_equal(slots, exp_slots, "slots")
    assert_bitwise_equal(counts, exp_counts, "valid_counts")


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("compact", [False, True])
def test_convert_bounds_positions_by_token_seq_lens(selkv, gen, device, compact):
    """token_seq_lens[t] bounds row t's positions (a position at or past it is -1, whatever the
    block table holds there); only the first T entries are read."""
    page_size = 16
    indices, req_ids, block_table, num_blocks = convert_case(gen, page_size, num_tokens=9, topk=64)
    lens = torch.randint(-3, 200, (9 + 5,), generator=gen, dtype=torch.int32)
    lens[0], lens[1] = 0, 2**31 - 1
    slots, counts = selkv.convert_req_indices_to_slots(
        indices.to(device), req_ids.to(device), block_table.to(device), page_size, num_blocks,
        compact=compact, token_seq_lens=lens.to(device))
    exp_slots, exp_counts = ref_convert(indices, req_ids, block_table, page_size, num_blocks, compact, lens)
    assert_bitwise_equal(slots.cpu(), exp_slots, "slots")
    assert_bitwise_equal(counts.cpu(), exp_counts, "valid_counts")
    with pytest.raises(RuntimeError, match="token_seq_lens: expected dtype Int"):
        selkv.convert_req_indices_to_slots(indices.to(device), req_ids.to(device), block_table.to(device),
                                           page_size, num_blocks, token_seq_lens=lens.long().to(device))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_cpu_matches_model(selkv, gen, page_size, fmt):
    cache, block_table, starts, lens, ws, out_rows = gather_case(gen, page_size, fmt, pad_bytes=16)
    dim = QK if fmt == "ds_mla_fp8" else NOPE
    out = selkv.gather_kv_bf16(
        cache, block_table, starts, lens, ws, fmt, out=nan_bf16(out_rows, dim)
    )

    expected = nan_bf16(out_rows, dim)
    num_blocks, page_size = cache.shape[0], cache.shape[1]
    for r in range(lens.numel()):
        for i in range(int(lens[r])):
            row, pos = int(ws[r]) + i, int(starts[r]) + i
            if row >= out_rows:
                continue
            blk = (
                int(block_table[r, pos // page_size])
                if pos // page_size < block_table.shape[1]
                else -1
            )
            if 0 <= blk < num_blocks:
                expected[row] = ref_decode(cache[blk, pos % page_size][None], fmt)[0]
            else:
                expected[row] = 0
    assert_bitwise_equal(out, expected, "out")


def test_write_then_gather_round_trip(selkv, gen):
    """pow2 quantization error is bounded by half an e4m3 ulp of the tile scale."""
    page_size, num_blocks, n = 64, 2, 100
    latent, rope = split_latent_rope(gen, n)
    cache = selkv.empty_kv_cache(num_blocks, page_size, "ds_mla_fp8")
    selkv.write_kv_cache(latent, rope, torch.arange(n), cache)
    out = selkv.gather_kv_bf16(
        cache,
        torch.arange(num_blocks, dtype=torch.int32)[None],
        torch.zeros(1, dtype=torch.int32),
        torch.full((1,), n, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
    )
    assert out.shape == (n, QK)
    assert_bitwise_equal(out[:, NOPE:], rope, "rope (stored unquantized)")
    x = latent.float().view(n, 4, 128)
    err = (out[:, :NOPE].float().view(n, 4, 128) - x).abs().amax(-1)
    amax = x.abs().amax(-1)
    assert torch.all(err <= amax * 2.0**-3 + 1e-30), "e4m3 has 3 mantissa bits"


# ---- CUDA ops vs CPU ops, bit for bit ---------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("pad_bytes", [0, 48])
def test_write_cuda_matches_cpu(selkv, cuda_device, gen, page_size, fmt, mode, pad_bytes):
    latent, rope, slot_mapping, cache = write_case(
        gen, page_size, fmt, pad_bytes, num_tokens=150, num_blocks=9
    )
    to = lambda t: None if t is None else same_layout(t, cuda_device)  # noqa: E731
    cache_gpu = to(cache)
    selkv.write_kv_cache(latent, rope, slot_mapping, cache, fmt, mode)
    selkv.write_kv_cache(to(latent), to(rope), to(slot_mapping), cache_gpu, fmt, mode)
    torch.cuda.synchronize()
    assert_bitwise_equal(
        storage_span(cache_gpu), storage_span(cache), "cache bytes (incl. block padding)"
    )


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("topk", [64, 2048, 33])
def test_convert_cuda_matches_cpu(selkv, cuda_device, gen, page_size, compact, topk):
    indices, req_ids, block_table, num_blocks = convert_case(gen, page_size, topk=topk)
    # Strided rows on both sides: a column slice of a wider tensor.
    wide = torch.zeros(indices.shape[0], topk + 8, dtype=torch.int32)
    wide[:, 3 : 3 + topk] = indices
    indices = wide[:, 3 : 3 + topk]
    slots, counts = selkv.convert_req_indices_to_slots(
        indices,
        req_ids,
        block_table,
        page_size,
        num_blocks,
        compact=compact,
        out=torch.full(indices.shape, 7777, dtype=torch.int32),
        valid_counts=torch.full(indices.shape[:1], 7777, dtype=torch.int32),
    )
    d = cuda_device
    slots_gpu, counts_gpu = selkv.convert_req_indices_to_slots(
        wide.to(d)[:, 3 : 3 + topk],
        req_ids.to(d),
        block_table.to(d),
        page_size,
        num_blocks,
        compact=compact,
        out=torch.full(indices.shape, 7777, dtype=torch.int32, device=d),
        valid_counts=torch.full(indices.shape[:1], 7777, dtype=torch.int32, device=d),
    )
    assert_bitwise_equal(slots_gpu, slots, "slots")
    assert_bitwise_equal(counts_gpu, counts, "valid_counts")
    # Without valid counts, and in place (out aliases the input).
    inplace = wide.to(d)[:, 3 : 3 + topk]
    res, none = selkv.convert_req_indices_to_slots(
        inplace,
        req_ids.to(d),
        block_table.to(d),
        page_size,
        num_blocks,
        compact=compact,
        return_valid_counts=False,
        out=inplace,
    )
    assert none is None and res.data_ptr() == inplace.data_ptr()
    assert_bitwise_equal(inplace, slots, "slots (in place)")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pad_bytes", [0, 32])
def test_gather_cuda_matches_cpu(selkv, cuda_device, gen, page_size, fmt, pad_bytes):
    cache, block_table, starts, lens, ws, out_rows = gather_case(gen, page_size, fmt, pad_bytes)
    dim = QK if fmt == "ds_mla_fp8" else NOPE
    cache_gpu = same_layout(cache, cuda_device)
    d = cuda_device
    out = selkv.gather_kv_bf16(
        cache, block_table, starts, lens, ws, fmt, out=nan_bf16(out_rows, dim)
    )
    out_gpu = selkv.gather_kv_bf16(
        cache_gpu,
        block_table.to(d),
        starts.to(d),
        lens.to(d),
        ws.to(d),
        fmt,
        out=nan_bf16(out_rows, dim, d),
    )
    assert_bitwise_equal(out_gpu, out, "out")


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
def test_runs_on_the_device_of_its_tensors(selkv, gen):
    """Ops on cuda:1 while cuda:0 is current: the binding switches device and stream."""
    d = torch.device("cuda", 1)
    cache, block_table, starts, lens, ws, out_rows = gather_case(gen, 64, "ds_mla_fp8", 0)
    expected = selkv.gather_kv_bf16(
        cache, block_table, starts, lens, ws, out=nan_bf16(out_rows, QK)
    )
    with torch.cuda.device(0):
        got = selkv.gather_kv_bf16(
            *(t.to(d) for t in (cache, block_table, starts, lens, ws)),
            out=nan_bf16(out_rows, QK, d),
        )
        torch.cuda.synchronize(d)
    assert_bitwise_equal(got, expected, "out on cuda:1")


# ---- CUDA graphs --------------------------------------------------------------------------------
@pytest.mark.skipif(
    os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
    reason="torch.cuda.graph needs the caching allocator (disabled for memcheck runs)",
)
def test_cuda_graph_replay_matches_eager(selkv, cuda_device, gen):
    d, fmt, page_size = cuda_device, "ds_mla_fp8", 64
    latent, rope, slot_mapping, cache0 = write_case(
        gen, page_size, fmt, 0, num_tokens=120, num_blocks=4
    )
    latent, rope, slot_mapping = latent.to(d), rope.to(d), slot_mapping.to(d)
    indices, req_ids, block_table, num_blocks = convert_case(gen, page_size)
    indices, req_ids, block_table = indices.to(d), req_ids.to(d), block_table.to(d)
    g_cache, g_bt, g_starts, g_lens, g_ws, out_rows = gather_case(gen, page_size, fmt, 0)
    g_cache, g_bt, g_starts, g_lens, g_ws = (
        t.to(d) for t in (g_cache, g_bt, g_starts, g_lens, g_ws)
    )

    def run(cache, slots, counts, out):
        torch.ops.selkv.write_kv_cache(latent, rope, slot_mapping, cache, fmt, "amax")
        torch.ops.selkv.convert_req_indices_to_slots(
            indices, req_ids, block_table, page_size, num_blocks, slots, counts, True
        )
        torch.ops.selkv.gather_kv_bf16(g_cache, g_bt, g_starts, g_lens, g_ws, fmt, out)

    def fresh():
        return (
            cache0.to(d),
            torch.full(indices.shape, 7777, dtype=torch.int32, device=d),
            torch.full(indices.shape[:1], 7777, dtype=torch.int32, device=d),
            nan_bf16(out_rows, QK, d),
        )

    eager = fresh()
    run(*eager)
    static = fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        run(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(*static)
    for _ in range(2):
        for t, init in zip(static, fresh(), strict=True):
            t.copy_(init)
        graph.replay()
        torch.cuda.synchronize()
        for name, a, e in zip(
            ("cache", "slots", "valid_counts", "out"), static, eager, strict=True
        ):
            assert_bitwise_equal(a, e, f"graph replay: {name}")


def test_two_runs_bitwise_equal(selkv, cuda_device, gen):
    cache, block_table, starts, lens, ws, out_rows = gather_case(gen, 61, "nope_fp8", 0)
    d = cuda_device
    args = [t.to(d) for t in (cache, block_table, starts, lens, ws)]
    a = selkv.gather_kv_bf16(*args, "nope_fp8", out=nan_bf16(out_rows, NOPE, d))
    b = selkv.gather_kv_bf16(*args, "nope_fp8", out=nan_bf16(out_rows, NOPE, d))
    assert_bitwise_equal(a, b, "out")


# ---- errors name the argument -------------------------------------------------------------------
def _write_args(device, fmt="ds_mla_fp8", n=4):
    latent = torch.zeros(n, NOPE, dtype=torch.bfloat16, device=device)
    rope = torch.zeros(n, ROPE, dtype=torch.bfloat16, device=device)
    slots = torch.arange(n, dtype=torch.int64, device=device)
    cache = torch.zeros(2, 4, RECORD_BYTES[fmt], dtype=torch.uint8, device=device)
    return latent, rope, slots, cache


def _convert_args(device, n=3, topk=8):
    return (
        torch.zeros(n, topk, dtype=torch.int32, device=device),
        torch.zeros(n, dtype=torch.int32, device=device),
        torch.zeros(2, 4, dtype=torch.int32, device=device),
    )


def _gather_args(device, fmt="ds_mla_fp8"):
    cache = torch.zeros(2, 4, RECORD_BYTES[fmt], dtype=torch.uint8, device=device)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=device)
    one = torch.ones(1, dtype=torch.int32, device=device)
    out = torch.zeros(2, QK if fmt == "ds_mla_fp8" else NOPE, dtype=torch.bfloat16, device=device)
    return cache, bt, one, one.clone(), one.clone(), out


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


@pytest.mark.parametrize("device", _devices())
def test_write_errors_name_argument(selkv, device):
    op = torch.ops.selkv.write_kv_cache
    latent, rope, slots, cache = _write_args(device)
    prefix = "selkv::write_kv_cache: "
    with pytest.raises(RuntimeError, match=prefix + "latent: expected dtype BFloat16"):
        op(latent.float(), rope, slots, cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "latent: expected size 512 in dim 1"):
        op(latent[:, :256], rope, slots, cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "latent: expected stride 1"):
        op(latent.t().contiguous().t(), rope, slots, cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "rope: required"):
        op(latent, None, slots, cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "rope: must be None"):
        op(latent, rope, slots, cache[..., :528].contiguous(), "nope_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "slot_mapping: expected dtype Long"):
        op(latent, rope, slots.int(), cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "slot_mapping: expected size 4 in dim 0"):
        op(latent, rope, slots[:3], cache, "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "cache: expected size 656 in dim 2"):
        op(latent, rope, slots, cache[..., :528].contiguous(), "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "cache: expected dtype Byte"):
        op(latent, rope, slots, cache.to(torch.int8), "ds_mla_fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "format: expected 'ds_mla_fp8', 'nope_fp8' or 'model1_fp8'"):
        op(latent, rope, slots, cache, "fp8", "pow2")
    with pytest.raises(RuntimeError, match=prefix + "scale_mode: expected 'pow2' or 'amax'"):
        op(latent, rope, slots, cache, "ds_mla_fp8", "max")


@pytest.mark.parametrize("device", _devices())
def test_convert_errors_name_argument(selkv, device):
    op = torch.ops.selkv.convert_req_indices_to_slots
    idx, req, bt = _convert_args(device)
    out = torch.empty_like(idx)
    prefix = "selkv::convert_req_indices_to_slots: "
    with pytest.raises(RuntimeError, match=prefix + "req_local_indices: expected dtype Int"):
        op(idx.long(), req, bt, 4, 2, out, None, False)
    with pytest.raises(RuntimeError, match=prefix + r"req_id_per_token: expected size >= 3"):
        op(idx, req[:2], bt, 4, 2, out, None, False)
    with pytest.raises(RuntimeError, match=prefix + "block_table: expected a 2-d tensor"):
        op(idx, req, bt[0], 4, 2, out, None, False)
    with pytest.raises(RuntimeError, match=prefix + "out_slots: expected size 8 in dim 1"):
        op(idx, req, bt, 4, 2, out[:, :4], None, False)
    with pytest.raises(RuntimeError, match=prefix + "valid_counts: expected dtype Int"):
        op(idx, req, bt, 4, 2, out, torch.empty(3, device=device), False)
    # Checked by the C++ API (CPU oracle or CUDA entry point): the Status message comes through.
    with pytest.raises(RuntimeError, match="convert_req_indices_to_slots: page_size"):
        op(idx, req, bt, 0, 2, out, None, False)
    with pytest.raises(RuntimeError, match=prefix + "page_size: .* does not fit in int32"):
        op(idx, req, bt, 2**33, 2, out, None, False)


@pytest.mark.parametrize("device", _devices())
def test_gather_errors_name_argument(selkv, device):
    op = torch.ops.selkv.gather_kv_bf16
    cache, bt, starts, lens, ws, out = _gather_args(device)
    prefix = "selkv::gather_kv_bf16: "
    with pytest.raises(RuntimeError, match=prefix + "out: expected size 576 in dim 1"):
        op(cache, bt, starts, lens, ws, "ds_mla_fp8", out[:, :NOPE])
    with pytest.raises(RuntimeError, match=prefix + "out: expected dtype BFloat16"):
        op(cache, bt, starts, lens, ws, "ds_mla_fp8", out.half())
    with pytest.raises(RuntimeError, match=prefix + "seq_starts: expected size 1 in dim 0"):
        op(cache, bt, starts.repeat(2), lens, ws, "ds_mla_fp8", out)
    with pytest.raises(RuntimeError, match=prefix + "ws_starts: expected dtype Int"):
        op(cache, bt, starts, lens, ws.long(), "ds_mla_fp8", out)
    with pytest.raises(RuntimeError, match=prefix + "block_table: expected size >= 1 in dim 0"):
        op(cache, bt[:0], starts, lens, ws, "ds_mla_fp8", out)
    with pytest.raises(RuntimeError, match=prefix + "cache: each page must be dense"):
        wide = torch.zeros(2, 4, 2 * 656, dtype=torch.uint8, device=device)
        op(wide[..., :656], bt, starts, lens, ws, "ds_mla_fp8", out)
    with pytest.raises(RuntimeError, match=prefix + "cache: expected size 528 in dim 2"):
        op(cache, bt, starts, lens, ws, "nope_fp8", out[:, :NOPE])


def test_errors_name_wrong_device(selkv, cuda_device):
    latent, rope, slots, cache = _write_args(cuda_device)
    with pytest.raises(RuntimeError, match=r"selkv::write_kv_cache: slot_mapping: expected a CUDA"):
        selkv.write_kv_cache(latent, rope, slots.cpu(), cache)
    idx, req, bt = _convert_args(cuda_device)
    with pytest.raises(
        RuntimeError, match=r"convert_req_indices_to_slots: block_table: expected a CUDA"
    ):
        selkv.convert_req_indices_to_slots(idx, req, bt.cpu(), 4, 2)
    cache, bt, starts, lens, ws, out = _gather_args(cuda_device)
    with pytest.raises(RuntimeError, match=r"selkv::gather_kv_bf16: out: expected a CUDA"):
        selkv.gather_kv_bf16(cache, bt, starts, lens, ws, out=out.cpu())
    if torch.cuda.device_count() > 1:
        with pytest.raises(RuntimeError, match=r"gather_kv_bf16: cache: expected a tensor on cuda"):
            selkv.gather_kv_bf16(cache.to("cuda:1"), bt, starts, lens, ws, out=out)


# ---- torch.library / torch.compile ------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_opcheck(selkv, gen, device):
    opcheck = torch.library.opcheck
    latent, rope, slot_mapping, cache = write_case(
        gen, 61, "ds_mla_fp8", 0, num_tokens=8, num_blocks=2
    )
    to = lambda t: t.to(device)  # noqa: E731
    opcheck(
        torch.ops.selkv.write_kv_cache.default,
        (to(latent), to(rope), to(slot_mapping), to(cache), "ds_mla_fp8", "pow2"),
    )
    indices, req_ids, block_table, num_blocks = convert_case(gen, 2, num_tokens=4, topk=8)
    opcheck(
        torch.ops.selkv.convert_req_indices_to_slots.default,
        (
            to(indices),
            to(req_ids),
            to(block_table),
            2,
            num_blocks,
            torch.empty(4, 8, dtype=torch.int32, device=device),
            torch.empty(4, dtype=torch.int32, device=device),
            True,
        ),
    )
    g = gather_case(gen, 61, "nope_fp8", 0)
    opcheck(
        torch.ops.selkv.gather_kv_bf16.default,
        (
            *(to(t) for t in g[:5]),
            "nope_fp8",
            torch.zeros(g[5], NOPE, dtype=torch.bfloat16, device=device),
        ),
    )


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_smoke(selkv, gen, device):
    torch._dynamo.reset()
    fmt, page_size = "ds_mla_fp8", 64
    latent, rope, slot_mapping, cache = (
        t.to(device) for t in write_case(gen, page_size, fmt, 0, num_tokens=16, num_blocks=2)
    )
    indices, req_ids, block_table, num_blocks = (
        t.to(device) if isinstance(t, torch.Tensor) else t for t in convert_case(gen, page_size)
    )
    seq = torch.tensor([5], dtype=torch.int32, device=device)

    def step(latent, rope, slot_mapping, cache, indices, req_ids, block_table):
        selkv.write_kv_cache(latent, rope, slot_mapping, cache, fmt)
        slots, counts = selkv.convert_req_indices_to_slots(
            indices, req_ids, block_table, page_size, num_blocks, compact=True
        )
        bt = torch.arange(2, dtype=torch.int32, device=latent.device)[None]
        kv = selkv.gather_kv_bf16(cache, bt, seq, seq * 10, seq * 0, fmt, num_rows=50)
        return slots, counts, kv

    args = (latent, rope, slot_mapping, cache, indices, req_ids, block_table)
    eager_args = [a.clone() for a in args]
    expected = step(*eager_args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(*[a.clone() for a in args])
    for name, a, e in zip(("slots", "valid_counts", "kv"), got, expected, strict=True):
        assert_bitwise_equal(a, e, f"compiled {name}")


def test_flash_mla_names(selkv):
    from selkv import flash_mla

    # Every FlashMLA name selkv.flash_mla exports is implemented (no placeholder raising
    # NotImplementedError is left): tested in tests/python/test_decode.py, test_prefill.py and,
    # for the packed path (C6), test_packed_decode.py.
    names = {"FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd",
             "get_packed_kv_workspace_size", "get_packed_mla_metadata", "pack_selected_kv",
             "flash_mla_with_packed_kvcache"}
    assert set(flash_mla.__all__) == names
    for name in names:
        assert callable(getattr(flash_mla, name)), name
    assert not hasattr(flash_mla, "_not_yet")


def test_format_constants(selkv):
    assert selkv.record_bytes("ds_mla_fp8") == selkv.DS_MLA_FP8_RECORD_BYTES == 656
    assert selkv.record_bytes("nope_fp8") == selkv.NOPE_FP8_RECORD_BYTES == 528
    assert selkv.dequant_dim("ds_mla_fp8") == 576 and selkv.dequant_dim("nope_fp8") == 512
    with pytest.raises(ValueError, match="format"):
        selkv.record_bytes("bf16")
    cache = selkv.empty_kv_cache(3, 61, "nope_fp8")
    assert cache.shape == (3, 61, 528) and cache.dtype == torch.uint8
