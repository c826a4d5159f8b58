"""Sparse MLA decode (C5) over the MODEL1 cache (``model1_fp8``, d_qk 512) with the optional extra
KV cache, through torch: torch.ops.selkv.{get_decode_metadata, sparse_mla_decode}, the selkv
wrappers and ``selkv.flash_mla.flash_mla_with_kvcache`` with FlashMLA's MODEL1 arguments.

- CPU op (the fp64 C++ oracle) against an independent torch fp64 model written here (the page
  layout, UE8M0 dequant, the union of both selections in one softmax, V = the whole 512-dim K);
- FlashMLA's conventions: the cache as its ``quantize_k_cache`` builds it ([num_blocks,
  block_size, 1, 584] float8_e4m3fn over padded pages), lse ``(B, H, S_q)`` with ``+inf`` for
  rows without a valid index, ``get_mla_metadata()`` with no arguments;
- errors that name the argument;
- CUDA op against the CPU op within DESIGN §5 (skipped without a GPU), graph replay bitwise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _design_checks import assert_close_design  # noqa: E402 (after the torch skip)

NOPE, ROPE, TILE, TILES = 448, 64, 64, 7
REC, SC, TOK, D = 576, 8, 584, 512
SM_SCALE = D**-0.55
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def page_bytes(page_size: int) -> int:
    return (page_size * TOK + 575) // 576 * 576


# ---- an independent torch model of the layout and the decode ---------------------------------
def model_quantize(x: torch.Tensor):
    """bf16 [T, 512] -> (records uint8 [T, 576], scales uint8 [T, 8]) (FlashMLA quant.py rule)."""
    n = x.shape[0]
    t = x[:, :NOPE].float().view(n, TILES, TILE)
    v = (t.abs().amax(-1) / 448.0).clamp_min(1e-4)
    mant, expo = torch.frexp(v)
    expo = torch.where(mant == 0.5, expo - 1, expo)  # ceil(log2(v))
    s = torch.ldexp(torch.ones_like(v), expo)
    codes = (t / s[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE)
    rec = torch.cat([codes, x[:, NOPE:].contiguous().view(torch.uint8).reshape(n, 2 * ROPE)], dim=1)
    scales = torch.zeros(n, SC, dtype=torch.uint8)
    scales[:, :TILES] = (expo + 127).to(torch.uint8)
    return rec, scales


def model_dequant(pages: torch.Tensor, page_size: int, slots: torch.Tensor) -> torch.Tensor:
    """pages uint8 [num_blocks, >= page_bytes]; slots int64 [N] (valid) -> float64 [N, 512]."""
    b, i = slots // page_size, slots % page_size
    rec = torch.stack([pages[bb, ii * REC : (ii + 1) * REC] for bb, ii in zip(b.tolist(), i.tolist())])
    sc = torch.stack(
        [pages[bb, page_size * REC + ii * SC : page_size * REC + ii * SC + TILES] for bb, ii in zip(b.tolist(), i.tolist())]
    )
    codes = rec[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float().view(-1, TILES, TILE)
    s = torch.ldexp(torch.ones(sc.shape), sc.long() - 127)
    nope = (codes * s[..., None]).reshape(-1, NOPE).to(torch.bfloat16)
    rope = rec[:, NOPE:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], dim=1).double()


class Cache:
    """A MODEL1 cache: pages [num_blocks, stride] (NaN-poisoned bytes 0xff except written slots)
    and the [num_blocks, page_size, 584] view the ops take."""

    def __init__(self, gen, num_blocks: int, page_size: int, live: int, pad: int = 0):
        self.page, self.num_blocks, self.live = page_size, num_blocks, live
        stride = page_bytes(page_size) + pad
        self.pages = torch.full((num_blocks, stride), 0xFF, dtype=torch.uint8)
        x = (torch.randn(live, D, generator=gen) / 10).to(torch.bfloat16)
        rec, sc = model_quantize(x)
        for s in range(live):
            b, i = divmod(s, page_size)
            self.pages[b, i * REC : (i + 1) * REC] = rec[s]
            self.pages[b, page_size * REC + i * SC : page_size * REC + (i + 1) * SC] = sc[s]
        self.view = self.pages.as_strided((num_blocks, page_size, TOK), (stride, TOK, 1))

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.page


def make_indices(gen, B, S, K, cache: Cache, lengths=None, empty_row=None):
    """Valid slots in [0, live), every 9th entry garbage, entries past the length pointing at
    NaN-poisoned (unwritten) slots, one all -1 row."""
    idx = torch.randint(0, cache.live, (B, S, K), generator=gen, dtype=torch.int32)
    garbage = torch.tensor([-1, -7, INT32_MAX, INT32_MIN, cache.num_slots], dtype=torch.int32)
    flat = idx.view(-1)
    pos = torch.arange(4, flat.numel(), 9)
    flat[pos] = garbage[torch.arange(pos.numel()) % 5]
    if lengths is not None and cache.live < cache.num_slots:
        dead = torch.randint(cache.live, cache.num_slots, (B, S, K), generator=gen, dtype=torch.int32)
        past = torch.arange(K)[None, None, :] >= lengths[:, None, None]
        idx = torch.where(past, dead, idx)
    if empty_row is not None:
        idx[empty_row] = -1
    return idx


def ref_decode(q, caches, idxs, lens, sink, sm_scale=SM_SCALE):
    """fp64 reference over the union of the selections (main first): (out [B, S, H, 512], lse)."""
    B, S, H, _ = q.shape
    keys, masks = [], []
    for cache, idx, ln in zip(caches, idxs, lens):
        K = idx.shape[-1]
        valid = (idx >= 0) & (idx < cache.num_slots)
        if ln is not None:
            valid &= torch.arange(K)[None, None, :] < ln[:, None, None]
        safe = torch.where(valid, idx, 0).long().view(-1)
        kv = torch.zeros(safe.numel(), D, dtype=torch.float64)
        v = valid.view(-1)
        if bool(v.any()):
            kv[v] = model_dequant(cache.pages, cache.page, safe[v])
        keys.append(kv.view(B, S, K, D))
        masks.append(valid)
    kv = torch.cat(keys, dim=2)
    valid = torch.cat(masks, dim=2)
    scores = torch.einsum("bshd,bskd->bshk", q.double(), kv) * sm_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isinf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bshk,bskd->bshd", p, kv)  # V = the whole 512-dim key
    if sink is not None:
        out = out / (1 + torch.exp(sink.double()[None, None, :] - lse))[..., None]
    out = torch.where(empty[..., None], torch.zeros((), dtype=torch.float64), out)
    return out, lse


class Case:
    def __init__(self, gen, B=3, S=2, H=64, K=64, page=61, K2=64, page2=2, dyn1=False, dyn2=False,
                 sink=False, pad=0):
        self.B, self.S, self.H = B, S, H
        nb = (2 * K + 40 + page - 1) // page
        self.main = Cache(gen, nb, page, nb * page - 16, pad)
        self.q = torch.randn(B, S, H, D, generator=gen).to(torch.bfloat16)
        pattern1 = [K, 0, 33, 1, K - 1]
        pattern2 = [0, K2, 17, K2 - 1, 64]
        self.tl = torch.tensor([pattern1[b % 5] for b in range(B)], dtype=torch.int32) if dyn1 else None
        self.idx = make_indices(gen, B, S, K, self.main, self.tl, empty_row=(1, 0) if B > 1 else None)
        self.extra = None
        self.idx2 = self.tl2 = None
        if K2 > 0:
            nb2 = (2 * K2 + 40 + page2 - 1) // page2
            self.extra = Cache(gen, nb2, page2, nb2 * page2 - 16)
            self.tl2 = torch.tensor([pattern2[b % 5] for b in range(B)], dtype=torch.int32) if dyn2 else None
            self.idx2 = make_indices(gen, B, S, K2, self.extra, self.tl2, empty_row=(1, 0) if B > 1 else None)
        self.sink = torch.randn(H, generator=gen) if sink else None

    def ref(self):
        caches = [self.main] + ([self.extra] if self.extra is not None else [])
        idxs = [self.idx] + ([self.idx2] if self.extra is not None else [])
        lens = [self.tl] + ([self.tl2] if self.extra is not None else [])
        return ref_decode(self.q, caches, idxs, lens, self.sink)

    def run(self, selkv, device="cpu", graph=False):
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        q, idx, tl, sink = to(self.q), to(self.idx), to(self.tl), to(self.sink)
        cache = to(self.main.pages).as_strided(self.main.view.shape, self.main.view.stride())
        K2 = self.idx2.shape[-1] if self.extra is not None else 0
        xc = xi = xtl = None
        if self.extra is not None:
            xc = to(self.extra.pages).as_strided(self.extra.view.shape, self.extra.view.stride())
            xi, xtl = to(self.idx2), to(self.tl2)
        md = selkv.get_decode_metadata(self.B, self.S, self.H, idx.shape[-1], tl, device=q.device,
                                       extra_topk=K2, extra_topk_length=xtl)
        def call():
            return selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink,
                                           extra_kv_cache=xc, extra_indices=xi, extra_topk_length=xtl)
        if not graph:
            return call()
        out, lse = call()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            selkv.get_decode_metadata(self.B, self.S, self.H, idx.shape[-1], tl, out=md,
                                      extra_topk=K2, extra_topk_length=xtl)
            selkv.sparse_mla_decode(q, cache, idx, md, SM_SCALE, topk_length=tl, attn_sink=sink,
                                    extra_kv_cache=xc, extra_indices=xi, extra_topk_length=xtl,
                                    out=out, lse=lse)
        out.fill_(0)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        return out, lse


# ---- CPU op vs the torch model ------------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("page,page2", [(61, 2), (64, 64), (2, 69)])
@pytest.mark.parametrize("dyn1,dyn2", [(False, False), (True, False), (False, True), (True, True)])
def test_cpu_matches_torch_model(selkv, gen, H, page, page2, dyn1, dyn2):
    c = Case(gen, B=3, S=2, H=H, K=64, page=page, K2=128, page2=page2, dyn1=dyn1, dyn2=dyn2,
             sink=dyn1, pad=16 if page == 61 else 0)
    out, lse = c.run(selkv)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, H, 512)
    assert lse.shape == (3, 2, H)
    ro, rl = c.ref()
    assert_close_design(out, lse, ro, rl, f"H{H} pages {page}/{page2} dyn {dyn1}/{dyn2}")
    assert bool(torch.isinf(lse[1, 0]).all())  # the all-invalid row


def test_cpu_without_extra_cache(selkv, gen):
    for page in (2, 64, 576):
        c = Case(gen, B=2, S=1, H=64, K=64, page=page, K2=0, dyn1=True, sink=True)
        out, lse = c.run(selkv)
        ro, rl = c.ref()
        assert_close_design(out, lse, ro, rl, f"no extra page {page}")


def test_cpu_both_selections_empty(selkv, gen):
    c = Case(gen, B=2, S=2, H=64, K=64, page=64, K2=64, page2=2, dyn1=True, dyn2=True)
    c.tl.zero_()
    c.tl2.zero_()
    out, lse = c.run(selkv)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


# ---- FlashMLA's MODEL1 call ----------------------------------------------------------------------
def flashmla_cache(cache: Cache, device="cpu") -> torch.Tensor:
    """The cache as FlashMLA's quantize_k_cache returns it: float8_e4m3fn [num_blocks,
    block_size, 1, 584] over padded pages."""
    nb = cache.num_blocks
    pages = cache.pages.to(device).view(torch.float8_e4m3fn)
    return pages[:, : cache.page * TOK].view(nb, cache.page, 1, TOK)


@pytest.mark.parametrize("dyn", [False, True])
def test_flash_mla_model1_call(selkv, gen, dyn):
    from selkv import flash_mla

    c = Case(gen, B=3, S=2, H=64, K=128, page=64, K2=64, page2=2, dyn1=dyn, dyn2=dyn, sink=True)
    sched, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        c.q, flashmla_cache(c.main), None, None, 512, sched, None, SM_SCALE, False, True,
        c.idx, c.sink, flashmla_cache(c.extra), c.idx2, c.tl, c.tl2,
    )
    assert out.shape == (3, 2, 64, 512) and lse.shape == (3, 64, 2)
    ro, rl = c.ref()
    # FlashMLA's convention: lse +inf (out 0) for a row without a valid index
    assert bool((lse.transpose(1, 2)[torch.isinf(rl)] == float("inf")).all())
    assert_close_design(out, torch.where(torch.isinf(lse), float("-inf"), lse).transpose(1, 2), ro, rl, "flash_mla")
    # The same object serves another call of the same configuration (e.g. the next layer).
    out2, _ = flash_mla.flash_mla_with_kvcache(
        c.q, flashmla_cache(c.main), None, None, 512, sched, None, SM_SCALE, False, True,
        c.idx, c.sink, flashmla_cache(c.extra), c.idx2, c.tl, c.tl2,
    )
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    # Keyword names as FlashMLA's
    sched2, _ = flash_mla.get_mla_metadata()
    out3, _ = flash_mla.flash_mla_with_kvcache(
        c.q, flashmla_cache(c.main), None, None, 512, sched2, softmax_scale=SM_SCALE, is_fp8_kvcache=True,
        indices=c.idx, attn_sink=c.sink, extra_k_cache=flashmla_cache(c.extra),
        extra_indices_in_kvcache=c.idx2, topk_length=c.tl, extra_topk_length=c.tl2,
    )
    assert torch.equal(out.view(torch.int16), out3.view(torch.int16))


def test_flash_mla_model1_errors(selkv, gen):
    from selkv import flash_mla

    c = Case(gen, B=2, S=1, H=64, K=64, page=64, K2=64, page2=2)
    args = (c.q, flashmla_cache(c.main), None, None, 512)
    with pytest.raises(ValueError, match="extra_k_cache and extra_indices_in_kvcache"):
        flash_mla.flash_mla_with_kvcache(*args, flash_mla.get_mla_metadata()[0], None, SM_SCALE, False, True,
                                         c.idx, None, flashmla_cache(c.extra), None)
    with pytest.raises(ValueError, match="extra_topk_length"):
        flash_mla.flash_mla_with_kvcache(*args, flash_mla.get_mla_metadata()[0], None, SM_SCALE, False, True,
                                         c.idx, None, None, None, None, torch.zeros(2, dtype=torch.int32))


# ---- errors name the argument ---------------------------------------------------------------------
def test_errors_name_the_argument(selkv, gen):
    c = Case(gen, B=2, S=1, H=64, K=64, page=64, K2=64, page2=2)
    q, idx = c.q, c.idx
    md = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu", extra_topk=64)
    xc, xi = c.extra.view, c.idx2
    with pytest.raises(RuntimeError, match="extra_indices"):
        selkv.sparse_mla_decode(q, c.main.view, idx, md, SM_SCALE, extra_kv_cache=xc)
    with pytest.raises(RuntimeError, match="extra_kv_cache"):
        selkv.sparse_mla_decode(q, c.main.view, idx, md, SM_SCALE, extra_indices=xi)
    with pytest.raises(RuntimeError, match="extra_indices"):
        selkv.sparse_mla_decode(q, c.main.view, idx, md, SM_SCALE, extra_kv_cache=xc,
                                extra_indices=xi[:, :, :32].contiguous().view(2, 1, 32).to(torch.int64))
    # a plan without the extra cache
    md0 = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu")
    with pytest.raises(RuntimeError, match="metadata"):
        selkv.sparse_mla_decode(q, c.main.view, idx, md0, SM_SCALE, extra_kv_cache=xc, extra_indices=xi)
    # q of the wrong width for MODEL1
    with pytest.raises(RuntimeError, match="q"):
        selkv.sparse_mla_decode(torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16), c.main.view, idx, md, SM_SCALE,
                                extra_kv_cache=xc, extra_indices=xi)
    # extra_topk not a multiple of 64 (the CPU plan defers shape rules to the call, as for topk)
    md96 = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu", extra_topk=96)
    with pytest.raises(RuntimeError, match="extra_topk"):
        selkv.sparse_mla_decode(q, c.main.view, idx, md96, SM_SCALE, extra_kv_cache=xc,
                                extra_indices=torch.zeros(2, 1, 96, dtype=torch.int32))
    # extra_topk_length without an extra cache
    tl2 = torch.zeros(2, dtype=torch.int32)
    mdx = selkv.get_decode_metadata(2, 1, 64, 64, device="cpu", extra_topk_length=tl2)
    with pytest.raises(RuntimeError, match="extra_topk_length"):
        selkv.sparse_mla_decode(q, c.main.view, idx, mdx, SM_SCALE, extra_topk_length=tl2)
    with pytest.raises(RuntimeError, match="extra_topk_length"):
        selkv.sparse_mla_decode(q, c.main.view, idx, mdx, SM_SCALE)


# ---- CUDA vs CPU --------------------------------------------------------------------------------
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("page,page2", [(61, 2), (256, 64), (2, 576)])
@pytest.mark.parametrize("dyn1,dyn2", [(False, False), (True, True), (False, True)])
def test_cuda_matches_cpu(selkv, cuda_device, gen, H, page, page2, dyn1, dyn2):
    c = Case(gen, B=4, S=2, H=H, K=128, page=page, K2=64 if page2 == 576 else 256, page2=page2,
             dyn1=dyn1, dyn2=dyn2, sink=True)
    out_c, lse_c = c.run(selkv, "cpu")
    out_g, lse_g = c.run(selkv, cuda_device)
    ro, rl = c.ref()
    assert_close_design(out_g, lse_g, ro, rl, f"cuda H{H} {page}/{page2}")
    assert_close_design(out_c, lse_c, ro, rl, f"cpu H{H} {page}/{page2}")


def test_cuda_graph_replay_bitwise(selkv, cuda_device, gen):
    c = Case(gen, B=4, S=2, H=128, K=128, page=64, K2=128, page2=2, dyn1=True, dyn2=True, sink=True)
    out_e, lse_e = c.run(selkv, cuda_device)
    out_g, lse_g = c.run(selkv, cuda_device, graph=True)
    assert torch.equal(out_e.view(torch.int16), out_g.view(torch.int16))
    assert torch.equal(lse_e, lse_g)


def test_cuda_flash_mla_model1(selkv, cuda_device, gen):
    from selkv import flash_mla

    c = Case(gen, B=3, S=2, H=128, K=128, page=256, K2=128, page2=2, dyn1=True, dyn2=True, sink=True)
    dev = cuda_device
    sched, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        c.q.to(dev), flashmla_cache(c.main, dev), None, None, 512, sched, None, SM_SCALE, False, True,
        c.idx.to(dev), c.sink.to(dev), flashmla_cache(c.extra, dev), c.idx2.to(dev), c.tl.to(dev), c.tl2.to(dev),
    )
    ro, rl = c.ref()
    assert_close_design(out, torch.where(torch.isinf(lse), float("-inf"), lse).transpose(1, 2), ro, rl, "cuda flash_mla")
