#!/usr/bin/env python3
"""Cost of a selkv.dsa decode step against the sum of its kernels measured alone (issue 19 item 2
target: step <= 1.05 x sum, i.e. no hidden host work or extra copies).

    PYTHONPATH=python SELKV_OPS_LIBRARY=build/python/selkv/_selkv_ops.so python3 bench/dsa_step.py \
        [--quick] [--csv out.csv]

For each case (a decode-only step: B requests of S_q tokens, H heads, top-k K, contexts of
``s_kv`` tokens, page 64) it builds the inputs on the GPU and times, each as a CUDA graph replay
(one graph per measured thing, the same way for all):

- ``step``: ``DsaAttention.run`` (C1 write of the B*S_q new tokens, C2 conversion of their
  top-k, the decode plan, the C5 decode);
- each of those four ops alone, captured by itself with the same tensors.

Timing: CUDA events around each replay, median of ``--reps``; ``cold`` zeroes a 512 MiB buffer
before every timed replay (L2 flush, as the C++ harness does), ``warm`` replays back to back.
``ratio = step / sum(ops)``; the target is ``ratio <= 1.05``. The decode plan counts as one of the
step's kernels (a step re-plans inside the graph). Prints a table; ``--csv`` also writes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import selkv
from bench_common import git_hash, random_ds_mla_cache, write_csv

CASES = [  # (B, S_q, H, K, s_kv)
    (1, 1, 128, 2048, 8192),
    (8, 1, 128, 2048, 8192),
    (32, 1, 128, 2048, 16384),
    (64, 2, 128, 2048, 32768),
    (128, 1, 128, 2048, 4096),
    (64, 1, 64, 2048, 8192),
    (128, 2, 64, 2048, 8192),
]
QUICK = [CASES[1], CASES[2], CASES[5]]


def build(B, S, H, K, s_kv, page=64, dev="cuda"):
    g = torch.Generator().manual_seed(B * 131 + S * 7 + H + K + s_kv)
    nblk_req = -(-s_kv // page)
    num_blocks = B * nblk_req + 1
    bt = torch.randperm(num_blocks - 1, generator=g).to(torch.int32)[: B * nblk_req].view(B, nblk_req)
    cache = random_ds_mla_cache(selkv, num_blocks, page, dev)
    T = B * S
    q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
    latent = torch.randn(T, 512, device=dev).to(torch.bfloat16)
    rope = torch.randn(T, 64, device=dev).to(torch.bfloat16)
    pos = torch.arange(s_kv - S, s_kv, device=dev).repeat(B)  # the new tokens' positions
    req = torch.arange(B, device=dev).repeat_interleave(S)
    btd = bt.to(dev)
    slot_mapping = (btd[req, pos // page].long() * page + pos % page).contiguous()
    topk = torch.stack([torch.randperm(s_kv - S, device=dev)[:K] for _ in range(T)]).to(torch.int32)
    attn = selkv.DsaAttention(H, K, num_blocks=num_blocks, page_size=page, workspace_bytes=64 << 20,
                              max_num_tokens=T, max_num_reqs=B, sm_scale=576**-0.5, device=dev)
    attn.plan([i * S for i in range(B + 1)], [s_kv] * B, btd, slot_mapping, num_decodes=B)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    return dict(attn=attn, cache=cache, q=q, latent=latent, rope=rope, topk=topk, bt=btd,
                slot_mapping=slot_mapping, out=out, lse=lse, B=B, S=S, H=H, K=K, page=page,
                num_blocks=num_blocks)


def pieces(d):
    """The step and its ops alone, as closures over the same tensors."""
    a, B, S, H, K = d["attn"], d["B"], d["S"], d["H"], d["K"]
    T = B * S
    req_id = a._meta_views()[0]  # the wrapper's per-token request ids (planned)
    slots = a._slots[:T]
    md = a._decode_md

    def step():
        a.run(d["q"], d["cache"], d["topk"], d["latent"], d["rope"], out=d["out"], lse=d["lse"])

    def write():
        selkv.write_kv_cache(d["latent"], d["rope"], d["slot_mapping"], d["cache"])

    def convert():
        selkv.convert_req_indices_to_slots(d["topk"], req_id, d["bt"], d["page"], d["num_blocks"],
                                           return_valid_counts=False, out=slots)

    def plan():
        selkv.get_decode_metadata(B, S, H, K, out=md)

    def decode():
        selkv.sparse_mla_decode(d["q"].view(B, S, H, 576), d["cache"], slots.view(B, S, K), md, 576**-0.5,
                                out=d["out"].view(B, S, H, 512), lse=d["lse"].view(B, S, H), workspace=md.workspace)

    return {"step": step, "write_kv_cache": write, "convert": convert, "decode_plan": plan, "decode": decode}


def capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def time_graphs(graphs, reps, cold, flush):
    """Median us per graph; graphs interleaved rep by rep so drift hits all alike."""
    ts = {k: [] for k in graphs}
    for _ in range(reps):
        for k, g in graphs.items():
            if cold:
                flush.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            ts[k].append(e0.elapsed_time(e1) * 1e3)
    return {k: statistics.median(v) for k, v in ts.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description="selkv.dsa decode step vs the sum of its kernels")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--csv")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/dsa_step.py needs a CUDA GPU (SM90)")
        return 2
    git = git_hash()
    gpu = torch.cuda.get_device_name()
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    names = ["write_kv_cache", "convert", "decode_plan", "decode"]
    print(f"selkv.dsa decode step vs its kernels alone ({gpu}, {git}); us, median of {args.reps} graph replays")
    print(f"{'B':>4} {'S_q':>3} {'H':>4} {'K':>5} {'s_kv':>6} {'mode':>5} | {'step':>8} | "
          + " ".join(f"{n:>14}" for n in names) + f" | {'sum':>8} {'ratio':>6}")
    worst = 0.0
    for B, S, H, K, s_kv in (QUICK if args.quick else CASES):
        d = build(B, S, H, K, s_kv)
        fns = pieces(d)
        graphs = {k: capture(f) for k, f in fns.items()}
        for mode in ("cold", "warm"):
            t = time_graphs(graphs, args.reps, mode == "cold", flush)
            tot = sum(t[n] for n in names)
            ratio = t["step"] / tot
            worst = max(worst, ratio)
            print(f"{B:4d} {S:3d} {H:4d} {K:5d} {s_kv:6d} {mode:>5} | {t['step']:8.2f} | "
                  + " ".join(f"{t[n]:14.2f}" for n in names) + f" | {tot:8.2f} {ratio:6.3f}")
            rows.append(dict(B=B, S_q=S, H=H, K=K, s_kv=s_kv, mode=mode, step_us=round(t["step"], 3),
                             **{f"{n}_us": round(t[n], 3) for n in names}, sum_us=round(tot, 3),
                             ratio=round(ratio, 4), git_hash=git, gpu=gpu))
    print(f"worst ratio {worst:.3f} (target <= 1.05): {'PASS' if worst <= 1.05 else 'FAIL'}")
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
