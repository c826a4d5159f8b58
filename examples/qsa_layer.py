#!/usr/bin/env python3
"""A small random QSA (Qwen-style selected sparse attention) prefill step through selkv.

The layer (weights drawn here, nothing downloaded) is GQA attention with a block indexer, the way
QSA models pair them: hidden states ``x [T, d_model]`` -> queries ``q [T, Hq, D]`` and the new
tokens' keys / values ``[T, Hkv, D]``, written into a paged cache (an interleaved
``[pages, 2, P, Hkv, D]`` buffer with a shuffled block table, as an engine's allocator leaves it);
an indexer scores every complete 4-token block before each query row and keeps its top ``K``;
each row then attends to its selected blocks plus its own causal partial block
(``selkv.qsa_sparse_prefill``, compact form), and an output projection closes the layer.

One prefill step over a few requests' prompts: when the call will take the page-4 route
(``selkv.qsa_page4_wanted``: 4096 rows or more selecting K >= 384 blocks) the plan is made once
(``selkv.qsa_plan``, outside a CUDA graph in an engine) and passed to the attention, which runs the
page-4 kernel on an H200; other calls need no plan and run the exact simple kernel. The output is
checked against a torch fp64 model of the same attention, and on CUDA the plan and the attention
are timed.

    PYTHONPATH=python SELKV_OPS_LIBRARY=build/python/selkv/_selkv_ops.so python3 examples/qsa_layer.py
    ... --device cuda --requests 2 --prompt-len 4096 --blocks 512 --head-dim 256

On the CPU every op runs the CPU oracle (fp64), so keep the default sizes there.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import selkv


class RandomQsaLayer:
    """GQA attention + a 4-token block indexer, random weights."""

    def __init__(self, d_model, q_heads, kv_heads, head_dim, idx_dim, device, dtype, gen):
        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(device, dtype)

        self.Hq, self.Hkv, self.D = q_heads, kv_heads, head_dim
        self.w_q = w(d_model, q_heads * head_dim, fan_in=d_model)
        self.w_k = w(d_model, kv_heads * head_dim, fan_in=d_model)
        self.w_v = w(d_model, kv_heads * head_dim, fan_in=d_model)
        self.w_o = w(q_heads * head_dim, d_model, fan_in=q_heads * head_dim)
        self.w_iq = w(d_model, idx_dim, fan_in=d_model)
        self.w_ik = w(d_model, idx_dim, fan_in=d_model)

    def project(self, x):
        T = x.shape[0]
        return ((x @ self.w_q).view(T, self.Hq, self.D), (x @ self.w_k).view(T, self.Hkv, self.D),
                (x @ self.w_v).view(T, self.Hkv, self.D))

    def select_blocks(self, x, req_ids, positions, starts, K):
        """Top-K complete 4-token blocks before each row's partial block, by the indexer's score of
        the block's mean key (compact form: ids [T, K], counts [T])."""
        T = x.shape[0]
        iq = (x @ self.w_iq).float()
        ik = (x @ self.w_ik).float()
        ids = torch.zeros(T, K, dtype=torch.int32)
        counts = torch.zeros(T, dtype=torch.int32)
        for t in range(T):
            r, p = int(req_ids[t]), int(positions[t])
            nblk = (p + 1) // 4  # complete blocks before the partial one
            if nblk == 0:
                continue
            keys = ik[starts[r] : starts[r] + 4 * nblk].view(nblk, 4, -1).mean(1)
            score = keys @ iq[t]
            k = min(K, nblk)
            ids[t, :k] = torch.topk(score, k).indices.to(torch.int32).cpu()
            counts[t] = k
        return ids, counts


def reference(q, kc, vc, table, req_ids, positions, ids, counts, P, scale):
    """fp64 attention of each row over its selected blocks + its causal partial block."""
    R, Hq, D = q.shape
    Hkv = kc.shape[2]
    out = torch.zeros(R, Hq, D, dtype=torch.float64)
    for t in range(R):
        r, p = int(req_ids[t]), int(positions[t])
        toks = [4 * int(b) + i for b in ids[t, : int(counts[t])] for i in range(4)]
        toks += list(range(4 * ((p + 1) // 4), p + 1))
        tt = torch.tensor(toks)
        pages, slots = table[r, tt // P].long(), tt % P
        k = kc[pages, slots].double()  # [n, Hkv, D]
        v = vc[pages, slots].double()
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s = (k[:, g] @ q[t, h].double()) * scale
            out[t, h] = torch.softmax(s, 0) @ v[:, g]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="a random QSA prefill step through selkv")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--q-heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=8, help="K: selected 4-token blocks a row (<= 512)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--check-rows", type=int, default=64, help="rows checked against the fp64 model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    gen = torch.Generator().manual_seed(args.seed)
    B, L, P, D = args.requests, args.prompt_len, args.page_size, args.head_dim
    layer = RandomQsaLayer(args.d_model, args.q_heads, args.kv_heads, D, 32, "cpu", dtype, gen)

    # The prompts' tokens, request after request; every row is a prefill row.
    T = B * L
    x = (torch.randn(T, args.d_model, generator=gen)).to(dtype)
    req_ids = torch.arange(B, dtype=torch.int32).repeat_interleave(L)
    positions = torch.arange(L, dtype=torch.int32).repeat(B)
    starts = [r * L for r in range(B)]
    q, k_new, v_new = layer.project(x)

    # A paged interleaved cache with a shuffled block table; the new tokens' K / V written into it.
    width = (L + P - 1) // P
    num_pages = B * width + 3
    table = torch.randperm(num_pages, generator=gen)[: B * width].view(B, width).to(torch.int32)
    kv = torch.zeros(num_pages, 2, P, args.kv_heads, D, dtype=dtype)
    pages, slots = table[req_ids.long(), positions.long() // P].long(), positions.long() % P
    kv[pages, 0, slots] = k_new
    kv[pages, 1, slots] = v_new
    seq_lens = torch.full((B,), L, dtype=torch.int32)
    ids, counts = layer.select_blocks(x, req_ids, positions, starts, args.blocks)

    # The step on the device: plan once if the route reads a plan, attend.
    d = {n: t.to(dev) for n, t in dict(q=q, kv=kv, table=table, seq_lens=seq_lens, req_ids=req_ids,
                                       positions=positions, ids=ids, counts=counts).items()}
    k_cache, v_cache = d["kv"][:, 0], d["kv"][:, 1]

    def plan():
        return selkv.qsa_plan(d["table"], d["seq_lens"], d["req_ids"], d["positions"], block_ids=d["ids"],
                              block_counts=d["counts"], num_q_heads=args.q_heads, num_kv_heads=args.kv_heads,
                              head_dim=D, num_pages=num_pages, page_size=P)

    def attend(md):
        return selkv.qsa_sparse_prefill(d["q"], k_cache, v_cache, d["table"], d["seq_lens"], d["req_ids"],
                                        d["positions"], block_ids=d["ids"], block_counts=d["counts"],
                                        metadata=md, return_lse=True)

    wanted = selkv.qsa_page4_wanted(T, args.blocks)
    md = plan() if wanted else None
    out, lse = attend(md)
    y = out.reshape(T, -1) @ layer.w_o.to(dev)  # the layer's output projection

    # Check a sample of rows (the last rows of each request see the most blocks).
    scale = 1.0 / math.sqrt(D)
    rows = torch.unique(torch.cat([torch.arange(T)[-args.check_rows // 2 :],
                                   torch.randperm(T, generator=gen)[: args.check_rows // 2]]))
    ref = reference(q[rows], kv[:, 0], kv[:, 1], table, req_ids[rows], positions[rows], ids[rows], counts[rows],
                    P, scale)
    got = out[rows.to(dev)].double().cpu()
    err = (got - ref).abs().max().item()
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    ok = err <= tol * max(1.0, ref.abs().max().item()) and bool(torch.isfinite(y).all())
    sm90 = dev.type == "cuda" and torch.cuda.get_device_capability(dev) == (9, 0)  # the page-4 kernel's GPUs
    route = ("page-4" if wanted and sm90 else "simple") if dev.type == "cuda" else "CPU oracle"
    print(f"QSA prefill step: {B} requests x {L} tokens = {T} rows, Hq {args.q_heads} Hkv {args.kv_heads} "
          f"D {D} {args.dtype}, top-{args.blocks} blocks + the partial block, page {P} ({route})")
    print(f"checked {rows.numel()} rows against the fp64 model: max |err| {err:.2e} -> {'OK' if ok else 'MISMATCH'}")

    if dev.type == "cuda":
        def timed(fn, reps=20):
            fn()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(reps):
                fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3 / reps

        planned = f"qsa_plan {timed(plan):.1f} us, " if wanted else ""
        print(f"{planned}qsa_sparse_prefill {timed(lambda: attend(md)):.1f} us (mean of 20, L2 warm)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
