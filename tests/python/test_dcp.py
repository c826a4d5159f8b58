"""Tests of decode context parallelism (selkv.dcp, issue 19 item 3).

The cache of each request is sharded token-interleaved (token t on rank t % W); each rank
decodes over the selected tokens it owns and the partials are merged with C9. Checked against
selkv.sparse_mla_decode over the whole cache (DESIGN §5 tolerances, test_decode's rule):
- CPU, one process: W = 2 and 3 simulated (per-rank decode + merge, no process group), with
  rows whose selection lies on one rank only, rows without a valid entry, invalid entries,
  dynamic topk_length with valid-looking positions past it, and attn_sink;
- the write side: dcp_slot_mapping + write_kv_cache builds the same shard as dcp_shard_kv_cache;
- CPU, 2 processes over gloo: the full distributed path (all-gather + merge);
- CUDA, 2 GPUs over NCCL: the same (skips with fewer than 2 GPUs).
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")

import types  # noqa: E402

from _design_checks import assert_close_design  # noqa: E402  (tests/python is on sys.path)
from test_decode import ref_decode  # noqa: E402

INT32_MAX = 2**31 - 1
SM_SCALE = 576**-0.55
B, S, H, K, PAGE = 4, 2, 64, 128, 64


def make_case(selkv, seed, *, dynamic, sink, world_sizes=(2, 3)):
    """A full paged cache (shuffled blocks) with every token < seq_len written, request-local
    top-k positions with invalid entries, a row on one rank only and an all-invalid row."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [300, 257, 200, 130]
    max_blocks = (max(seq_lens) + PAGE - 1) // PAGE
    num_blocks = B * max_blocks + 3
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = perm[: B * max_blocks].view(B, max_blocks).contiguous()
    cache = torch.full((num_blocks, PAGE, 656), 0xFF, dtype=torch.uint8)  # NaN where unwritten
    pos = torch.cat([torch.arange(n) for n in seq_lens])
    req = torch.cat([torch.full((n,), r) for r, n in enumerate(seq_lens)])
    slot = table[req, pos // PAGE].long() * PAGE + pos % PAGE
    latent = (torch.randn(pos.numel(), 512, generator=gen) / 10).clamp(-1, 1).to(torch.bfloat16)
    rope = (torch.randn(pos.numel(), 64, generator=gen) / 10).clamp(-1, 1).to(torch.bfloat16)
    selkv.write_kv_cache(latent, rope, slot, cache)

    idx = torch.empty(B, S, K, dtype=torch.int32)
    for b in range(B):
        for s in range(S):
            idx[b, s] = torch.randperm(seq_lens[b], generator=gen)[:K].to(torch.int32)
    bad = torch.tensor([-1, -2, -7, INT32_MAX], dtype=torch.int32)
    mask = torch.rand(B, S, K, generator=gen) < 0.06
    idx = torch.where(mask, bad[torch.randint(0, 4, (B, S, K), generator=gen)], idx)
    # Row (0, 1): only multiples of 6 (rank 0 for W = 2 and 3); row (3, 0): nothing valid.
    n6 = seq_lens[0] // 6  # 50 < K: the rest of the row is -1
    idx[0, 1] = -1
    idx[0, 1, :n6] = (torch.randperm(n6, generator=gen) * 6).to(torch.int32)
    idx[3, 0] = bad[torch.arange(K) % 4]
    # Row (1, *): only odd positions (rank 1 for W = 2).
    odd = torch.arange(1, seq_lens[1], 2)
    for s in range(S):
        idx[1, s] = odd[torch.randperm(odd.numel(), generator=gen)[:K]].to(torch.int32)
    topk_length = None
    if dynamic:
        # Entries past the length are valid positions: they must be ignored everywhere.
        topk_length = torch.tensor([K, 0, 65, 17], dtype=torch.int32)
    q = torch.randn(B, S, H, 576, generator=gen).to(torch.bfloat16)
    attn_sink = torch.randn(H, generator=gen) if sink else None
    return dict(q=q, cache=cache, table=table, seq_lens=seq_lens, idx=idx,
                topk_length=topk_length, sink=attn_sink, latent=latent, rope=rope)


def global_slots(selkv, c):
    req = torch.arange(B, dtype=torch.int32).repeat_interleave(S)
    slots, _ = selkv.convert_req_indices_to_slots(
        c["idx"].view(B * S, K), req, c["table"], PAGE, c["cache"].shape[0])
    return slots.view(B, S, K)


def reference64(selkv, c):
    """test_decode's independent fp64 reference over the whole cache (global slots): the
    oracle DESIGN §5's tolerances are stated against. The DCP result rounds twice (the
    partials and the merge), so it is held to the oracle, not to the bf16 output of a
    full-cache decode."""
    case = types.SimpleNamespace(B=B, S=S, H=H, K=K, page=PAGE, cache=c["cache"], q=c["q"],
                                 indices=global_slots(selkv, c), topk_length=c["topk_length"],
                                 sink=c["sink"], num_slots=c["cache"].shape[0] * PAGE)
    return ref_decode(case, SM_SCALE)


def reference(selkv, c, device="cpu"):
    """sparse_mla_decode over the whole cache with the global slots."""
    dev = torch.device(device)
    slots = global_slots(selkv, c)
    tl = None if c["topk_length"] is None else c["topk_length"].to(dev)
    md = selkv.get_decode_metadata(B, S, H, K, tl, device=dev)
    sink = None if c["sink"] is None else c["sink"].to(dev)
    return selkv.sparse_mla_decode(c["q"].to(dev), c["cache"].to(dev), slots.to(dev),
                                   md, SM_SCALE, topk_length=tl, attn_sink=sink)


# ---- (a) one process, ranks simulated ------------------------------------------------------------
@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("dynamic,sink", [(False, False), (True, False), (False, True)])
def test_simulated_ranks_match_full_cache(selkv, gen, W, dynamic, sink):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    c = make_case(selkv, seed, dynamic=dynamic, sink=sink)
    ref_out, ref_lse = reference64(selkv, c)
    full_out, full_lse = reference(selkv, c)  # the full-cache decode, itself within §5
    assert_close_design(full_out, full_lse, ref_out, ref_lse, "full-cache decode")
    md = selkv.get_decode_metadata(B, S, H, K, c["topk_length"], device="cpu")
    outs, lses = [], []
    for r in range(W):
        shard, table = selkv.dcp.dcp_shard_kv_cache(c["cache"], c["table"], c["seq_lens"], r, W)
        o, l = selkv.dcp.dcp_local_decode(c["q"], shard, c["idx"], table, md, SM_SCALE, rank=r,
                                          world_size=W, topk_length=c["topk_length"])
        outs.append(o)
        lses.append(l)
    # The one-rank rows are empty (0 / -inf) on the other ranks.
    assert bool((lses[1][0, 1] == float("-inf")).all()) and bool((outs[1][0, 1] == 0).all())
    if W == 2:
        assert bool((lses[0][1] == float("-inf")).all())
    out, lse = selkv.dcp.dcp_merge(torch.stack(outs), torch.stack(lses), attn_sink=c["sink"])
    assert_close_design(out, lse, ref_out, ref_lse, f"W{W} dyn{dynamic}")
    assert torch.equal(torch.isinf(lse), torch.isinf(full_lse))  # the same empty rows
    assert bool(torch.isinf(lse[3, 0]).all())
    if dynamic:
        assert bool(torch.isinf(lse[1]).all()) and bool((out[1] == 0).all())  # topk_length 0


def test_local_positions(selkv):
    p = torch.tensor([0, 1, 2, 3, 4, 5, -1, -2, -3, INT32_MAX, 7], dtype=torch.int32)
    assert selkv.dcp.dcp_local_positions(p, 0, 2).tolist() == [0, -1, 1, -1, 2, -1, -1, -1, -1,
                                                                -1, -1]
    assert selkv.dcp.dcp_local_positions(p, 1, 3).tolist() == [-1, 0, -1, -1, 1, -1, -1, -1, -1,
                                                                (INT32_MAX - 1) // 3, 2]
    with pytest.raises(RuntimeError, match="rank"):
        selkv.dcp.dcp_local_positions(p, 2, 2)


def test_slot_mapping_write_builds_the_shard(selkv, gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    c = make_case(selkv, seed, dynamic=False, sink=False)
    W = 3
    pos = torch.cat([torch.arange(n) for n in c["seq_lens"]])
    req = torch.cat([torch.full((n,), r) for r, n in enumerate(c["seq_lens"])])
    full_slot = c["table"][req, pos // PAGE].long() * PAGE + pos % PAGE
    records = c["cache"].view(-1, 656)[full_slot]
    for r in range(W):
        shard, table = selkv.dcp.dcp_shard_kv_cache(c["cache"], c["table"], c["seq_lens"], r, W)
        slot = selkv.dcp.dcp_slot_mapping(pos, req, table, PAGE, r, W)
        assert bool(((slot >= 0) == (pos % W == r)).all())
        mine = slot >= 0
        assert torch.equal(shard.view(-1, 656)[slot[mine]], records[mine])
        fresh = torch.zeros_like(shard)
        selkv.write_kv_cache(c["latent"], c["rope"], slot, fresh)  # the engine's write path
        assert torch.equal(fresh.view(-1, 656)[slot[mine]], records[mine])


def test_slot_mapping_skips_padding_requests(selkv):
    """A request id outside [0, num_reqs) (padding, e.g. -1) maps to -1, as
    convert_req_indices_to_slots treats it: never a slot of another request (a -1 read as the
    table's last row would overwrite that request's token), never an out-of-range table read."""
    table = torch.tensor([[10, 11], [20, 21], [30, 31]], dtype=torch.int32)
    pos = torch.tensor([0, 0, 0, 1, 64, 300])
    req = torch.tensor([-1, 3, 1, 2**40, 0, 0])
    slot = selkv.dcp.dcp_slot_mapping(pos, req, table, 64, 0, 2)
    assert slot.tolist() == [-1, -1, 20 * 64, -1, 10 * 64 + 32, -1]
    assert selkv.dcp.dcp_slot_mapping(pos, req, table[:0], 64, 0, 2).tolist() == [-1] * 6
    with pytest.raises(RuntimeError, match="dcp_slot_mapping: page_size: must be >= 1"):
        selkv.dcp.dcp_slot_mapping(pos, req, table, 0, 0, 2)
    with pytest.raises(RuntimeError, match=r"dcp_slot_mapping: req_ids: expected \[T\] = \[6\] like positions"):
        selkv.dcp.dcp_slot_mapping(pos, req[:2], table, 64, 0, 2)
    with pytest.raises(RuntimeError, match="dcp_slot_mapping: block_table"):
        selkv.dcp.dcp_slot_mapping(pos, req, table[0], 64, 0, 2)


def test_merge_checks_the_sink_shape(selkv):
    outs = torch.zeros(2, 1, 1, 4, 8, dtype=torch.bfloat16)
    lses = torch.zeros(2, 1, 1, 4)
    selkv.dcp.dcp_merge(outs, lses, attn_sink=torch.zeros(4))
    for bad in (torch.zeros(1), torch.zeros(2, 2)):
        with pytest.raises(RuntimeError, match=r"dcp_merge: attn_sink: expected \[num_heads\] = \[4\]"):
            selkv.dcp.dcp_merge(outs, lses, attn_sink=bad)


# ---- (b), (c) the distributed path --------------------------------------------------------------
def _worker(rank, world_size, init_file, backend, seed, dynamic, result_dir):
    import torch.distributed as dist

    import selkv

    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        c = make_case(selkv, seed, dynamic=dynamic, sink=True)
        shard, table = selkv.dcp.dcp_shard_kv_cache(c["cache"], c["table"], c["seq_lens"], rank,
                                                    world_size)
        tl = None if c["topk_length"] is None else c["topk_length"].to(dev)
        md = selkv.get_decode_metadata(B, S, H, K, tl, device=dev)
        out, lse = selkv.dcp.dcp_sparse_mla_decode(
            c["q"].to(dev), shard.to(dev), c["idx"].to(dev), table.to(dev), md, SM_SCALE,
            topk_length=tl, attn_sink=c["sink"].to(dev))
        if backend == "nccl":
            torch.cuda.synchronize(dev)
        torch.save((out.cpu(), lse.cpu()), os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_distributed(selkv, gen, backend, dynamic, device):
    import torch.multiprocessing as mp

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        try:
            ctx = mp.start_processes(_worker, args=(2, init_file, backend, seed, dynamic, tmp),
                                     nprocs=2, join=False, start_method="spawn")
        except (OSError, RuntimeError) as e:  # platform cannot spawn
            pytest.skip(f"cannot spawn worker processes: {e}")
        deadline = time.monotonic() + 120
        finished = False
        try:  # join() returns False until every worker is done; it raises if one failed
            while not finished and time.monotonic() < deadline:
                finished = ctx.join(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in ctx.processes:  # never leave a hung worker behind
                if p.is_alive():
                    p.kill()
        assert finished, "distributed workers did not finish within 120 s"
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    c = make_case(selkv, seed, dynamic=dynamic, sink=True)
    ref_out, ref_lse = reference64(selkv, c)
    full_out, full_lse = reference(selkv, c, device)  # single-device decode, whole cache
    assert_close_design(full_out, full_lse, ref_out, ref_lse, f"{device} full-cache decode")
    for r, (out, lse) in enumerate(results):
        assert out.shape == (B, S, H, 512) and lse.shape == (B, S, H)
        assert_close_design(out, lse, ref_out, ref_lse, f"{backend} rank {r}")
        assert torch.equal(torch.isinf(lse), torch.isinf(full_lse.cpu()))
    # Every rank holds the same merged result.
    assert torch.equal(results[0][0].view(torch.int16), results[1][0].view(torch.int16))
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dynamic", [False, True])
def test_gloo_two_processes(selkv, gen, dynamic):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    _run_distributed(selkv, gen, "gloo", dynamic, "cpu")


def test_nccl_two_gpus(selkv, gen):
    import torch.distributed as dist

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    _run_distributed(selkv, gen, "nccl", True, "cuda")
