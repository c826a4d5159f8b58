"""Tests of the C6 pack / patch ops through torch: torch.ops.selkv.{packed_kv_workspace_size,
pack_selected_kv, patch_packed_kv} and the selkv.packed wrappers.

- CPU ops (the C++ oracle) against an independent pure-torch model of the packed layout (records
  at e * 656, zero records for invalid entries, uint32 validity words after the records);
- CUDA ops byte-equal to the CPU ops (page sizes 2, 61, 64, 69; padded block strides; garbage
  indices; dynamic lengths; strided index views), CUDA-graph replay equal to eager;
- errors name the op and the argument; opcheck and a torch.compile smoke test.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

REC = 656
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
PAGE_SIZES = (2, 61, 64, 69)


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


# ---- inputs and the torch model -----------------------------------------------------------------
def random_cache(gen: torch.Generator, num_blocks: int, page_size: int, pad_bytes: int) -> torch.Tensor:
    """uint8 [num_blocks, page_size, 656] of random bytes; pad_bytes > 0: a strided view (the
    block stride exceeds a page, the gap holds random bytes too)."""
    page = page_size * REC
    flat = torch.randint(0, 256, (num_blocks * (page + pad_bytes),), generator=gen, dtype=torch.int32)
    return flat.to(torch.uint8).as_strided((num_blocks, page_size, REC), (page + pad_bytes, REC, 1))


def random_indices(gen: torch.Generator, B: int, S: int, K: int, num_slots: int, strided: bool) -> torch.Tensor:
    """int32 [B, S, K]: mostly valid slots, with every invalid class (-1, negatives, num_slots,
    INT32_MIN / MAX); a strided view of a larger tensor when `strided`."""
    idx = torch.randint(0, max(num_slots, 1), (B, S, K), generator=gen, dtype=torch.int64)
    garbage = torch.tensor([-1, -2, INT32_MIN, num_slots, num_slots + 1, INT32_MAX, -77])
    pick = torch.randint(0, garbage.numel(), (B, S, K), generator=gen)
    bad = torch.rand(B, S, K, generator=gen) < 0.15
    idx = torch.where(bad, garbage[pick], idx).to(torch.int32)
    if strided:
        big = torch.full((B, S + 1, K + 8), 12345, dtype=torch.int32)
        big[:, :S, :K] = idx
        idx = big[:, :S, :K]
    return idx


def random_lengths(gen: torch.Generator, B: int, K: int) -> torch.Tensor:
    choices = torch.tensor([-3, 0, K + 5, INT32_MAX, INT32_MIN, K // 2, 1, K - 1])
    return choices[torch.randint(0, choices.numel(), (B,), generator=gen)].to(torch.int32)


def model_pack(cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None) -> torch.Tensor:
    """The packed layout in plain torch: records of valid entries, zeros otherwise, validity words."""
    nb, page, _ = cache.shape
    B, S, K = indices.shape
    idx = indices.to(torch.int64).reshape(B * S, K)
    valid = (idx >= 0) & (idx < nb * page)
    if topk_length is not None:
        lim = topk_length.to(torch.int64).clamp(0, K).repeat_interleave(S)  # per row
        valid &= torch.arange(K)[None, :] < lim[:, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx)).reshape(-1)
    recs = cache[safe // page, safe % page] if nb > 0 else torch.zeros(safe.numel(), REC, dtype=torch.uint8)
    recs = torch.where(valid.reshape(-1, 1), recs, torch.zeros_like(recs))
    bits = valid.reshape(-1, 32).to(torch.int64) << torch.arange(32)
    words = bits.sum(dim=1).to(torch.int64)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # uint32 bits in int32
    return torch.cat([recs.reshape(-1), words.view(torch.uint8), shape_words(B, S, K)])


def shape_words(B: int, S: int, K: int) -> torch.Tensor:
    """The buffer's last 16 bytes: uint32 {fingerprint (FNV-1a of B, S_q, K, salted), B, S_q, K}."""
    h = 0x811C9DC5 ^ 0x5E1C6B00
    for v in (B, S, K):
        h = ((h ^ (v & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF
    w = torch.tensor([h, B, S, K], dtype=torch.int64)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).view(torch.uint8)


def model_patch(packed: torch.Tensor, positions: torch.Tensor, records: torch.Tensor, entries: int) -> torch.Tensor:
    out = packed.clone()
    words = out[entries * REC : entries * REC + entries // 8].view(torch.int32)
    for i, e in enumerate(positions.tolist()):
        if 0 <= e < entries:
            out[e * REC : (e + 1) * REC] = records[i, :REC]
            w = int(words[e // 32]) & 0xFFFFFFFF
            w |= 1 << (e % 32)
            words[e // 32] = w - 2**32 if w >= 2**31 else w
    return out


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a, e = actual.cpu(), expected.cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a != e).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} bytes differ, first at {diff[0].item()}"


# ---- sizes ----------------------------------------------------------------------------------------
def test_workspace_size(selkv):
    assert selkv.packed_kv_workspace_size(1, 1, 64) == 64 * REC + 8 + 16
    assert selkv.packed_kv_workspace_size(2, 3, 2048) == 6 * 2048 * REC + 6 * 2048 // 8 + 16
    assert selkv.packed_kv_workspace_size(0, 3, 2048) == 0
    for bad in ((1, 1, 100), (1, 1, 0), (-1, 1, 64), (1 << 20, 1, 2048)):
        assert selkv.packed_kv_workspace_size(*bad) == 0, bad
    assert selkv.packed.packed_kv_workspace_size is selkv.packed_kv_workspace_size


# ---- CPU op vs the torch model --------------------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_cpu_pack_matches_model(selkv, gen, page_size, dynamic):
    B, S, K = 3, 2, 128
    cache = random_cache(gen, 300 // page_size + 2, page_size, 48 if page_size % 2 else 0)
    idx = random_indices(gen, B, S, K, cache.shape[0] * page_size, strided=page_size == 61)
    lens = random_lengths(gen, B, K) if dynamic else None
    out = selkv.pack_selected_kv(cache, idx, lens)
    assert out.dtype == torch.uint8 and out.shape == (selkv.packed_kv_workspace_size(B, S, K),)
    assert_bytes_equal(out, model_pack(cache, idx, lens), "cpu pack vs model")


def test_cpu_pack_into_larger_out_and_empty_cache(selkv, gen):
    B, S, K = 2, 1, 64
    cache = random_cache(gen, 4, 16, 0)
    idx = random_indices(gen, B, S, K, 64, strided=False)
    n = selkv.packed_kv_workspace_size(B, S, K)
    out = torch.full((n + 100,), 0xAB, dtype=torch.uint8)
    assert selkv.pack_selected_kv(cache, idx, out=out) is out
    assert_bytes_equal(out[:n], model_pack(cache, idx, None), "into a larger buffer")
    assert bool((out[n:] == 0xAB).all()), "bytes past the size were written"
    # 2-d out of the right byte count works too (any contiguous uint8 tensor)
    out2 = torch.empty(n // 8, 8, dtype=torch.uint8)
    selkv.pack_selected_kv(cache, idx, out=out2)
    assert_bytes_equal(out2.reshape(-1), out[:n], "2-d out")
    # no blocks: every entry invalid
    empty = cache[:0]
    assert_bytes_equal(selkv.pack_selected_kv(empty, idx), model_pack(empty, idx, None), "empty cache")


def test_cpu_zero_rows_is_a_no_op(selkv):
    cache = torch.zeros(2, 4, REC, dtype=torch.uint8)
    idx = torch.zeros(0, 3, 64, dtype=torch.int32)
    out = selkv.pack_selected_kv(cache, idx)
    assert out.numel() == 0
    buf = torch.full((64,), 7, dtype=torch.uint8)
    selkv.pack_selected_kv(cache, torch.zeros(2, 0, 64, dtype=torch.int32), out=buf)
    assert bool((buf == 7).all())
    selkv.patch_packed_kv(buf, torch.zeros(0, dtype=torch.int64), torch.zeros(0, REC, dtype=torch.uint8),
                          batch=2, seq_q=1, topk=64)
    assert bool((buf == 7).all())


def test_cpu_patch_matches_model(selkv, gen):
    B, S, K = 2, 2, 64
    cache = random_cache(gen, 3, 61, 0)
    idx = random_indices(gen, B, S, K, 3 * 61, strided=False)
    lens = random_lengths(gen, B, K)
    packed = selkv.pack_selected_kv(cache, idx, lens)
    entries = B * S * K
    perm = torch.randperm(entries, generator=gen)[:20].tolist()
    positions = torch.tensor(perm + [-1, entries, entries + 3, -(2**63), 2**63 - 1], dtype=torch.int64)
    big = torch.randint(0, 256, (positions.numel(), 672), generator=gen, dtype=torch.int32).to(torch.uint8)
    records = big[:, :REC + 8]  # row stride 672, rows of 664 bytes: the first 656 are copied
    want = model_patch(packed, positions, records, entries)
    got = selkv.patch_packed_kv(packed, positions, records, batch=B, seq_q=S, topk=K)
    assert got is packed
    assert_bytes_equal(got, want, "cpu patch vs model")


# ---- CUDA vs CPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 2, 256), (2, 4, 2048)])
def test_cuda_pack_matches_cpu(selkv, gen, cuda_device, page_size, shape):
    B, S, K = shape
    pad = 4096 if page_size == 69 else (16 if page_size == 61 else 0)
    cache = random_cache(gen, 4000 // page_size + 1, page_size, pad)
    idx = random_indices(gen, B, S, K, cache.shape[0] * page_size, strided=page_size in (2, 61))
    lens = random_lengths(gen, B, K)
    for topk_length in (None, lens):
        want = selkv.pack_selected_kv(cache, idx, topk_length)
        n = want.numel()
        out = torch.full((n + 4096,), 0xAB, dtype=torch.uint8, device=cuda_device)
        dev_cache = cache.to(cuda_device) if pad == 0 else _same_layout(cache, cuda_device)
        dev_len = None if topk_length is None else topk_length.to(cuda_device)
        selkv.pack_selected_kv(dev_cache, idx.to(cuda_device), dev_len, out=out)
        torch.cuda.synchronize()
        assert_bytes_equal(out[:n], want, f"cuda vs cpu (topk_length={topk_length is not None})")
        assert bool((out[n:] == 0xAB).all().item()), "canary after the buffer was written"


def _same_layout(t: torch.Tensor, device) -> torch.Tensor:
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 0)
    flat = t.as_strided((extent,), (1,), t.storage_offset()).to(device, copy=True)
    return flat.as_strided(t.shape, t.stride(), 0)


def test_cuda_patch_matches_cpu(selkv, gen, cuda_device):
    B, S, K = 2, 3, 128
    cache = random_cache(gen, 20, 64, 0)
    idx = random_indices(gen, B, S, K, 20 * 64, strided=False)
    packed = selkv.pack_selected_kv(cache, idx)
    entries = B * S * K
    positions = torch.tensor(torch.randperm(entries, generator=gen)[:100].tolist() + [-1, entries], dtype=torch.int64)
    records = torch.randint(0, 256, (positions.numel(), REC), generator=gen, dtype=torch.int32).to(torch.uint8)
    dev = packed.to(cuda_device)
    selkv.patch_packed_kv(dev, positions.to(cuda_device), records.to(cuda_device), batch=B, seq_q=S, topk=K)
    selkv.patch_packed_kv(packed, positions, records, batch=B, seq_q=S, topk=K)
    torch.cuda.synchronize()
    assert_bytes_equal(dev, packed, "cuda patch vs cpu")


def test_cuda_graph_replay(selkv, gen, cuda_device):
    B, S, K = 4, 2, 2048
    cache = random_cache(gen, 200, 64, 0).to(cuda_device)
    idx = random_indices(gen, B, S, K, 200 * 64, strided=False).to(cuda_device)
    lens = random_lengths(gen, B, K).to(cuda_device)
    eager = selkv.pack_selected_kv(cache, idx, lens)
    out = torch.empty_like(eager)
    selkv.pack_selected_kv(cache, idx, lens, out=out)  # warm-up outside the capture
    torch.cuda.synchronize()
    out.fill_(0xAB)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selkv.pack_selected_kv(cache, idx, lens, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert_bytes_equal(out, eager, "graph replay vs eager")


# ---- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_pack_errors_name_argument(selkv, device):
    op = torch.ops.selkv.pack_selected_kv
    prefix = "selkv::pack_selected_kv: "
    cache = torch.zeros(2, 4, REC, dtype=torch.uint8, device=device)
    idx = torch.zeros(1, 2, 64, dtype=torch.int32, device=device)
    n = selkv.packed_kv_workspace_size(1, 2, 64)
    out = torch.zeros(n, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match=prefix + "indices: expected dtype Int"):
        op(cache, idx.long(), None, out)
    with pytest.raises(RuntimeError, match=prefix + "indices: expected a 3-d tensor"):
        op(cache, idx[0], None, out)
    with pytest.raises(RuntimeError, match=prefix + "topk: must be a positive multiple of 64"):
        op(cache, torch.zeros(1, 2, 96, dtype=torch.int32, device=device), None, out)
    with pytest.raises(RuntimeError, match=prefix + "kv_cache: expected size 656 in dim 2"):
        op(torch.zeros(2, 4, 528, dtype=torch.uint8, device=device), idx, None, out)
    with pytest.raises(RuntimeError, match=prefix + "kv_cache: expected dtype Byte"):
        op(cache.float(), idx, None, out)
    with pytest.raises(RuntimeError, match=prefix + "topk_length: expected size 1 in dim 0"):
        op(cache, idx, torch.zeros(2, dtype=torch.int32, device=device), out)
    with pytest.raises(RuntimeError, match=prefix + "packed_kv: expected dtype Byte"):
        op(cache, idx, None, out.view(torch.int32))
    with pytest.raises(RuntimeError, match=prefix + "packed_kv: expected a contiguous tensor"):
        op(cache, idx, None, torch.zeros(n, 2, dtype=torch.uint8, device=device)[:, 0])
    with pytest.raises(RuntimeError, match=prefix + f"packed_kv_bytes: needs {n} bytes.*got {n - 1}"):
        op(cache, idx, None, out[: n - 1])
    with pytest.raises(RuntimeError, match=prefix + "packed_kv: must be 16-byte aligned"):
        op(cache, idx, None, torch.zeros(n + 16, dtype=torch.uint8, device=device)[8 : 8 + n])
    with pytest.raises(RuntimeError, match=prefix + "packed_kv: overlaps cache"):
        big = torch.zeros(2 * 4 * REC + n, dtype=torch.uint8, device=device)
        op(big[: 2 * 4 * REC].view(2, 4, REC), idx, None, big[16 : 16 + n])


@pytest.mark.parametrize("device", _devices())
def test_patch_errors_name_argument(selkv, device):
    op = torch.ops.selkv.patch_packed_kv
    prefix = "selkv::patch_packed_kv: "
    n = selkv.packed_kv_workspace_size(1, 1, 64)
    buf = torch.zeros(n, dtype=torch.uint8, device=device)
    pos = torch.zeros(2, dtype=torch.int64, device=device)
    recs = torch.zeros(2, REC, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match=prefix + "positions: expected dtype Long"):
        op(buf, 1, 1, 64, pos.int(), recs)
    with pytest.raises(RuntimeError, match=prefix + "records: expected size >= 656 in dim 1"):
        op(buf, 1, 1, 64, pos, recs[:, :600])
    with pytest.raises(RuntimeError, match=prefix + "records: expected size 2 in dim 0"):
        op(buf, 1, 1, 64, pos, recs[:1])
    with pytest.raises(RuntimeError, match=prefix + "record_stride_bytes: must be a multiple of 16"):
        op(buf, 1, 1, 64, pos, torch.zeros(2, 660, dtype=torch.uint8, device=device))
    with pytest.raises(RuntimeError, match=prefix + "topk: must be a positive multiple of 64"):
        op(buf, 1, 1, 100, pos, recs)
    with pytest.raises(RuntimeError, match=prefix + "packed_kv_bytes: needs"):
        op(buf[:100], 1, 1, 64, pos, recs)
    with pytest.raises(RuntimeError, match=prefix + "batch: .* does not fit in int32"):
        op(buf, 2**31, 1, 64, pos, recs)
    with pytest.raises(RuntimeError, match=prefix + "packed_kv: overlaps records"):
        op(buf, 1, 1, 64, pos, buf[: 2 * REC].view(2, REC))


def test_errors_name_wrong_device(selkv, cuda_device):
    cache = torch.zeros(2, 4, REC, dtype=torch.uint8, device=cuda_device)
    idx = torch.zeros(1, 1, 64, dtype=torch.int32, device=cuda_device)
    with pytest.raises(RuntimeError, match="selkv::pack_selected_kv: indices: expected a CUDA"):
        selkv.pack_selected_kv(cache, idx.cpu(), out=torch.empty(64 * REC + 8, dtype=torch.uint8, device=cuda_device))


# ---- torch.library / torch.compile ---------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_opcheck(selkv, gen, device):
    opcheck = torch.library.opcheck
    cache = random_cache(gen, 3, 64, 0).to(device)
    idx = random_indices(gen, 2, 1, 64, 3 * 64, strided=False).to(device)
    lens = torch.tensor([10, 64], dtype=torch.int32, device=device)
    n = selkv.packed_kv_workspace_size(2, 1, 64)
    opcheck(torch.ops.selkv.pack_selected_kv.default,
            (cache, idx, lens, torch.zeros(n, dtype=torch.uint8, device=device)))
    opcheck(torch.ops.selkv.patch_packed_kv.default,
            (torch.zeros(n, dtype=torch.uint8, device=device), 2, 1, 64,
             torch.tensor([3, -1], dtype=torch.int64, device=device),
             torch.zeros(2, REC, dtype=torch.uint8, device=device)))


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_smoke(selkv, gen, device):
    torch._dynamo.reset()
    cache = random_cache(gen, 3, 64, 0).to(device)
    idx = random_indices(gen, 2, 2, 64, 3 * 64, strided=False).to(device)
    n = selkv.packed_kv_workspace_size(2, 2, 64)
    positions = torch.tensor([5, 200], dtype=torch.int64, device=device)
    records = torch.full((2, REC), 9, dtype=torch.uint8, device=device)

    def step(cache, idx, out):
        selkv.pack_selected_kv(cache, idx, out=out)
        selkv.patch_packed_kv(out, positions, records, batch=2, seq_q=2, topk=64)
        return out

    expected = step(cache, idx, torch.empty(n, dtype=torch.uint8, device=device))
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(cache, idx, torch.empty(n, dtype=torch.uint8, device=device))
    assert_bytes_equal(got, expected, "compiled pack + patch")
