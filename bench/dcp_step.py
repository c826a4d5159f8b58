#!/usr/bin/env python3
"""Decode context parallelism (selkv.dcp) on W GPUs beside the single-GPU step (issue 19 item 3:
the attention step's time at B = 64, S_q = 2, H = 128, K = 2048 next to one GPU's).

    PYTHONPATH=python SELKV_OPS_LIBRARY=build/python/selkv/_selkv_ops.so python3 bench/dcp_step.py \
        [--world-size 2] [--s-kv 32768] [--reps 50] [--csv out.csv]
    python3 bench/dcp_step.py --smoke        # 2 CPU processes over gloo, a tiny shape (the CPU ops)

One process per GPU (NCCL; spawned here). Rank r holds its shard of every request's cache (token t
on rank t % W at local position t // W, blocks of a request consecutive; random finite FP8
records, bench_common.random_ds_mla_cache); q and the global top-k positions (K distinct tokens
of each request's s_kv) are the same on every rank. Timed with CUDA events, median of --reps,
every rep after a barrier; `cold` zeroes a 512 MiB buffer before each rep (L2 flush), `warm`
does not:

- ``dcp_step``: :func:`selkv.dcp.dcp_sparse_mla_decode` (global -> local positions -> slots, the
  decode over the shard, the all-gather of (out, lse), the merge), eager, as an engine calls it;
- its pieces alone: ``local`` (positions, slots and decode), ``all_gather``, ``merge``;
- ``single_gpu_step`` on rank 0 with the whole cache: slots (C2) + decode over it, eager.

Every DCP figure is the slowest rank's (the step ends when the last merge does).
``ratio = dcp_step / single_gpu_step``. Prints a table; ``--csv`` also writes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from bench_common import git_hash, random_ds_mla_cache, write_csv

PIECES = ["dcp_step", "local", "all_gather", "merge", "single_gpu_step"]


def shard_table(B, s_kv, page, rank, W):
    """This rank's block table: request r's local tokens in consecutive blocks."""
    n_local = (s_kv - rank + W - 1) // W
    n_blk = (n_local + page - 1) // page
    table = torch.arange(B * n_blk, dtype=torch.int32).view(B, n_blk)
    return table, B * n_blk


def timer(dev):
    if dev.type == "cuda":
        def run(fn):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
    return run


def worker(rank, W, init_file, backend, args, result_dir):
    import torch.distributed as dist

    import selkv

    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=W)
    try:
        B, S, H, K, s_kv, page = args.batch, args.sq, args.heads, args.topk, args.s_kv, args.page
        T = B * S
        sm_scale = 576**-0.5
        g = torch.Generator().manual_seed(1234 + B + S + H + K + s_kv)
        q = (torch.randn(B, S, H, 576, generator=g) / 4).to(torch.bfloat16).to(dev)
        topk = torch.rand(T, s_kv, generator=g).argsort(dim=1)[:, :K].to(torch.int32).view(B, S, K).to(dev)
        table, nb = shard_table(B, s_kv, page, rank, W)
        shard = random_ds_mla_cache(selkv, nb, page, dev, seed=99 + rank)
        table = table.to(dev)
        md = selkv.get_decode_metadata(B, S, H, K, None, device=dev)
        out = torch.empty(B, S, H, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(B, S, H, dtype=torch.float32, device=dev)
        part_out, part_lse = torch.empty_like(out), torch.empty_like(lse)
        gather_out = torch.empty(W, B, S, H, 512, dtype=torch.bfloat16, device=dev)
        gather_lse = torch.empty(W, B, S, H, dtype=torch.float32, device=dev)
        slots = torch.empty(B, S, K, dtype=torch.int32, device=dev)

        def dcp_step():
            selkv.dcp.dcp_sparse_mla_decode(q, shard, topk, table, md, sm_scale, out=out, lse=lse,
                                            gather_out=gather_out, gather_lse=gather_lse)

        def local():
            selkv.dcp.dcp_local_decode(q, shard, topk, table, md, sm_scale, rank=rank, world_size=W,
                                       indices_out=slots, out=part_out, lse=part_lse)

        def all_gather():
            selkv.dcp.dcp_all_gather(part_out, part_lse, gather_out=gather_out, gather_lse=gather_lse)

        def merge():
            selkv.dcp.dcp_merge(gather_out, gather_lse, out=out, lse=lse)

        run = timer(dev)
        flush = torch.empty((512 << 20) if dev.type == "cuda" else 1, dtype=torch.uint8, device=dev)

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        def timed(fn, cold, alone=False):
            for _ in range(2):  # warm-up
                fn()
            ts = []
            for _ in range(args.reps):
                if cold:
                    flush.zero_()
                sync()
                if not alone:
                    dist.barrier()
                ts.append(run(fn))
            return statistics.median(ts)

        results = {}
        for mode in ("cold", "warm"):
            t = {n: timed(f, mode == "cold") for n, f in
                 (("dcp_step", dcp_step), ("local", local), ("all_gather", all_gather), ("merge", merge))}
            results[mode] = t
        # The single-GPU step on rank 0: the whole cache, its slots, the same decode.
        if rank == 0:
            full_blocks = B * ((s_kv + page - 1) // page)
            full = random_ds_mla_cache(selkv, full_blocks, page, dev, seed=98)
            full_table = torch.arange(full_blocks, dtype=torch.int32).view(B, -1).to(dev)
            req = torch.arange(B, dtype=torch.int32, device=dev).repeat_interleave(S)
            full_slots = torch.empty(T, K, dtype=torch.int32, device=dev)

            def single():
                selkv.convert_req_indices_to_slots(topk.view(T, K), req, full_table, page, full_blocks,
                                                   return_valid_counts=False, out=full_slots)
                selkv.sparse_mla_decode(q, full, full_slots.view(B, S, K), md, sm_scale, out=out, lse=lse)

            for mode in ("cold", "warm"):
                results[mode]["single_gpu_step"] = timed(single, mode == "cold", alone=True)
            del full
        dist.barrier()
        torch.save(results, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description="DCP decode step on W GPUs beside the single-GPU step")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sq", type=int, default=2)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--s-kv", type=int, default=32768)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="2 CPU processes over gloo, a tiny shape")
    ap.add_argument("--csv")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    if args.smoke:
        backend = "gloo"
        args.world_size, args.batch, args.sq, args.heads, args.topk, args.s_kv, args.reps = 2, 2, 1, 64, 64, 256, 2
        gpu = "cpu"
    else:
        backend = "nccl"
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.world_size:
            print(f"bench/dcp_step.py needs {args.world_size} CUDA GPUs (SM90); --smoke runs on the CPU")
            return 2
        gpu = torch.cuda.get_device_name()
    W = args.world_size
    git = git_hash()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        mp.start_processes(worker, args=(W, init_file, backend, args, tmp), nprocs=W, join=True, start_method="spawn")
        per_rank = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(W)]
    rows = []
    print(f"DCP decode step on {W} x {gpu} beside one ({git}); us, median of {args.reps}, slowest rank")
    print(f"{'W':>2} {'B':>4} {'S_q':>3} {'H':>4} {'K':>5} {'s_kv':>6} {'mode':>5} | "
          + " ".join(f"{n:>15}" for n in PIECES) + f" | {'ratio':>6}")
    for mode in ("cold", "warm"):
        t = {n: max(pr[mode][n] for pr in per_rank) for n in PIECES[:-1]}
        t["single_gpu_step"] = per_rank[0][mode]["single_gpu_step"]
        ratio = t["dcp_step"] / t["single_gpu_step"]
        print(f"{W:2d} {args.batch:4d} {args.sq:3d} {args.heads:4d} {args.topk:5d} {args.s_kv:6d} {mode:>5} | "
              + " ".join(f"{t[n]:15.2f}" for n in PIECES) + f" | {ratio:6.3f}")
        rows.append(dict(W=W, B=args.batch, S_q=args.sq, H=args.heads, K=args.topk, s_kv=args.s_kv, mode=mode,
                         **{f"{n}_us": round(t[n], 3) for n in PIECES}, ratio=round(ratio, 4), git_hash=git, gpu=gpu))
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
