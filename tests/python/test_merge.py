"""Tests of the C9 LSE merge through torch: torch.ops.selkv.merge_attn_states and the wrappers.

- CPU op (the C++ oracle) against an independent fp64 torch model, over N = 1..16, the three
  dtypes, strided shards and [H, T] lse layouts, -inf / +inf / NaN rows (incl. NaN in the out of
  an empty shard) and the pos_inf_is_empty flag;
- vLLM's two-input form (its argument order and [H, T] lse) against the same model;
- CUDA op against the CPU op (skips without a GPU), CUDA-graph replay bitwise equal to eager;
- errors name the op and the argument; opcheck and a torch.compile smoke test.
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

INF = float("inf")
NAN = float("nan")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


def model(outs, lses, pos_inf_is_empty=False):
    """fp64 model: outs [N, T, H, D], lses [N, T, H] -> (out [T, H, D], lse [T, H]) in fp64."""
    o = outs.double()
    l = lses.double().clone()
    if pos_inf_is_empty:
        l[l == INF] = -INF
    nan_row = torch.isnan(l).any(0)
    pos = l == INF
    pos_row = pos.any(0)
    live = l > -INF  # finite (NaN / +inf rows are overwritten below)
    m = torch.where(live & ~pos, l, torch.full_like(l, -INF)).amax(0)
    w = torch.where(live & ~pos, torch.exp(l - m.clamp_min(-1e300)), torch.zeros_like(l))
    w = torch.nan_to_num(w, nan=0.0)
    contrib = torch.where(live[..., None], w[..., None] * o, torch.zeros_like(o))
    wsum = w.sum(0)
    out = contrib.sum(0) / wsum[..., None]
    lse = m + torch.log(wsum)
    empty = m == -INF
    out = torch.where(empty[..., None], torch.zeros_like(out), out)
    lse = torch.where(empty, torch.full_like(lse, -INF), lse)
    first = pos.double().argmax(0)  # first +inf shard
    pos_out = torch.gather(o, 0, first[None, ..., None].expand(1, *o.shape[1:])).squeeze(0)
    out = torch.where(pos_row[..., None], pos_out, out)
    lse = torch.where(pos_row, torch.full_like(lse, INF), lse)
    out = torch.where(nan_row[..., None], torch.full_like(out, NAN), out)
    lse = torch.where(nan_row, torch.full_like(lse, NAN), lse)
    return out, lse


def make_case(gen, n, t, h, d, dtype, special=True):
    """Shards with every special-row pattern: outs [N, T, H, D] (dtype), lses [N, T, H] fp32."""
    lses = torch.randn((n, t, h), generator=gen) * 3
    outs = torch.randn((n, t, h, d), generator=gen)
    if special:
        pat = torch.randint(0, 8, (t, h), generator=gen)
        s = torch.randint(0, n, (t, h), generator=gen)
        idx = torch.arange(n)[:, None, None]
        empty_some = (pat == 0) & (idx % 2 == 0)
        lses[empty_some] = -INF
        outs[empty_some] = NAN  # an empty shard's NaN must not leak
        lses[:, pat == 1] = -INF  # all empty
        outs[:, pat == 1] = NAN
        lses[(pat == 2) & (idx == s)] = NAN
        pinf = (pat == 3) & (idx == s)
        lses[pinf] = INF
        pinf_nan = (pat == 4) & (idx == s)
        lses[pinf_nan] = INF
        outs[pinf_nan] = NAN
        lses[(pat == 5) & (idx == s)] += 100.0  # tiny weights for the rest
    return outs.to(dtype), lses


def check_close(got, want_fp64, dtype, what):
    """got (dtype) vs the fp64 model: NaN / inf exactly; else 2 dtype ulps + row-relative fp32 error."""
    g = got.detach().cpu().double()
    w = want_fp64
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN pattern differs"
    inf = torch.isinf(w)
    assert torch.equal(g[inf], w[inf]), f"{what}: inf entries differ"
    fin = torch.isfinite(w)
    if dtype == torch.float32:
        tol = 4e-6 * (w.abs() + 1)
    else:
        eps = torch.finfo(dtype).eps
        tol = 2 * eps * w.abs().clamp_min(torch.finfo(dtype).tiny) + 1e-6
    err = (g - w).abs()
    bad = fin & (err > tol)
    assert not bad.any(), f"{what}: max err {err[fin].max().item()} at {bad.nonzero()[:5].tolist()}"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos_inf_is_empty", [False, True])
def test_cpu_matches_model(selkv, gen, n, dtype, pos_inf_is_empty):
    outs, lses = make_case(gen, n, 6, 5, 72, dtype)
    out, lse = selkv.merge_attn_states(outs, lses, pos_inf_is_empty=pos_inf_is_empty)
    want_out, want_lse = model(outs, lses, pos_inf_is_empty)
    check_close(out, want_out, dtype, "out")
    check_close(lse, want_lse, torch.float32, "lse")


def test_cpu_strided_lists_and_layouts(selkv, gen):
    n, t, h, d = 3, 4, 3, 16
    outs, lses = make_case(gen, n, t, h, d, torch.bfloat16)
    # Padded shards (a slice of a wider buffer), lses in [H, T] buffers, out padded, lse [H, T].
    big = torch.full((n, t, h, d + 24), NAN, dtype=torch.bfloat16)
    big[..., :d] = outs
    shards = [big[i, :, :, :d] for i in range(n)]
    lse_ht = [lses[i].t().contiguous().t() for i in range(n)]
    out_buf = torch.full((t, h + 1, d + 8), 7.0, dtype=torch.bfloat16)
    out = out_buf[:, :h, :d]
    lse_buf = torch.full((h, t + 2), 7.0)
    lse = lse_buf[:, :t].t()
    selkv.merge_attn_states(shards, lse_ht, out=out, lse=lse)
    want_out, want_lse = model(outs, lses)
    check_close(out, want_out, torch.bfloat16, "out")
    check_close(lse, want_lse, torch.float32, "lse")
    assert (out_buf[:, h:] == 7).all() and (out_buf[..., d:] == 7).all(), "out padding written"
    assert (lse_buf[:, t:] == 7).all(), "lse padding written"
    # out only
    o2, l2 = selkv.merge_attn_states(shards, lse_ht, return_lse=False)
    assert l2 is None
    assert torch.equal(o2.view(torch.int16), out.contiguous().view(torch.int16))


def test_special_rows_exact(selkv):
    # 2 shards, 4 rows (T=4, H=1), D=8: empty+finite, +inf+finite, all empty, NaN.
    outs = torch.arange(2 * 4 * 8, dtype=torch.float32).reshape(2, 4, 1, 8)
    outs[0, 0] = NAN
    lses = torch.tensor([[-INF, INF, -INF, 1.0], [0.5, 2.0, -INF, NAN]]).reshape(2, 4, 1)
    out, lse = selkv.merge_attn_states(outs, lses)
    assert torch.equal(out[0], outs[1, 0]) and lse[0, 0] == 0.5
    assert torch.equal(out[1], outs[0, 1]) and lse[1, 0] == INF
    assert (out[2] == 0).all() and lse[2, 0] == -INF
    assert torch.isnan(out[3]).all() and torch.isnan(lse[3, 0])
    out, lse = selkv.merge_attn_states(outs, lses, pos_inf_is_empty=True)
    assert torch.equal(out[1], outs[1, 1]) and lse[1, 0] == 2.0


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_vllm_form(selkv, gen, device, dtype):
    t, h, d = 7, 4, 64
    outs, lses = make_case(gen, 2, t, h, d, dtype)
    # vLLM: lse [H, T]; FlashAttention's +inf marks an empty partial.
    p_lse = lses[0].t().contiguous().to(device)
    s_lse = lses[1].t().contiguous().to(device)
    output = torch.empty((t, h, d), dtype=dtype, device=device)
    output_lse = torch.empty((h, t), device=device)
    selkv.merge_attn_states_vllm(
        output, outs[0].to(device), p_lse, outs[1].to(device), s_lse, output_lse
    )
    want_out, want_lse = model(outs, lses, pos_inf_is_empty=True)
    check_close(output, want_out, dtype, "output")
    check_close(output_lse.t(), want_lse, torch.float32, "output_lse")
    output2 = torch.empty_like(output)
    selkv.merge_attn_states_vllm(output2, outs[0].to(device), p_lse, outs[1].to(device), s_lse)
    assert torch.equal(output2.cpu().view(torch.uint8), output.cpu().view(torch.uint8))


def test_model_sanity():
    # The model itself against plain attention over the union of two key sets.
    torch.manual_seed(0)
    q = torch.randn(3, 16, dtype=torch.float64)
    k = torch.randn(10, 16, dtype=torch.float64)
    v = torch.randn(10, 8, dtype=torch.float64)

    def attn(keys):
        s = q @ k[keys].t()
        return torch.softmax(s, -1) @ v[keys], torch.logsumexp(s, -1)

    o_all, l_all = attn(list(range(10)))
    o1, l1 = attn(list(range(4)))
    o2, l2 = attn(list(range(4, 10)))
    out, lse = model(torch.stack([o1, o2])[:, :, None], torch.stack([l1, l2])[:, :, None])
    assert torch.allclose(out[:, 0], o_all) and torch.allclose(lse[:, 0], l_all)
    assert math.isfinite(lse.sum().item())


# ---- CUDA against CPU ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 8, 16])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(selkv, cuda_device, gen, n, dtype):
    outs, lses = make_case(gen, n, 9, 6, 512 if dtype != torch.float32 else 136, dtype)
    for flag in (False, True):
        c_out, c_lse = selkv.merge_attn_states(outs, lses, pos_inf_is_empty=flag)
        g_out, g_lse = selkv.merge_attn_states(
            outs.to(cuda_device), lses.to(cuda_device), pos_inf_is_empty=flag
        )
        check_close(g_out, c_out.double(), dtype, f"out flag={flag}")
        check_close(g_lse, c_lse.double(), torch.float32, f"lse flag={flag}")


@pytest.mark.skipif(
    os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
    reason="torch.cuda.graph needs the caching allocator (disabled for memcheck runs)",
)
def test_cuda_graph_replay(selkv, cuda_device, gen):
    outs, lses = make_case(gen, 4, 33, 8, 512, torch.bfloat16)
    outs, lses = outs.to(cuda_device), lses.to(cuda_device)
    out = torch.empty(outs.shape[1:], dtype=outs.dtype, device=cuda_device)
    lse = torch.empty(lses.shape[1:], device=cuda_device)
    selkv.merge_attn_states(outs, lses, out=out, lse=lse)
    eager = (out.clone(), lse.clone())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selkv.merge_attn_states(outs, lses, out=out, lse=lse)
    out.zero_()
    lse.zero_()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager[0].view(torch.int16))
    assert torch.equal(lse.view(torch.int32), eager[1].view(torch.int32))


# ---- errors, opcheck, compile ------------------------------------------------------------------
@pytest.mark.parametrize("device", _devices())
def test_errors_name_argument(selkv, device):
    outs = torch.zeros((2, 3, 4, 16), dtype=torch.bfloat16, device=device)
    lses = torch.zeros((2, 3, 4), device=device)
    out = torch.empty((3, 4, 16), dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: head_dim"):
        selkv.merge_attn_states(outs[..., :12], lses)
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: outs: expected dtype"):
        selkv.merge_attn_states(outs, lses, out=out.float())
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: lses: expected dtype Float"):
        selkv.merge_attn_states(outs, lses.double())
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: outs: expected 1 to 16"):
        selkv.merge_attn_states(outs[:1].expand(17, -1, -1, -1), lses[:1].expand(17, -1, -1))
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: lses: expected 2 tensors"):
        selkv.merge_attn_states(outs, lses[:1])
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: out: overlaps outs"):
        selkv.merge_attn_states(outs, lses, out=outs[0])
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: outs: every shard needs the strides"):
        selkv.merge_attn_states([outs[0], outs[1].transpose(0, 1).contiguous().transpose(0, 1)], lses)
    with pytest.raises(RuntimeError, match=r"selkv::merge_attn_states: out: expected dtype BFloat16, Half or Float"):
        selkv.merge_attn_states(outs.double(), lses)
    # Zero rows: a no-op.
    e_out, e_lse = selkv.merge_attn_states(outs[:, :0], lses[:, :0])
    assert e_out.shape == (0, 4, 16) and e_lse.shape == (0, 4)


@pytest.mark.parametrize("device", _devices())
def test_opcheck(selkv, gen, device):
    outs, lses = make_case(gen, 3, 5, 4, 64, torch.bfloat16, special=False)
    outs, lses = outs.to(device), lses.to(device)
    out = torch.empty(outs.shape[1:], dtype=outs.dtype, device=device)
    lse = torch.empty(lses.shape[1:], device=device)
    torch.library.opcheck(
        torch.ops.selkv.merge_attn_states.default, (list(outs.unbind(0)), list(lses.unbind(0)), out, lse, False)
    )
    torch.library.opcheck(
        torch.ops.selkv.merge_attn_states.default, (list(outs.unbind(0)), list(lses.unbind(0)), out, None, True)
    )


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_smoke(selkv, gen, device):
    torch._dynamo.reset()
    outs, lses = make_case(gen, 2, 5, 4, 64, torch.float16)
    outs, lses = outs.to(device), lses.to(device)

    def step(outs, lses):
        out, lse = selkv.merge_attn_states(outs, lses)
        return out * 2, lse

    expected = step(outs, lses)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(outs, lses)
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int16 if a.dtype == torch.float16 else torch.int32),
                           e.view(torch.int16 if e.dtype == torch.float16 else torch.int32))
