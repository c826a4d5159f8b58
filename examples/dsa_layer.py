#!/usr/bin/env python3
"""A small random DSA (DeepSeek sparse attention) layer served through ``selkv.dsa``.

The layer (weights drawn here, nothing downloaded) is DeepSeek-V3.2's attention in its absorbed
form, shrunk: hidden states ``x [T, d_model]`` -> queries ``q [T, H, 576]`` (512 latent + 64 RoPE),
the new token's compressed KV (``latent [T, 512]`` + ``rope [T, 64]``, written to the FP8 cache),
a lightning indexer (a few small heads scoring every visible position of the request, top-k
kept), attention of each query over its top-k cached tokens, and an output projection of the
``[T, H, 512]`` latent attention output.

It serves a few requests: their prompts arrive over the first steps (prefill rows, some in
chunks), then every request decodes one token per step, so most steps are mixed batches (decode
rows first, then prefill rows), run with one ``DsaAttention.plan`` + ``run`` per step. After every
step the attention output is checked against a torch fp64 model of sparse MLA over the
dequantized cache. At the end it prints the time per selkv op (from torch.profiler) and the
other work of the layer.

    PYTHONPATH=python SELKV_OPS_LIBRARY=build/python/selkv/_selkv_ops.so python3 examples/dsa_layer.py
    ... --device cuda --heads 128 --topk 2048 --requests 16 --prompt-len 4096 --decode-steps 64

On the CPU every op runs the CPU oracle (fp64), so keep the default sizes there.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict

import torch

import selkv


# ---- the layer ----------------------------------------------------------------------------------
class RandomDsaLayer:
    """DeepSeek-style MLA + lightning indexer with random weights (absorbed form)."""

    def __init__(self, d_model, heads, topk, idx_heads, idx_dim, device, gen):
        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(device, torch.bfloat16)

        self.H, self.K, self.d = heads, topk, d_model
        self.w_q = w(d_model, heads * 576, fan_in=d_model)
        self.w_kv = w(d_model, 576, fan_in=d_model)
        self.w_o = w(heads * 512, d_model, fan_in=heads * 512)
        self.w_iq = w(d_model, idx_heads * idx_dim, fan_in=d_model)
        self.w_ik = w(d_model, idx_dim, fan_in=d_model)
        self.w_iw = w(d_model, idx_heads, fan_in=d_model)
        self.idx_heads, self.idx_dim = idx_heads, idx_dim
        self.sm_scale = 576**-0.5

    @staticmethod
    def rope(x, pos):
        """Rotary embedding of the last dim (pairs) at positions ``pos [T]``."""
        half = x.shape[-1] // 2
        freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
        ang = pos.float()[:, None] * freq[None]
        while ang.dim() < x.dim():
            ang = ang.unsqueeze(1)
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).to(x.dtype)

    def project(self, x, pos):
        T = x.shape[0]
        q = (x @ self.w_q).view(T, self.H, 576)
        q = torch.cat([q[..., :512], self.rope(q[..., 512:], pos)], -1)
        kv = x @ self.w_kv
        return q.contiguous(), kv[:, :512].contiguous(), self.rope(kv[:, 512:], pos).contiguous()

    def index_keys(self, x, pos):
        return self.rope(x @ self.w_ik, pos)

    def indexer(self, x, pos, req_keys):
        """Top-k request-local positions ``[T, K]`` (causal, -1 padded) of each token."""
        T = x.shape[0]
        qi = self.rope((x @ self.w_iq).view(T, self.idx_heads, self.idx_dim), pos).float()
        wts = (x @ self.w_iw).float()
        out = torch.full((T, self.K), -1, dtype=torch.int32, device=x.device)
        for t in range(T):
            n = int(pos[t]) + 1
            k = req_keys[:n].float()
            score = (torch.relu(qi[t] @ k.T) * wts[t, :, None]).sum(0)  # [n]
            kk = min(self.K, n)
            out[t, :kk] = torch.topk(score, kk).indices.to(torch.int32)
        return out


def reference_attention(q, cache, topk, block_table_rows, seq_lens_tok, page, sm_scale):
    """fp64 sparse MLA over the dequantized cache (valid positions: 0 <= pos < seq_len)."""
    nb = cache.shape[0]
    flat = cache.reshape(nb * page, 656)
    nope = flat[:, :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, 512:528].contiguous().view(torch.float32)
    kv = torch.cat([(nope.view(-1, 4, 128) * scales[:, :, None]).view(-1, 512).to(torch.bfloat16).float(),
                    flat[:, 528:].contiguous().view(torch.bfloat16).float()], 1).double()
    T, H, _ = q.shape
    out = torch.zeros(T, H, 512, dtype=torch.float64, device=q.device)
    for t in range(T):
        pos = topk[t].long()
        pos = pos[(pos >= 0) & (pos < seq_lens_tok[t])]
        if pos.numel() == 0:
            continue
        slots = block_table_rows[t].long()[pos // page] * page + pos % page
        keys = kv[slots]
        p = torch.softmax((q[t].double() @ keys.T) * sm_scale, -1)
        out[t] = p @ keys[:, :512]
    return out


# ---- progress bar ------------------------------------------------------------------------------
def progress(i, n, t0, extra="", width=30):
    done = int(width * i / max(n, 1))
    el = time.perf_counter() - t0
    eta = el / i * (n - i) if i else 0.0
    sys.stdout.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {el:6.1f}s eta {eta:6.1f}s {extra}")
    sys.stdout.flush()
    if i == n:
        sys.stdout.write("\n")


# ---- serving loop --------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=80, help="longest prompt (others shorter)")
    ap.add_argument("--prefill-chunk", type=int, default=48, help="prompt tokens per request per step")
    ap.add_argument("--decode-steps", type=int, default=6)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--workspace-mib", type=float, default=None,
                    help="prefill workspace budget (default: 0.25 MiB, or 32 prefill tokens' C4 "
                         "workspace when 0.25 MiB does not hold one, e.g. at --topk 2048)")
    ap.add_argument("--prefill-route", default="auto", choices=["auto", "dequant", "gather"],
                    help="selkv.DsaPolicy.prefill_route (C4, C3 or per request)")
    ap.add_argument("--no-check", action="store_true", help="skip the per-step fp64 check")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    layer = RandomDsaLayer(args.d_model, args.heads, args.topk, idx_heads=4, idx_dim=32, device=dev, gen=gen)
    R, page = args.requests, args.page_size
    prompt = [max(2, args.prompt_len * (r + 1) // R) for r in range(R)]
    total = [p + args.decode_steps for p in prompt]
    blocks_per_req = [-(-n // page) for n in total]
    num_blocks = sum(blocks_per_req) + 2
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    bt = torch.full((R, max(blocks_per_req)), -1, dtype=torch.int32)
    o = 0
    for r, nb in enumerate(blocks_per_req):
        bt[r, :nb] = perm[o : o + nb]
        o += nb
    bt = bt.to(dev)
    cache = selkv.empty_kv_cache(num_blocks, page, device=dev)
    cache.fill_(0xFF)  # NaN bytes: a stray read would show in the check
    tokens = [torch.randn(n, args.d_model, generator=gen).to(dev, torch.bfloat16) for n in total]
    idx_keys = [torch.zeros(n, layer.idx_dim, device=dev, dtype=torch.bfloat16) for n in total]

    max_tokens = R * max(args.prefill_chunk, 1) + R
    if args.workspace_mib is not None:
        workspace_bytes = int(args.workspace_mib * (1 << 20))
    else:  # the planner cuts prefill chunks to the budget, which must hold one token's C4 rows
        ws_tokens = lambda n: selkv.dequant_prefill_workspace_size(n, args.topk, num_blocks * page)  # noqa: E731
        workspace_bytes = 1 << 18 if ws_tokens(1) <= 1 << 18 else ws_tokens(32)
    attn = selkv.DsaAttention(
        args.heads, args.topk, num_blocks=num_blocks, page_size=page,
        workspace_bytes=workspace_bytes, max_num_tokens=max_tokens, max_num_reqs=R,
        sm_scale=layer.sm_scale, policy=selkv.DsaPolicy(prefill_route=args.prefill_route), device=dev)

    done = [0] * R  # tokens of each request already in the cache
    steps = []
    while any(d < n for d, n in zip(done, total)):
        # decode rows first (requests whose prompt is done), then prefill chunks
        dec = [r for r in range(R) if done[r] >= prompt[r] and done[r] < total[r]]
        pre = [r for r in range(R) if done[r] < prompt[r]][: max(1, R // 2)]
        steps.append([(r, 1) for r in dec] + [(r, min(args.prefill_chunk, prompt[r] - done[r])) for r in pre])
        for r, n in steps[-1]:
            done[r] += n
    done = [0] * R

    times = defaultdict(float)
    use_cuda = dev.type == "cuda"
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if use_cuda else [])
    worst = 0.0
    t0 = time.perf_counter()
    print(f"selkv.dsa example: {R} requests, prompts {prompt}, {args.decode_steps} decode steps, "
          f"H={args.heads} K={args.topk} page={page} on {dev} ({len(steps)} steps)")
    with torch.profiler.profile(activities=acts) as prof:
        for i, step in enumerate(steps):
            reqs = [r for r, _ in step]
            qsl, lens, xs, pos = [0], [], [], []
            for r, n in step:
                qsl.append(qsl[-1] + n)
                lens.append(done[r] + n)
                xs.append(tokens[r][done[r] : done[r] + n])
                pos.append(torch.arange(done[r], done[r] + n, device=dev))
            x, p = torch.cat(xs), torch.cat(pos)
            step_bt = bt[reqs]
            slot_mapping = torch.cat([
                (step_bt[j].long()[pp // page] * page + pp % page) for j, pp in enumerate(pos)])
            with torch.profiler.record_function("layer: projections"):
                q, latent, rope = layer.project(x, p)
            with torch.profiler.record_function("layer: indexer"):
                for j, (r, n) in enumerate(step):
                    idx_keys[r][done[r] : done[r] + n] = layer.index_keys(xs[j], pos[j])
                topk = torch.cat([layer.indexer(xs[j], pos[j], idx_keys[r]) for j, (r, n) in enumerate(step)])
            num_dec = sum(1 for r, n in step if done[r] >= prompt[r])
            attn.plan(qsl, lens, step_bt, slot_mapping, num_decodes=num_dec)
            out = attn.run(q, cache, topk, latent, rope)
            with torch.profiler.record_function("layer: output projection"):
                y = out.reshape(out.shape[0], -1) @ layer.w_o  # noqa: F841 (the layer's output)
            if not args.no_check:
                with torch.profiler.record_function("check (fp64 reference)"):
                    rows = torch.repeat_interleave(step_bt, torch.tensor([n for _, n in step], device=dev), 0)
                    lens_tok = torch.repeat_interleave(torch.tensor(lens), torch.tensor([n for _, n in step]))
                    ref = reference_attention(q, cache, topk, rows, lens_tok, page, layer.sm_scale)
                    r16 = ref.to(torch.bfloat16).double()
                    err = ((out.double() - r16).abs() / (r16.abs() + 1e-2)).max().item()
                    worst = max(worst, err)
                    if not math.isfinite(err) or err > 0.05:
                        print(f"\nstep {i}: output differs from the fp64 reference (max rel err {err:.3g})")
                        return 1
            for r, n in step:
                done[r] += n
            kind = "mixed" if num_dec and num_dec < len(step) else ("decode" if num_dec else "prefill")
            progress(i + 1, len(steps), t0, f"{kind:7s} {qsl[-1]:4d} tok")

    if use_cuda:
        torch.cuda.synchronize()
    # Per-op breakdown: selkv ops by their operator name, the layer's parts by their labels.
    key = "device_time_total" if use_cuda else "cpu_time_total"
    for ev in prof.key_averages():
        name = ev.key
        helper = name.endswith("_size") or name.endswith("_fields")  # host-only size queries
        if (name.startswith("selkv::") and not helper) or name.startswith("layer:") or name.startswith("check"):
            t = getattr(ev, key, None)
            if t is None and use_cuda:
                t = getattr(ev, "cuda_time_total", 0.0)
            times[(name, ev.count)] += float(t or 0.0)
    tot = sum(t for (n, _), t in times.items() if not n.startswith("check")) or 1.0
    unit = "device" if use_cuda else "CPU"
    print(f"\nper-op time ({unit} time, whole run; selkv ops run inside selkv.dsa):")
    print(f"  {'op':42s} {'calls':>6s} {'total ms':>10s} {'share':>6s}")
    for (name, cnt), t in sorted(times.items(), key=lambda kv: -kv[1]):
        share = "" if name.startswith("check") else f"{100 * t / tot:5.1f}%"
        print(f"  {name:42s} {cnt:6d} {t / 1e3:10.3f} {share:>6s}")
    if not args.no_check:
        print(f"all {len(steps)} steps match the fp64 reference (max rel err {worst:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
