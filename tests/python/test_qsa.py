"""Tests of the C8 QSA sparse prefill through torch: torch.ops.selkv.qsa_sparse_prefill and
selkv.qsa_sparse_prefill, and its page-4 plan: torch.ops.selkv.qsa_plan / qsa_metadata_size and
selkv.qsa_plan / selkv.qsa_metadata_size.

- CPU op (the C++ oracle) against an independent fp64 torch model written here, over fp16 / bf16,
  D 128 / 256, page sizes 16 / 784, GQA groups, both selection forms (expanded == compact),
  interleaved == separate caches, stale positions, bad request ids, bad block-table entries and
  NaN in every cache slot outside the selection (must not leak);
- empty rows give 0 / -inf exactly; a NaN in q of a row with entries gives NaN;
- errors name the op and the argument; opcheck on the CPU op;
- CUDA (skips without a GPU): the CUDA op against the CPU op and the model, every form and layout
  giving the same bits, GQA groups, force_simple, the out variant, CUDA-graph replay, errors.
- plan (CPU): the size formula, the CPU op's bytes against an independent model of the group plan
  of src/qsa/qsa_group_layout.h (header, group table, blocks in request / logical order, row
  membership words, bad rows, zeros elsewhere), deterministic whatever the buffer held, expanded == compact, out with a plan == out
  without, wrong size / dtype / rank / device errors naming metadata, Meta, opcheck;
  (CUDA, skips without a GPU): the GPU plan == the CPU plan byte for byte, out with the plan ==
  out without (also at R = 4096, where the page-4 route is wanted), plan + attention under a graph.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

INF = float("inf")
NAN = float("nan")
OP = "selkv::qsa_sparse_prefill"


# ---- independent fp64 model ---------------------------------------------------------------------
def row_tokens_compact(ids, count, pos):
    """Logical tokens of a compact row: the first clamp(count, 0, K) blocks, then the partial block."""
    k = ids.numel()
    n = min(max(int(count), 0), k)
    toks = []
    for b in ids[:n].tolist():
        toks += [4 * b + i for i in range(4)]
    start = 4 * ((pos + 1) // 4)
    toks += list(range(start, pos + 1)) if pos >= 0 else []
    return toks


def valid_slot(t, req, seq_lens, table, num_pages, page_size):
    """(page, slot) of logical token t of request req, or None when the entry is invalid."""
    num_req, width = table.shape
    if not (0 <= req < num_req) or t < 0 or t >= int(seq_lens[req]) or t // page_size >= width:
        return None
    pg = int(table[req, t // page_size])
    if not (0 <= pg < num_pages):
        return None
    return pg, t % page_size


def model(q, k_cache, v_cache, table, seq_lens, req_ids, positions, rows_tokens, scale):
    """fp64 reference: q [R, Hq, D], caches [pages, P, Hkv, D]; rows_tokens[r] the row's listed
    logical tokens in order. Returns (out fp64 [R, Hq, D], lse fp64 [R, Hq], used (page, slot) set)."""
    R, Hq, D = q.shape
    pages, P, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    out = torch.zeros((R, Hq, D), dtype=torch.float64)
    lse = torch.full((R, Hq), -INF, dtype=torch.float64)
    used = set()
    for r in range(R):
        req = int(req_ids[r])
        ents = [valid_slot(t, req, seq_lens, table, pages, P) for t in rows_tokens[r]]
        ents = [e for e in ents if e is not None]
        if not ents:
            continue
        used.update(ents)
        pg = torch.tensor([e[0] for e in ents])
        sl = torch.tensor([e[1] for e in ents])
        kk = k_cache[pg, sl].double()  # [n, Hkv, D]
        vv = v_cache[pg, sl].double()
        for h in range(Hq):
            s = scale * (kk[:, h // group] @ q[r, h].double())
            m = s.max()
            w = torch.exp(s - m)
            out[r, h] = (w[:, None] * vv[:, h // group]).sum(0) / w.sum()
            lse[r, h] = m + torch.log(w.sum())
    return out, lse, used


# ---- problems ----------------------------------------------------------------------------------
def make_problem(gen, dtype, D, P, Hq=4, Hkv=2, R=9, num_req=3, pages=None, width=None, K=6):
    """A problem exercising every invalid-entry rule; returns a dict of CPU tensors.

    Request 0 has stale positions past its live length, request 2 a block table with -1 and
    out-of-range pages; rows include bad request ids (-1, num_req); counts include <= 0 and > K."""
    pages = pages if pages is not None else (4 if P <= 64 else 3)
    width = width if width is not None else (6 if P <= 64 else 2)
    cap = width * P
    table = torch.randint(0, pages, (num_req, width), generator=gen, dtype=torch.int32)
    table[2, 0] = -1
    if width > 1:
        table[2, 1] = pages  # out of range
    seq_lens = torch.randint(cap // 2, cap + 1, (num_req,), generator=gen, dtype=torch.int32)
    seq_lens[0] = max(8, int(seq_lens[0]) // 3)
    req_ids = torch.randint(0, num_req, (R,), generator=gen, dtype=torch.int32)
    req_ids[1] = -1
    req_ids[2] = num_req
    positions = torch.empty(R, dtype=torch.int32)
    for r in range(R):
        req = int(req_ids[r])
        hi = int(seq_lens[req]) if 0 <= req < num_req else cap
        positions[r] = int(torch.randint(0, hi, (1,), generator=gen))
    positions[0] = cap + 5  # stale: past every live length (its blocks too)
    req_ids[3] = 0
    positions[3] = int(seq_lens[0]) + 6  # stale position of request 0, partial block invalid
    counts = torch.randint(1, K + 1, (R,), generator=gen, dtype=torch.int32)
    counts[4] = 0
    counts[5] = K + 3  # clamped to K
    counts[6] = -2
    ids = torch.empty((R, K), dtype=torch.int32)
    for r in range(R):
        # causal blocks mostly, some past the position / live length (stale), duplicates allowed
        hi = max(1, (int(positions[r]) + 1) // 4 + 3)
        ids[r] = torch.randint(0, hi, (K,), generator=gen, dtype=torch.int32)
    ids[7, -1] = 10**6  # far out of range (past the count for most rows; still invalid otherwise)
    # the last row is clean (a live position of request 1, K distinct causal blocks), so that every
    # problem has a row with blocks whatever the draws above (duplicates make a row bad)
    last = R - 1
    req_ids[last] = 1
    positions[last] = int(seq_lens[1]) - 1
    counts[last] = K
    ids[last] = torch.randperm((int(positions[last]) + 1) // 4, generator=gen, dtype=torch.int32)[:K]

    rows_tokens = [row_tokens_compact(ids[r], counts[r], int(positions[r])) for r in range(R)]
    cols = 4 * K + 3
    selection = torch.full((R, cols), -1, dtype=torch.int32)
    for r, toks in enumerate(rows_tokens):
        selection[r, : len(toks)] = torch.tensor(toks, dtype=torch.int32)

    # DESIGN §5's calibrated data (FlashMLA's: q ~ randn, KV ~ randn / 10, scale D^-0.55), where its
    # per-element tolerances apply.
    q = torch.randn((R, Hq, D), generator=gen).to(dtype)
    kv = (torch.randn((pages, 2, P, Hkv, D), generator=gen) * 0.1).to(dtype)
    scale = D**-0.55
    # NaN in every cache slot no valid entry reads: it must never leak.
    _, _, used = model(q, kv[:, 0], kv[:, 1], table, seq_lens, req_ids, positions, rows_tokens, scale)
    mask = torch.ones((pages, P), dtype=torch.bool)
    for pg, sl in used:
        mask[pg, sl] = False
    kv[:, 0][mask] = NAN
    kv[:, 1][mask] = NAN
    return dict(q=q, kv=kv, table=table, seq_lens=seq_lens, req_ids=req_ids, positions=positions,
                selection=selection, ids=ids, counts=counts, rows_tokens=rows_tokens, scale=scale,
                used=used)


def run_op(selkv, pb, form="expanded", interleaved=True, return_lse=True, **kw):
    kv = pb["kv"]
    if interleaved:
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = kv[:, 0].contiguous(), kv[:, 1].contiguous()
    sel = dict(selection=pb["selection"]) if form == "expanded" else dict(block_ids=pb["ids"], block_counts=pb["counts"])
    return selkv.qsa_sparse_prefill(
        pb["q"], k, v, pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"],
        scale=pb["scale"], return_lse=return_lse, **sel, **kw,
    )


def check_against_model(pb, out, lse):
    kv = pb["kv"]
    ref_out, ref_lse, _ = model(pb["q"], kv[:, 0], kv[:, 1], pb["table"], pb["seq_lens"], pb["req_ids"],
                                pb["positions"], pb["rows_tokens"], pb["scale"])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    empty = ref_lse == -INF
    assert torch.equal(lse == -INF, empty)
    assert (out.float()[empty] == 0).all()
    # DESIGN §5 on its calibrated data: every element within 1e-3 or 2.01 / 128 relative of the model
    # rounded to the output type, cosine distance < 5e-6.
    o, r = out.double(), ref_out.to(out.dtype).double()
    live = ~empty
    err = (o - r).abs()
    ok = (err < 1e-3) | (err < 2.01 / 128 * r.abs())
    assert ok[live].all(), f"out: {(~ok[live]).sum().item()} elements off, max err {err[live].max().item()}"
    xy, xx, yy = (o * r).sum(), (o * o).sum(), (r * r).sum()
    if xx + yy > 0:
        assert (1 - 2 * xy / (xx + yy)).item() < 5e-6, "cosine distance"
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


# ---- CPU op against the model ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [128, 256])
@pytest.mark.parametrize("P", [16, 784])
def test_cpu_matches_model(selkv, gen, dtype, D, P):
    pb = make_problem(gen, dtype, D, P)
    assert len(pb["used"]) > 0
    out, lse = run_op(selkv, pb, "expanded", interleaved=True)
    check_against_model(pb, out, lse)
    # every row kind is present: some empty (bad req / stale), some live
    assert (lse == -INF).all(1)[[1, 2]].all()
    assert (lse > -INF).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("P", [16, 784])
def test_forms_and_layouts_agree(selkv, gen, dtype, P):
    pb = make_problem(gen, dtype, 128, P, Hq=8, Hkv=1)
    ref_out, ref_lse = run_op(selkv, pb, "expanded", interleaved=True)
    for form in ("expanded", "compact"):
        for interleaved in (True, False):
            out, lse = run_op(selkv, pb, form, interleaved=interleaved)
            assert torch.equal(out, ref_out), (form, interleaved)
            assert torch.equal(lse, ref_lse), (form, interleaved)
    check_against_model(pb, ref_out, ref_lse)


def test_gqa_groups_and_out_variant(selkv, gen):
    for hq, hkv in ((1, 1), (8, 8), (16, 2), (6, 3)):
        pb = make_problem(gen, torch.bfloat16, 128, 16, Hq=hq, Hkv=hkv)
        out = torch.full_like(pb["q"], 7.0)
        got = run_op(selkv, pb, "compact", return_lse=False, out=out)
        assert got is out
        _, lse = run_op(selkv, pb, "compact")
        check_against_model(pb, out, lse)


def test_strided_q_out_and_padded_pages(selkv, gen):
    pb = make_problem(gen, torch.float16, 128, 16)
    ref_out, ref_lse = run_op(selkv, pb)
    R, Hq, D = pb["q"].shape
    qbig = torch.zeros((R, Hq + 2, D), dtype=pb["q"].dtype)
    qbig[:, 1 : Hq + 1] = pb["q"]
    kv = pb["kv"]
    big = torch.full((kv.shape[0], 3, *kv.shape[2:]), NAN, dtype=kv.dtype)  # pages padded by 1 slab
    big[:, :2] = kv
    obig = torch.zeros((R, Hq + 1, D), dtype=pb["q"].dtype)
    lsebig = torch.zeros((Hq, R), dtype=torch.float32)
    torch.ops.selkv.qsa_sparse_prefill(
        qbig[:, 1 : Hq + 1], big[:, 0], big[:, 1], pb["table"], pb["seq_lens"], pb["req_ids"],
        pb["positions"], pb["selection"], None, None, pb["scale"], False, obig[:, :Hq], lsebig.t())
    assert torch.equal(obig[:, :Hq], ref_out)
    assert torch.equal(lsebig.t(), ref_lse)


def test_default_scale(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 256, 16)
    pb["scale"] = 1.0 / math.sqrt(256)
    a = run_op(selkv, pb, return_lse=False)
    sel = pb["selection"]
    b = selkv.qsa_sparse_prefill(pb["q"], pb["kv"][:, 0], pb["kv"][:, 1], pb["table"], pb["seq_lens"],
                                 pb["req_ids"], pb["positions"], selection=sel)
    assert torch.equal(a, b)


def test_nan_in_q_of_live_row(selkv, gen):
    pb = make_problem(gen, torch.float16, 128, 16)
    _, lse0 = run_op(selkv, pb)
    live = [r for r in range(lse0.shape[0]) if (lse0[r] > -INF).all()]
    dead = [r for r in range(lse0.shape[0]) if (lse0[r] == -INF).all()]
    assert live and dead
    pb["q"][live[0], 0, 3] = NAN
    pb["q"][dead[0], 0, 3] = NAN
    out, lse = run_op(selkv, pb)
    assert torch.isnan(out[live[0], 0]).all() and torch.isnan(lse[live[0], 0])
    assert not torch.isnan(out[live[0], 1:]).any()
    assert (out[dead[0]] == 0).all() and (lse[dead[0]] == -INF).all()  # empty stays 0 / -inf


def test_hand_case(selkv):
    """One row, two tokens with known scores: out and lse by hand."""
    D = 128
    q = torch.zeros((1, 1, D), dtype=torch.float16)
    q[0, 0, 0] = 1.0
    k = torch.zeros((1, 16, 1, D), dtype=torch.float16)
    v = torch.zeros((1, 16, 1, D), dtype=torch.float16)
    k[0, 0, 0, 0] = 1.0  # score 1
    k[0, 1, 0, 0] = 0.0  # score 0
    v[0, 0, 0, :] = 1.0
    v[0, 1, 0, :] = -1.0
    sel = torch.full((1, 7), -1, dtype=torch.int32)
    sel[0, 0], sel[0, 1] = 0, 1
    out, lse = selkv.qsa_sparse_prefill(
        q, k, v, torch.zeros((1, 1), dtype=torch.int32), torch.tensor([16], dtype=torch.int32),
        torch.tensor([0], dtype=torch.int32), torch.tensor([15], dtype=torch.int32),
        selection=sel, scale=1.0, return_lse=True)
    e = math.e
    assert out[0, 0, 5].item() == pytest.approx((e - 1) / (e + 1), abs=1e-3)
    assert lse.item() == pytest.approx(math.log(e + 1), rel=1e-6)


def test_zero_rows(selkv):
    q = torch.empty((0, 2, 128), dtype=torch.bfloat16)
    kv = torch.zeros((1, 16, 1, 128), dtype=torch.bfloat16)
    i0 = torch.empty(0, dtype=torch.int32)
    out, lse = selkv.qsa_sparse_prefill(q, kv, kv, torch.zeros((1, 1), dtype=torch.int32),
                                        torch.zeros(1, dtype=torch.int32), i0, i0,
                                        selection=torch.empty((0, 7), dtype=torch.int32), return_lse=True)
    assert out.shape == (0, 2, 128) and lse.shape == (0, 2)


def test_model_sanity():
    """The model's validity rule on hand-picked entries."""
    table = torch.tensor([[1, -1, 5]], dtype=torch.int32)
    lens = torch.tensor([40], dtype=torch.int32)
    assert valid_slot(3, 0, lens, table, 4, 16) == (1, 3)
    assert valid_slot(17, 0, lens, table, 4, 16) is None  # page -1
    assert valid_slot(33, 0, lens, table, 4, 16) is None  # page 5 >= num_pages
    assert valid_slot(48, 0, lens, table, 8, 16) is None  # past the live length
    assert valid_slot(-1, 0, lens, table, 4, 16) is None
    assert valid_slot(3, 1, lens, table, 4, 16) is None  # bad request
    assert row_tokens_compact(torch.tensor([2, 0]), 1, 9) == [8, 9, 10, 11, 8, 9]
    assert row_tokens_compact(torch.tensor([2, 0]), 5, 2) == [8, 9, 10, 11, 0, 1, 2, 3, 0, 1, 2]


# ---- errors, opcheck -----------------------------------------------------------------------------
def _args(dtype=torch.bfloat16, D=128, P=16, Hq=2, Hkv=1, R=3, K=2):
    q = torch.randn((R, Hq, D)).to(dtype)
    kv = torch.randn((2, 2, P, Hkv, D)).to(dtype)
    return dict(
        q=q, k_cache=kv[:, 0], v_cache=kv[:, 1], block_table=torch.zeros((1, 2), dtype=torch.int32),
        seq_lens=torch.tensor([P], dtype=torch.int32), req_ids=torch.zeros(R, dtype=torch.int32),
        positions=torch.arange(R, dtype=torch.int32),
        selection=torch.full((R, 4 * K + 3), -1, dtype=torch.int32), block_ids=None, block_counts=None,
        scale=0.1, force_simple=False, out=torch.empty_like(q), lse=torch.empty((R, Hq)),
    )


def _call(a):
    torch.ops.selkv.qsa_sparse_prefill(*a.values())


@pytest.mark.parametrize(
    "change, pattern",
    [
        (dict(q=lambda a: a["q"].float()), r"q: expected dtype Half or BFloat16"),
        (dict(k_cache=lambda a: a["k_cache"].half()), r"k_cache: expected dtype BFloat16"),
        (dict(v_cache=lambda a: a["v_cache"][:, :8]), r"v_cache: expected size 16 in dim 1"),
        (dict(k_cache=lambda a: a["k_cache"][..., :64]), r"k_cache: expected size 128 in dim 3"),
        (dict(block_table=lambda a: a["block_table"].long()), r"block_table: expected dtype Int"),
        (dict(seq_lens=lambda a: torch.zeros(2, dtype=torch.int32)), r"seq_lens: expected size 1 in dim 0"),
        (dict(req_ids=lambda a: a["req_ids"][:2]), r"req_ids: expected size 3"),
        (dict(positions=lambda a: a["positions"].float()), r"positions: expected dtype Int"),
        (dict(selection=lambda a: a["selection"][:, :8]), r"selection: expected 4K \+ 3 columns"),
        (dict(block_ids=lambda a: torch.zeros((3, 2), dtype=torch.int32),
              block_counts=lambda a: torch.zeros(3, dtype=torch.int32)), r"selection, block_ids: expected exactly one"),
        (dict(selection=lambda a: None), r"selection, block_ids: expected exactly one"),
        (dict(selection=lambda a: None, block_ids=lambda a: torch.zeros((3, 2), dtype=torch.int32)),
         r"block_counts: expected together with block_ids"),
        (dict(out=lambda a: torch.empty((3, 2, 128), dtype=torch.float16)), r"out: expected dtype BFloat16"),
        (dict(lse=lambda a: torch.empty((3, 3))), r"lse: expected size 2 in dim 1"),
        (dict(scale=lambda a: -1.0), r"scale: must be finite and > 0"),
        (dict(q=lambda a: a["q"][..., :64].contiguous(), out=lambda a: a["out"][..., :64].contiguous(),
              k_cache=lambda a: a["k_cache"][..., :64], v_cache=lambda a: a["v_cache"][..., :64]), r"head_dim"),
        (dict(k_cache=lambda a: a["k_cache"][:, :6], v_cache=lambda a: a["v_cache"][:, :6]), r"page_size"),
        (dict(out=lambda a: a["q"]), r"out: .*q"),
    ],
)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_errors_name_argument(selkv, change, pattern, device):
    a = _args()
    for name, f in change.items():
        a[name] = f(a)
    if device == "meta":
        if pattern.startswith("out: .*q"):
            pytest.skip("overlap needs real addresses (meta tensors have none)")
        a = {n: (t.to("meta") if isinstance(t, torch.Tensor) else t) for n, t in a.items()}
    with pytest.raises(RuntimeError, match=OP + ": " + pattern):
        _call(a)


def test_wrapper_errors(selkv):
    a = _args()
    with pytest.raises(RuntimeError, match=OP + r": k_cache: expected a 4-d tensor"):
        selkv.qsa_sparse_prefill(a["q"], a["k_cache"][0], a["v_cache"], a["block_table"], a["seq_lens"],
                                 a["req_ids"], a["positions"], selection=a["selection"])
    with pytest.raises(RuntimeError, match=OP + r": (out|req_ids): expected a (CPU|META) tensor, got one on"):
        selkv.qsa_sparse_prefill(a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"],
                                 a["req_ids"].to("meta"), a["positions"], selection=a["selection"])


def test_meta_shapes(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    m = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in pb.items()}
    out, lse = run_op(selkv, m, "compact")
    assert out.device.type == "meta" and out.shape == pb["q"].shape and lse.shape == pb["q"].shape[:2]


def test_opcheck(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    kv = pb["kv"]
    q = pb["q"]
    base = (q, kv[:, 0], kv[:, 1], pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2])
    torch.library.opcheck(torch.ops.selkv.qsa_sparse_prefill.default,
                          (*base, pb["selection"], None, None, pb["scale"], False, out, lse))
    torch.library.opcheck(torch.ops.selkv.qsa_sparse_prefill.default,
                          (*base, None, pb["ids"], pb["counts"], pb["scale"], True, out, None))


# ---- page-4 plan: independent model of src/qsa/qsa_group_layout.h ------------------------------
GROUP_MAGIC = 0x47534134


def plan_size_model(R, K):
    if R <= 0 or R >= 2**31 or K < 1 or K > 512:
        return 0
    C = K + 1
    return 4 * ((8 + 4 * R + 2 * R * C + 3) // 4 * 4 + 4 * R * C)


def rows_per_group(Hq, Hkv):
    """The page-4 route's grouping: 64 (row, head) pairs a CTA, at most 32 rows."""
    return min(64 // (Hq // Hkv), 32)


def row_groups(pb, r, form):
    """The row's groups of logical tokens: compact, each of the first clamp(count, 0, K) blocks then
    the partial block; expanded, the 4-column groups (the last one 3 columns)."""
    pos = int(pb["positions"][r])
    if form == "compact":
        ids, K = pb["ids"][r], pb["ids"].shape[1]
        n = min(max(int(pb["counts"][r]), 0), K)
        groups = [[4 * b + i for i in range(4)] for b in ids[:n].tolist()]
        return groups + [list(range(4 * ((pos + 1) // 4), pos + 1))]
    sel = pb["selection"][r].tolist()
    return [sel[c : c + 4] for c in range(0, len(sel), 4)]


def row_blocks(pb, r, form, num_pages, P):
    """{logical block: token mask} of the row's valid tokens, or None for a bad row (a group with
    valid tokens of two blocks or a token twice, or a block in two groups)."""
    req = int(pb["req_ids"][r])
    blocks = {}
    for grp in row_groups(pb, r, form):
        mask, block = 0, None
        for t in grp:
            if valid_slot(t, req, pb["seq_lens"], pb["table"], num_pages, P) is None:
                continue
            bit = 1 << (t % 4)
            if mask and (t // 4 != block or mask & bit):
                return None
            block, mask = t // 4, mask | bit
        if mask:
            if block in blocks:
                return None
            blocks[block] = mask
    return blocks


def plan_model(pb, form, num_pages, P, Hq, Hkv):
    """int32 words of the plan of pb's selection (form 'expanded' or 'compact')."""
    R = pb["req_ids"].shape[0]
    K = pb["ids"].shape[1] if form == "compact" else (pb["selection"].shape[1] - 3) // 4
    C, rpg = K + 1, rows_per_group(Hq, Hkv)
    groups = (R + rpg - 1) // rpg
    blocks_at = 8 + 4 * R
    words_at = (blocks_at + 2 * R * C + 3) // 4 * 4
    w = [0] * (plan_size_model(R, K) // 4)
    w[:8] = [GROUP_MAGIC, R, K, rpg, groups, 0, 0, 0]
    num_req = pb["table"].shape[0]
    for g in range(groups):
        rows = list(range(g * rpg, min(R, (g + 1) * rpg)))
        per_row = [row_blocks(pb, r, form, num_pages, P) for r in rows]
        bad = sum(1 << j for j, b in enumerate(per_row) if b is None)
        reqs = []
        for r in rows:  # valid requests in order of first appearance among the group's rows
            q = int(pb["req_ids"][r])
            if 0 <= q < num_req and q not in reqs:
                reqs.append(q)
        first, n, uses = g * rpg * C, 0, 0
        for q in reqs:
            union = {}
            for j, r in enumerate(rows):
                if per_row[j] is None or int(pb["req_ids"][r]) != q:
                    continue
                for b, mask in per_row[j].items():
                    tw = union.setdefault(b, [0, 0, 0, 0])
                    for i in range(4):
                        if mask >> i & 1:
                            tw[i] |= 1 << j
            for b in sorted(union):
                t = 4 * b
                k = first + n
                w[blocks_at + 2 * k], w[blocks_at + 2 * k + 1] = int(pb["table"][q, t // P]), t % P
                w[words_at + 4 * k : words_at + 4 * k + 4] = [x - (1 << 32) if x >= 1 << 31 else x for x in union[b]]
                uses += bin(union[b][0] | union[b][1] | union[b][2] | union[b][3]).count("1")
                n += 1
        if n > 0 and 4 * uses < 7 * n:  # too little sharing: the fix-up pass takes every row (kGroupSharingNum / Den)
            for k in range(first, first + n):
                w[blocks_at + 2 * k : blocks_at + 2 * k + 2] = [0, 0]
                w[words_at + 4 * k : words_at + 4 * k + 4] = [0, 0, 0, 0]
            n, bad = 0, (1 << len(rows)) - 1
        w[8 + 4 * g : 8 + 4 * g + 4] = [first, n, bad - (1 << 32) if bad >= 1 << 31 else bad, 0]
    return torch.tensor(w, dtype=torch.int32)


def plan_args(pb, form):
    sel = dict(selection=pb["selection"]) if form == "expanded" else dict(block_ids=pb["ids"], block_counts=pb["counts"])
    kv = pb["kv"]
    return dict(**sel, num_q_heads=pb["q"].shape[1], num_kv_heads=kv.shape[3], head_dim=pb["q"].shape[2],
                num_pages=kv.shape[0], page_size=kv.shape[2])


def make_plan(selkv, pb, form="expanded", **kw):
    return selkv.qsa_plan(pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"], **plan_args(pb, form), **kw)


def test_plan_size(selkv):
    for R, K in ((1, 1), (3, 2), (4, 6), (5, 512), (9, 7), (4096, 512), (0, 4), (-1, 4), (5, 0), (5, 513)):
        want = plan_size_model(R, K)
        assert selkv.qsa_metadata_size(R, K) == want, (R, K)
        assert torch.ops.selkv.qsa_metadata_size(R, K) == want, (R, K)
    assert selkv.qsa_metadata_size(5, 512) == 15420 * 4  # tests/cpp/test_qsa_checks.cpp


def test_page4_wanted(selkv, monkeypatch):
    """The route rule's shape form (selkv::qsa_page4_wanted): R >= 4096 and K >= 384 ask for the
    page-4 route (a plan worth building), anything less does not, nor anything with
    SELKV_QSA_PAGE4=0."""
    monkeypatch.delenv("SELKV_QSA_PAGE4", raising=False)
    for R, K, want in ((4096, 512, True), (4096, 384, True), (1 << 20, 384, True), (4095, 512, False),
                       (4096, 383, False), (4096, 256, False), (0, 512, False), (-1, 512, False)):
        assert selkv.qsa_page4_wanted(R, K) is want, (R, K)
        assert torch.ops.selkv.qsa_page4_wanted(R, K) is want, (R, K)
    monkeypatch.setenv("SELKV_QSA_PAGE4", "0")
    assert selkv.qsa_page4_wanted(4096, 512) is False
    monkeypatch.setenv("SELKV_QSA_PAGE4", "1")
    assert selkv.qsa_page4_wanted(4096, 512) is True


@pytest.mark.parametrize("P", [16, 784])
@pytest.mark.parametrize("form", ["expanded", "compact"])
def test_cpu_plan_matches_model(selkv, gen, P, form):
    pb = make_problem(gen, torch.bfloat16, 128, P, Hq=8, Hkv=2, R=16)
    # Rows 9-14 repeat the clean last row (7 rows x its K distinct blocks), so the one group of 16
    # rows shares enough to be listed (qsa_plan hands a group that shares too little to the fix-up).
    for key in ("req_ids", "positions", "counts", "ids", "selection"):
        pb[key][9:15] = pb[key][15]
    R, K = pb["ids"].shape
    md = make_plan(selkv, pb, form)
    assert md.dtype == torch.uint8 and md.shape == (selkv.qsa_metadata_size(R, K),)
    words = md.view(torch.int32)
    rpg = rows_per_group(8, 2)
    assert words[:8].tolist() == [GROUP_MAGIC, R, K, rpg, (R + rpg - 1) // rpg, 0, 0, 0]
    want = plan_model(pb, form, pb["kv"].shape[0], P, 8, 2)
    assert torch.equal(words, want)
    assert (words[8 + 1 :: 4][: (R + rpg - 1) // rpg] > 0).any()  # some group holds blocks
    # deterministic, and every byte written whatever the buffer held
    junk = torch.full_like(md, 0xAB)
    assert make_plan(selkv, pb, form, metadata=junk) is junk
    assert torch.equal(junk, md)
    # a larger buffer: the plan's bytes, the rest untouched
    big = torch.full((md.numel() + 32,), 7, dtype=torch.uint8)
    make_plan(selkv, pb, form, metadata=big)
    assert torch.equal(big[: md.numel()], md) and (big[md.numel() :] == 7).all()


def test_cpu_plan_forms_agree(selkv, gen):
    """make_problem's expanded selection lists the compact one's blocks at 4-aligned columns: the
    same groups, so the same plan."""
    pb = make_problem(gen, torch.float16, 256, 16)
    assert torch.equal(make_plan(selkv, pb, "expanded"), make_plan(selkv, pb, "compact"))


def test_cpu_plan_irregular_rows(selkv):
    """Expanded groups that are not one block's distinct tokens make the row bad (its bit in the
    group's bad mask, no token bits); the other rows keep their blocks."""
    P, K = 16, 2
    sel = torch.full((5, 4 * K + 3), -1, dtype=torch.int32)
    sel[0, :4] = torch.tensor([8, 9, 10, 11])   # block 2: regular
    sel[0, 4:6] = torch.tensor([0, 1])          # block 0, partial group: regular
    sel[1, :4] = torch.tensor([2, 3, 4, 5])     # blocks 0 and 1 in one group
    sel[2, :2] = torch.tensor([5, 5])           # a repeated token
    sel[3, :4] = torch.tensor([-1, 40, 41, -1])  # block 10, past the live length: dropped
    sel[4] = sel[0]                             # row 0's blocks again: the group shares enough to be listed
    pb = dict(selection=sel, table=torch.tensor([[1, 0, 2]], dtype=torch.int32),
              seq_lens=torch.tensor([24], dtype=torch.int32), req_ids=torch.zeros(5, dtype=torch.int32),
              positions=torch.tensor([9, 9, 9, 9, 9], dtype=torch.int32),
              q=torch.empty((5, 2, 128)), kv=torch.empty((3, 2, P, 1, 128)))
    md = make_plan(selkv, pb, "expanded")
    words = md.view(torch.int32)
    assert torch.equal(words, plan_model(pb, "expanded", 3, P, 2, 1))
    R, K = 5, 2
    assert words[8:12].tolist() == [0, 2, 0b00110, 0]  # group 0 (all 5 rows): 2 blocks, rows 1 and 2 bad
    blocks_at = 8 + 4 * R
    words_at = (blocks_at + 2 * R * (K + 1) + 3) // 4 * 4
    # row 0's blocks 0 and 2 (its causal partial block, position 9, after block 0), page 1 (table[0, 0])
    assert words[blocks_at : blocks_at + 4].tolist() == [1, 0, 1, 8]
    assert words[words_at : words_at + 8].tolist() == [17, 17, 0, 0, 17, 17, 17, 17]  # rows 0 and 4
    assert (words[words_at + 8 :] == 0).all()


@pytest.mark.parametrize("form", ["expanded", "compact"])
def test_cpu_out_with_plan_equals_without(selkv, gen, form):
    pb = make_problem(gen, torch.bfloat16, 128, 16, Hq=4, Hkv=1)
    ref_out, ref_lse = run_op(selkv, pb, form)
    md = make_plan(selkv, pb, form)
    out, lse = run_op(selkv, pb, form, metadata=md)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    big = torch.zeros(md.numel() + 16, dtype=torch.uint8)  # larger than needed is accepted
    out, lse = run_op(selkv, pb, form, metadata=big)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


PLAN_OP = "selkv::qsa_plan"


def test_workspace_size_and_errors_name_workspace(selkv, gen):
    assert selkv.qsa_workspace_size(256) > selkv.qsa_workspace_size(128) > 0
    assert selkv.qsa_workspace_size(64) == 0
    assert torch.ops.selkv.qsa_workspace_size(256) == selkv.qsa_workspace_size(256)
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    dev = pb["q"].device
    need = selkv.qsa_workspace_size(128)
    ws = torch.empty(need, dtype=torch.uint8, device=dev)
    ref_out, ref_lse = run_op(selkv, pb)
    out, lse = run_op(selkv, pb, workspace=ws)  # no plan: the simple kernel, the workspace unused
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for bad, pattern in (
        (ws[: need - 1], rf"workspace_bytes: needs {need} bytes \(qsa_workspace_size\(128\)\), got {need - 1}"),
        (ws.view(torch.int32), r"workspace: expected dtype Byte"),
        (ws.view(1, -1), r"workspace: expected a 1-d tensor"),
        (ws[:0], r"workspace: expected qsa_workspace_size"),
    ):
        with pytest.raises(RuntimeError, match=OP + ": " + pattern):
            run_op(selkv, pb, workspace=bad)


def test_plan_errors_name_metadata(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    R, K = pb["ids"].shape
    need = selkv.qsa_metadata_size(R, K)
    md = make_plan(selkv, pb)
    short = md[: need - 1]
    # prefill: a plan of the wrong size, dtype, rank, an empty one
    for bad, pattern in (
        (short, rf"metadata_bytes: needs {need} bytes \(qsa_metadata_size\({R}, {K}\)\), got {need - 1}"),
        (md.view(torch.int32), r"metadata: expected dtype Byte"),
        (md.view(1, -1), r"metadata: expected a 1-d tensor"),
        (md[::2], r"metadata: expected a contiguous tensor"),
        (md[:0], r"metadata: expected the plan of qsa_plan"),
        (md.to("meta"), r"(out|metadata): expected a (CPU|META) tensor"),  # dispatched to Meta
    ):
        with pytest.raises(RuntimeError, match=OP + ": " + pattern):
            run_op(selkv, pb, metadata=bad)
    # plan: the same rules on the output buffer
    for bad, pattern in (
        (short, rf"metadata_bytes: needs {need} bytes"),
        (md[:0], rf"metadata_bytes: needs {need} bytes"),
        (md.view(torch.int32), r"metadata: expected dtype Byte"),
        (md.view(1, -1), r"metadata: expected a 1-d tensor"),
        (md.to("meta"), r"(metadata|block_table): expected a (CPU|META) tensor"),
    ):
        with pytest.raises(RuntimeError, match=PLAN_OP + ": " + pattern):
            make_plan(selkv, pb, metadata=bad)
    # the plan's other arguments: the tensor checks and the C++ rules, named
    with pytest.raises(RuntimeError, match=PLAN_OP + r": selection, block_ids: expected exactly one"):
        selkv.qsa_plan(pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"], num_q_heads=8,
                       num_kv_heads=2, head_dim=128, num_pages=4, page_size=16)
    for change, pattern in ((dict(head_dim=96), r"head_dim: must be 128 or 256"),
                            (dict(page_size=6), r"page_size: must be a positive multiple of 4"),
                            (dict(num_kv_heads=3), r"num_kv_heads: must divide num_q_heads"),
                            (dict(num_pages=-1), r"num_pages: must be >= 0")):
        kw = {**plan_args(pb, "expanded"), **change}
        with pytest.raises(RuntimeError, match=PLAN_OP + ": " + pattern):
            selkv.qsa_plan(pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"], **kw)
    with pytest.raises(RuntimeError, match=PLAN_OP + r": positions: expected size"):
        selkv.qsa_plan(pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"][:2], **plan_args(pb, "expanded"))
    # the plan must not overlap its inputs
    cols = pb["selection"].shape[1]
    buf = torch.zeros(R * cols + need // 4, dtype=torch.int32)
    sel = buf[: R * cols].view(R, cols)
    sel.copy_(pb["selection"])
    with pytest.raises(RuntimeError, match=PLAN_OP + r": metadata: overlaps selection"):
        selkv.qsa_plan(pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"],
                       **{**plan_args(pb, "expanded"), "selection": sel}, metadata=buf.view(torch.uint8)[:need])
    # ... nor the attention's outputs
    q = pb["q"]
    out = torch.empty(need // 2 + q.numel(), dtype=q.dtype)
    md_in_out = out.view(torch.uint8)[:need]
    md_in_out.copy_(md)
    with pytest.raises(RuntimeError, match=OP + r": out: overlaps metadata"):
        run_op(selkv, pb, return_lse=False, out=out[: q.numel()].view(q.shape), metadata=md_in_out)


def test_plan_zero_rows(selkv):
    i0 = torch.empty(0, dtype=torch.int32)
    md = selkv.qsa_plan(torch.zeros((1, 1), dtype=torch.int32), torch.zeros(1, dtype=torch.int32), i0, i0,
                        selection=torch.empty((0, 7), dtype=torch.int32), num_q_heads=2, num_kv_heads=1,
                        head_dim=128, num_pages=1, page_size=16)
    assert md.shape == (0,) and selkv.qsa_metadata_size(0, 1) == 0


def test_plan_meta(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    m = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in pb.items()}
    R, K = pb["ids"].shape
    for form in ("expanded", "compact"):
        md = make_plan(selkv, m, form)
        assert md.device.type == "meta" and md.shape == (selkv.qsa_metadata_size(R, K),)
        out, lse = run_op(selkv, m, form, metadata=md)
        assert out.device.type == "meta" and lse.shape == pb["q"].shape[:2]
    short = torch.empty(selkv.qsa_metadata_size(R, K) - 4, dtype=torch.uint8, device="meta")
    with pytest.raises(RuntimeError, match=PLAN_OP + r": metadata_bytes: needs"):
        make_plan(selkv, m, metadata=short)
    with pytest.raises(RuntimeError, match=OP + r": metadata_bytes: needs"):
        run_op(selkv, m, metadata=short)
    with pytest.raises(RuntimeError, match=PLAN_OP + r": metadata: expected dtype Byte"):
        make_plan(selkv, m, metadata=torch.empty(short.numel() // 4 + 64, dtype=torch.int32, device="meta"))


def test_plan_opcheck(selkv, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    R, K = pb["ids"].shape
    kv = pb["kv"]
    q = pb["q"]
    sizes = (q.shape[1], kv.shape[3], q.shape[2], kv.shape[0], kv.shape[2])
    md = torch.empty(selkv.qsa_metadata_size(R, K), dtype=torch.uint8)
    base = (pb["table"], pb["seq_lens"], pb["req_ids"], pb["positions"])
    torch.library.opcheck(torch.ops.selkv.qsa_plan.default, (*base, pb["selection"], None, None, *sizes, md))
    torch.library.opcheck(torch.ops.selkv.qsa_plan.default, (*base, None, pb["ids"], pb["counts"], *sizes, md))
    make_plan(selkv, pb, metadata=md)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2])
    torch.library.opcheck(torch.ops.selkv.qsa_sparse_prefill.default,
                          (q, kv[:, 0], kv[:, 1], *base, pb["selection"], None, None, pb["scale"], False,
                           out, lse, md))


# ---- CUDA ---------------------------------------------------------------------------------------
def _to(pb, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in pb.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [128, 256])
@pytest.mark.parametrize("P", [16, 784])
def test_cuda_matches_cpu_op(selkv, cuda_device, gen, dtype, D, P):
    """The CUDA op against the CPU op (the oracle) and the fp64 model: both forms, both layouts,
    NaN in every unselected slot, empty rows exactly 0 / -inf."""
    pb = make_problem(gen, dtype, D, P, Hq=8, Hkv=2)
    ref_out, ref_lse = run_op(selkv, pb, "expanded")
    c = _to(pb, cuda_device)
    first = None
    for form in ("expanded", "compact"):
        for interleaved in (True, False):
            out, lse = run_op(selkv, c, form, interleaved=interleaved)
            assert out.device.type == "cuda" and lse.device.type == "cuda"
            if first is None:
                first = (out, lse)
                check_against_model(pb, out.cpu(), lse.cpu())
                torch.testing.assert_close(out.cpu().float(), ref_out.float(), rtol=2.01 / 128, atol=1e-3)
                torch.testing.assert_close(lse.cpu(), ref_lse, rtol=8.01 / 65536, atol=1e-6)
            else:  # same bits whatever the form and layout
                assert torch.equal(out, first[0]), (form, interleaved)
                assert torch.equal(lse, first[1]), (form, interleaved)


def test_cuda_gqa_groups_force_simple_and_out_variant(selkv, cuda_device, gen):
    for hq, hkv in ((1, 1), (6, 1), (16, 2), (8, 1)):
        pb = make_problem(gen, torch.bfloat16, 256, 16, Hq=hq, Hkv=hkv)
        c = _to(pb, cuda_device)
        out = torch.full_like(c["q"], 7.0)
        got = run_op(selkv, c, "compact", return_lse=False, out=out)
        assert got is out
        out2, lse = run_op(selkv, c, "compact", force_simple=True)
        assert torch.equal(out, out2)
        check_against_model(pb, out.cpu(), lse.cpu())


def _replay_in_graph(args, out, lse):
    """Runs the op on args once eagerly (warm-up), captures it in a CUDA graph, zeroes out / lse
    and replays the graph."""
    torch.ops.selkv.qsa_sparse_prefill(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops.selkv.qsa_sparse_prefill(*args)
    out.zero_()
    lse.zero_()
    g.replay()
    torch.cuda.synchronize()


def test_cuda_graph_replay_equals_eager(selkv, cuda_device, gen):
    pb = make_problem(gen, torch.float16, 256, 16, Hq=6, Hkv=1)
    c = _to(pb, cuda_device)
    eager_out, eager_lse = run_op(selkv, c, "expanded")
    out = torch.zeros_like(c["q"])
    lse = torch.zeros(c["q"].shape[:2], dtype=torch.float32, device=cuda_device)
    kv = c["kv"]
    args = (c["q"], kv[:, 0], kv[:, 1], c["table"], c["seq_lens"], c["req_ids"], c["positions"],
            c["selection"], None, None, float(c["scale"]), False, out, lse)
    _replay_in_graph(args, out, lse)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_cuda_errors(selkv, cuda_device, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    c = _to(pb, cuda_device)
    with pytest.raises(RuntimeError, match=OP + r": q: expected a CUDA tensor"):
        selkv.qsa_sparse_prefill(pb["q"], c["kv"][:, 0], c["kv"][:, 1], c["table"], c["seq_lens"],
                                 c["req_ids"], c["positions"], selection=c["selection"],
                                 out=torch.empty_like(c["q"]))
    with pytest.raises(RuntimeError, match=OP + r": scale"):
        selkv.qsa_sparse_prefill(c["q"], c["kv"][:, 0], c["kv"][:, 1], c["table"], c["seq_lens"],
                                 c["req_ids"], c["positions"], selection=c["selection"], scale=-1.0)


# ---- CUDA: the page-4 plan ------------------------------------------------------------------------
@pytest.mark.parametrize("P", [16, 784])
@pytest.mark.parametrize("form", ["expanded", "compact"])
def test_cuda_plan_equals_cpu_plan(selkv, cuda_device, gen, P, form):
    """The GPU plan kernel writes the CPU reference's bytes, over every invalid-entry kind; out with
    the plan == out without (R < 4096: the simple kernel either way)."""
    pb = make_problem(gen, torch.bfloat16, 128, P, Hq=8, Hkv=2)
    cpu_md = make_plan(selkv, pb, form)
    c = _to(pb, cuda_device)
    junk = torch.full((cpu_md.numel(),), 0xAB, dtype=torch.uint8, device=cuda_device)
    md = make_plan(selkv, c, form, metadata=junk)
    assert md is junk and md.device == c["q"].device
    assert torch.equal(md.cpu(), cpu_md)
    assert torch.equal(make_plan(selkv, c, form).cpu(), cpu_md)
    ref_out, ref_lse = run_op(selkv, c, form)
    out, lse = run_op(selkv, c, form, metadata=md)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_cuda_plan_irregular_rows(selkv, cuda_device):
    # Row 3 selects row 0's blocks, so the group shares enough to be listed (qsa_plan hands a group
    # whose rows share too little to the fix-up whole).
    sel = torch.full((4, 11), -1, dtype=torch.int32)
    sel[0, :6] = torch.tensor([8, 9, 10, 11, 0, 1])
    sel[1, :4] = torch.tensor([2, 3, 4, 5])
    sel[2, :2] = torch.tensor([5, 5])
    sel[3, :6] = sel[0, :6]
    args = (torch.tensor([[1, 0, 2]], dtype=torch.int32), torch.tensor([24], dtype=torch.int32),
            torch.zeros(4, dtype=torch.int32), torch.tensor([9, 9, 9, 9], dtype=torch.int32))
    kw = dict(num_q_heads=2, num_kv_heads=1, head_dim=128, num_pages=3, page_size=16)
    cpu_md = selkv.qsa_plan(*args, selection=sel, **kw)
    md = selkv.qsa_plan(*(a.to(cuda_device) for a in args), selection=sel.to(cuda_device), **kw)
    assert torch.equal(md.cpu(), cpu_md)
    assert md.view(torch.int32)[8:12].tolist() == [0, 2, 0b110, 0]  # rows 1 and 2 bad


def _large_problem(device, R=4096, K=384, Hq=8, Hkv=1, D=128, P=64, num_req=4, dtype=torch.bfloat16):
    """A batch at the page-4 route's row threshold (kQsaPage4MinRows), selections wide enough for
    it (K >= kQsaPage4MinBlocks), built on the device:
    causal compact selections of K blocks per row (duplicates allowed), the expanded form of the
    same blocks, NaN-free caches."""
    g = torch.Generator(device="cpu")
    g.manual_seed(1234)
    width = 64
    pages = num_req * width
    table = torch.randperm(pages, generator=g, dtype=torch.int32).view(num_req, width)
    seq_lens = torch.full((num_req,), width * P, dtype=torch.int32)
    req_ids = torch.arange(R, dtype=torch.int32) % num_req
    positions = torch.randint(4 * K, width * P, (R,), generator=g, dtype=torch.int32)
    hi = ((positions + 1) // 4).clamp(min=1)
    ids = (torch.rand((R, K), generator=g) * hi[:, None]).to(torch.int32)
    counts = torch.randint(K // 2, K + 1, (R,), generator=g, dtype=torch.int32)
    sel = torch.full((R, 4 * K + 3), -1, dtype=torch.int32)
    blocks = (4 * ids[:, :, None] + torch.arange(4, dtype=torch.int32)).view(R, 4 * K)
    live = torch.arange(4 * K)[None, :] < 4 * counts[:, None]
    sel[:, : 4 * K] = torch.where(live, blocks, torch.full_like(blocks, -1))
    start = 4 * ((positions + 1) // 4)
    for i in range(3):  # the causal partial block, after the counted blocks
        t = start + i
        col = 4 * counts + i
        sel[torch.arange(R), col] = torch.where(t <= positions, t, torch.full_like(t, -1))
    q = torch.randn((R, Hq, D), generator=g).to(dtype)  # calibrated data, as make_problem
    kv = (torch.randn((pages, 2, P, Hkv, D), generator=g) * 0.1).to(dtype)
    pb = dict(q=q, kv=kv, table=table, seq_lens=seq_lens, req_ids=req_ids, positions=positions, selection=sel,
              ids=ids, counts=counts, scale=D**-0.55)
    return _to(pb, device)


def test_cuda_large_batch_with_plan(selkv, cuda_device):
    """R = 4096 rows with a plan: the page-4 route (on SM90), within the CUDA-vs-oracle tolerances of
    the simple kernel (force_simple)."""
    c = _large_problem(cuda_device)
    for form in ("expanded", "compact"):
        md = make_plan(selkv, c, form)
        ref_out, ref_lse = run_op(selkv, c, form, force_simple=True)
        out, lse = run_op(selkv, c, form, metadata=md)
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=2.01 / 128, atol=1e-3)
        torch.testing.assert_close(lse, ref_lse, rtol=8.01 / 65536, atol=1e-6)
        assert torch.equal(make_plan(selkv, c, "compact"), md)  # the two forms: one plan


def test_cuda_plan_then_graph(selkv, cuda_device, gen):
    """Plan outside the graph, attention with the plan inside; the plan kernel itself also
    captures and replays to the same bytes."""
    pb = make_problem(gen, torch.float16, 128, 16, Hq=4, Hkv=1)
    c = _to(pb, cuda_device)
    md = make_plan(selkv, c)
    eager_out, eager_lse = run_op(selkv, c, metadata=md)
    out = torch.zeros_like(c["q"])
    lse = torch.zeros(c["q"].shape[:2], dtype=torch.float32, device=cuda_device)
    kv = c["kv"]
    args = (c["q"], kv[:, 0], kv[:, 1], c["table"], c["seq_lens"], c["req_ids"], c["positions"],
            c["selection"], None, None, float(c["scale"]), False, out, lse, md)
    _replay_in_graph(args, out, lse)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)

    md2 = torch.zeros_like(md)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        make_plan(selkv, c, metadata=md2)
    g2.replay()
    torch.cuda.synchronize()
    assert torch.equal(md2, md)


def test_cuda_plan_errors(selkv, cuda_device, gen):
    pb = make_problem(gen, torch.bfloat16, 128, 16)
    c = _to(pb, cuda_device)
    R, K = pb["ids"].shape
    need = selkv.qsa_metadata_size(R, K)
    buf = torch.zeros(need + 16, dtype=torch.uint8, device=cuda_device)
    with pytest.raises(RuntimeError, match=PLAN_OP + r": metadata: must be 16-byte aligned"):
        make_plan(selkv, c, metadata=buf[4 : 4 + need])
    make_plan(selkv, c, metadata=buf[:need])
    with pytest.raises(RuntimeError, match=OP + r": metadata: must be 16-byte aligned"):
        run_op(selkv, c, metadata=buf[4 : 4 + need])
    with pytest.raises(RuntimeError, match=OP + r": metadata_bytes: needs"):
        run_op(selkv, c, metadata=buf[: need - 16])
    with pytest.raises(RuntimeError, match=OP + r": metadata: expected a CUDA tensor"):
        run_op(selkv, c, metadata=buf[:need].cpu())
    with pytest.raises(RuntimeError, match=PLAN_OP + r": (metadata|block_table): expected a CUDA tensor"):
        make_plan(selkv, pb, metadata=buf[:need])
