"""model1_fp8 (FlashMLA's MODEL1 KV layout) through the cache ops C1, C3, C4:

- CPU ops against an independent torch model of the layout (below): per page of ``page_size``
  tokens, the 576-byte records (448 E4M3 NoPE + 64 bf16 RoPE), then ``page_size`` x 8 bytes of
  UE8M0 scales (7 tiles of 64 + 1 pad byte), the page padded to a multiple of 576 bytes;
- CUDA ops byte-equal to the CPU ops (skipped without a GPU);
- argument errors that name the argument (scale_mode, latent, cache stride).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

NOPE, ROPE, TILE, TILES = 448, 64, 64, 7
REC, SC, TOK = 576, 8, 584
PAGE_SIZES = (1, 2, 61, 64)
FMT = "model1_fp8"


def page_bytes(page_size: int) -> int:
    return (page_size * TOK + 575) // 576 * 576


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_bitwise_equal(actual, expected, what):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a != e).nonzero()
    assert diff.numel() == 0, (
        f"{what}: {diff.shape[0]} of {a.numel()} elements differ; first at {tuple(diff[0].tolist())}"
    )


# ---- an independent torch model of the MODEL1 layout (FlashMLA quant.py semantics) ----------
def model_quantize(latent: torch.Tensor, rope: torch.Tensor):
    """latent bf16 [T, 448], rope bf16 [T, 64] -> (records uint8 [T, 576], scales uint8 [T, 8])."""
    n = latent.shape[0]
    x = latent.float().view(n, TILES, TILE)
    v = (x.abs().amax(-1) / 448.0).clamp_min(1e-4)
    mant, expo = torch.frexp(v)  # v = mant * 2**expo, mant in [0.5, 1)
    expo = torch.where(mant == 0.5, expo - 1, expo)  # ceil(log2(v)), exact
    s = torch.ldexp(torch.ones_like(v), expo)
    codes = (x / s[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE)
    records = torch.cat([codes, rope.contiguous().view(torch.uint8).reshape(n, 2 * ROPE)], dim=1)
    scales = torch.zeros(n, SC, dtype=torch.uint8)
    scales[:, :TILES] = s.to(torch.float8_e8m0fnu).view(torch.uint8)
    return records, scales


def model_place(buf: torch.Tensor, page_size: int, slot: int, record, scale) -> None:
    """buf: uint8 [num_blocks, >= page_bytes] (the pages)."""
    b, i = divmod(slot, page_size)
    buf[b, i * REC : (i + 1) * REC] = record
    buf[b, page_size * REC + i * SC : page_size * REC + (i + 1) * SC] = scale


def model_dequant(buf: torch.Tensor, page_size: int, slot: int) -> torch.Tensor:
    """bf16 [512]: 448 dequantized NoPE (bf16(float(e4m3) * 2^(b - 127))) + 64 RoPE."""
    b, i = divmod(slot, page_size)
    rec = buf[b, i * REC : (i + 1) * REC]
    sc = buf[b, page_size * REC + i * SC : page_size * REC + i * SC + TILES]
    q = rec[:NOPE].contiguous().view(torch.float8_e4m3fn).float().view(TILES, TILE)
    s = torch.ldexp(torch.ones(TILES), sc.long() - 127)
    nope = (q * s[:, None]).reshape(NOPE).to(torch.bfloat16)
    return torch.cat([nope, rec[NOPE:].contiguous().view(torch.bfloat16)])


def new_cache(gen, num_blocks: int, page_size: int, pad: int = 0):
    """(buf [num_blocks, page_bytes + pad] random bytes, cache view [num_blocks, page_size, 584])."""
    stride = page_bytes(page_size) + pad
    buf = torch.randint(0, 256, (num_blocks, stride), generator=gen, dtype=torch.uint8)
    return buf, buf.as_strided((num_blocks, page_size, TOK), (stride, TOK, 1))


def random_kv(gen, n: int):
    """latent [n, 448] and rope [n, 64] as column slices of one [n, 512] tensor; tile magnitudes
    2^-20 .. 2^11, some zero tiles."""
    x = torch.randn(n, NOPE + ROPE, generator=gen)
    mag = torch.exp2(torch.randint(-20, 12, (n, 8), generator=gen).float()).repeat_interleave(64, dim=1)
    x = x * mag
    zero = torch.rand(n, TILES, 1, generator=gen) < 0.05
    x[:, :NOPE] = x[:, :NOPE].reshape(n, TILES, TILE).masked_fill(zero, 0.0).reshape(n, NOPE)
    kv = x.to(torch.bfloat16)
    return kv[:, :NOPE], kv[:, NOPE:]


def write_case(gen, page_size, num_blocks, num_tokens, pad):
    num_slots = num_blocks * page_size
    latent, rope = random_kv(gen, num_tokens)
    n_valid = min(num_tokens, num_slots) * 3 // 4
    slots = torch.randperm(num_slots, generator=gen)[:n_valid].to(torch.int64)
    invalid = torch.tensor([-1, -2, -(2**31), num_slots, num_slots + 7, 2**40], dtype=torch.int64)
    invalid = invalid[torch.randint(0, invalid.numel(), (num_tokens - n_valid,), generator=gen)]
    slot_mapping = torch.cat([slots, invalid])[torch.randperm(num_tokens, generator=gen)]
    buf, cache = new_cache(gen, num_blocks, page_size, pad)
    return latent, rope, slot_mapping, buf, cache


# ---- layout helpers ----------------------------------------------------------------------------
def test_format_helpers(selkv):
    assert FMT in selkv.FORMATS
    assert selkv.record_bytes(FMT) == selkv.MODEL1_FP8_RECORD_BYTES == 584
    assert selkv.dequant_dim(FMT) == 512
    for ps in (1, 2, 61, 64, 69):
        assert selkv.page_bytes(FMT, ps) == page_bytes(ps)
        assert selkv.page_bytes("ds_mla_fp8", ps) == ps * 656
    c = selkv.empty_kv_cache(3, 61, FMT)
    assert c.shape == (3, 61, 584) and c.stride() == (page_bytes(61), 584, 1)


# ---- CPU ops vs the model ----------------------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("pad", [0, 64])
def test_write_cpu_matches_model(selkv, gen, page_size, pad):
    latent, rope, slot_mapping, buf, cache = write_case(gen, page_size, 4, 40, pad)
    expected = buf.clone()  # untouched bytes (other slots, page padding) keep their values
    selkv.write_kv_cache(latent, rope, slot_mapping, cache, FMT)
    records, scales = model_quantize(latent, rope)
    num_slots = 4 * page_size
    for t in range(slot_mapping.numel()):
        s = int(slot_mapping[t])
        if 0 <= s < num_slots:
            model_place(expected, page_size, s, records[t], scales[t])
    assert_bitwise_equal(buf, expected, "page bytes")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_gather_and_dequant_cpu_match_model(selkv, gen, page_size):
    num_blocks = 5
    n = num_blocks * page_size
    latent, rope = random_kv(gen, n)
    buf, cache = new_cache(gen, num_blocks, page_size, pad=16)
    selkv.write_kv_cache(latent, rope, torch.arange(n), cache, FMT)
    # C3: two requests through a shuffled block table, one with a missing block.
    max_blocks = 3
    table = torch.randint(0, num_blocks, (2, max_blocks), generator=gen).to(torch.int32)
    table[1, 1] = -1
    starts = torch.tensor([page_size // 2, 1], dtype=torch.int32)
    lens = torch.tensor([page_size + 3, 2 * page_size], dtype=torch.int32)
    ws = torch.tensor([0, int(lens[0])], dtype=torch.int32)
    rows = int(lens.sum())
    out = selkv.gather_kv_bf16(
        cache, table, starts, lens, ws, FMT,
        out=torch.full((rows, 512), float("nan"), dtype=torch.bfloat16),
    )
    expected = torch.full((rows, 512), float("nan"), dtype=torch.bfloat16)
    for r in range(2):
        for i in range(int(lens[r])):
            pos = int(starts[r]) + i
            blk = int(table[r, pos // page_size]) if pos // page_size < max_blocks else -1
            row = int(ws[r]) + i
            if 0 <= blk < num_blocks:
                expected[row] = model_dequant(buf, page_size, blk * page_size + pos % page_size)
            else:
                expected[row] = 0
    assert_bitwise_equal(out, expected, "gather out")
    # C4: selected rows, invalid entries -> -1.
    idx = torch.randint(0, n, (3, 4), generator=gen).to(torch.int32)
    idx[0, 1], idx[2, 3] = -1, n
    wsp, oi = selkv.dequant_selected(cache, idx, FMT)
    assert wsp.shape[1] == 512
    for t in range(3):
        for k in range(4):
            s = int(idx[t, k])
            if 0 <= s < n:
                j = int(oi[t, k])
                assert j >= 0
                assert_bitwise_equal(wsp[j], model_dequant(buf, page_size, s), f"row of slot {s}")
            else:
                assert int(oi[t, k]) == -1


def test_write_then_gather_round_trip(selkv, gen):
    """pow2 scales: the error is within half an e4m3 ulp of the tile's largest binade."""
    n, page_size = 100, 64
    latent, rope = random_kv(gen, n)
    cache = selkv.empty_kv_cache(2, page_size, FMT)
    selkv.write_kv_cache(latent, rope, torch.arange(n), cache, FMT)
    out = selkv.gather_kv_bf16(
        cache,
        torch.arange(2, dtype=torch.int32)[None],
        torch.zeros(1, dtype=torch.int32),
        torch.full((1,), n, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        FMT,
    )
    assert out.shape == (n, 512)
    assert_bitwise_equal(out[:, NOPE:], rope, "rope (stored unquantized)")
    x = latent.float().view(n, TILES, TILE)
    err = (out[:, :NOPE].float().view(n, TILES, TILE) - x).abs().amax(-1)
    assert torch.all(err <= x.abs().amax(-1) * 2.0**-3 + 1e-30)


# ---- errors ------------------------------------------------------------------------------------
def test_errors_name_the_argument(selkv, gen):
    latent, rope = random_kv(gen, 4)
    _, cache = new_cache(gen, 2, 4)
    slots = torch.arange(4)
    with pytest.raises(RuntimeError, match="scale_mode"):
        selkv.write_kv_cache(latent, rope, slots, cache, FMT, "amax")
    wide = torch.zeros(4, 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="latent"):
        selkv.write_kv_cache(wide, rope, slots, cache, FMT)
    with pytest.raises(RuntimeError, match="rope"):
        selkv.write_kv_cache(latent, None, slots, cache, FMT)
    dense = torch.zeros(2, 4, TOK, dtype=torch.uint8)  # block stride 4 * 584 < page_bytes(4)
    with pytest.raises(RuntimeError, match="block_stride_bytes"):
        selkv.write_kv_cache(latent, rope, slots, dense, FMT)
    with pytest.raises(RuntimeError, match="cache"):  # a 656-byte cache is not a MODEL1 cache
        selkv.write_kv_cache(latent, rope, slots, selkv.empty_kv_cache(2, 4), FMT)


# ---- CUDA vs CPU, byte for byte ----------------------------------------------------------------
@pytest.mark.parametrize("page_size", (1, 2, 61, 64, 69))
@pytest.mark.parametrize("pad", [0, 48])
def test_cuda_matches_cpu(selkv, cuda_device, gen, page_size, pad):
    d = cuda_device
    latent, rope, slot_mapping, buf, cache = write_case(gen, page_size, 7, 150, pad)
    buf_gpu = buf.to(d)
    cache_gpu = buf_gpu.as_strided(cache.shape, cache.stride())
    selkv.write_kv_cache(latent, rope, slot_mapping, cache, FMT)
    selkv.write_kv_cache(latent.to(d), rope.to(d), slot_mapping.to(d), cache_gpu, FMT)
    torch.cuda.synchronize()
    assert_bitwise_equal(buf_gpu, buf, "page bytes (records, scale tails, padding)")
    # Readers over the same cache bytes (a fully written cache).
    n = 7 * page_size
    latent, rope = random_kv(gen, n)
    selkv.write_kv_cache(latent, rope, torch.arange(n), cache, FMT)
    buf_gpu.copy_(buf)
    table = torch.randperm(7, generator=gen).to(torch.int32)[None]
    args = (torch.tensor([1], dtype=torch.int32), torch.tensor([n - 1], dtype=torch.int32),
            torch.tensor([0], dtype=torch.int32))
    out = selkv.gather_kv_bf16(cache, table, *args, FMT)
    out_gpu = selkv.gather_kv_bf16(cache_gpu, table.to(d), *(a.to(d) for a in args), FMT)
    assert_bitwise_equal(out_gpu, out, "gather out")
    for T, K in ((3, 5), (n, 4)):  # selected, then full pool
        idx = torch.randint(-2, n + 2, (T, K), generator=gen).to(torch.int32)
        w, oi = selkv.dequant_selected(cache, idx, FMT)
        w_gpu, oi_gpu = selkv.dequant_selected(cache_gpu, idx.to(d), FMT)
        assert_bitwise_equal(oi_gpu, oi, "out_indices")
        valid_rows = oi[oi >= 0].long().unique()
        assert_bitwise_equal(w_gpu.cpu()[valid_rows], w[valid_rows], "workspace rows")
