"""Decode context parallelism (DCP) over ``torch.distributed`` (issue 19 item 3; DESIGN C9).

The KV cache of every request is sharded across the ``W`` ranks of a process group the way
vLLM's DCP shards it (interleave size 1): token ``t`` of a request lives on rank ``t % W``, at
position ``t // W`` of that rank's part of the request, which the rank's own block table maps to
its own pages. One decode step on each rank::

    local = dcp_local_positions(topk_positions, rank, W)     # global top-k -> local positions
    slots = convert_req_indices_to_slots(local, ...)          # through the rank's block table
    out_r, lse_r = sparse_mla_decode(q, local_cache, slots, md, ...)   # same K, same plan
    all-gather (out_r, lse_r) over the group; merge_attn_states over the W shards

:func:`dcp_sparse_mla_decode` does all of it. Every rank attends with the same ``K`` and the same
``topk_length`` (entries it does not own become ``-1``, which the decode skips by DESIGN §2), so
one plan shape serves all ranks; a row with no owned entry gives ``out = 0``, ``lse = -inf`` on
that rank, which the merge reads as an empty shard. ``attn_sink`` is applied after the merge (it
needs the global lse). The step synchronizes no host and is CUDA-graph capturable when the
collective is (NCCL); ``gather_out`` / ``gather_lse`` / ``out`` / ``lse`` can be preallocated
(the step still allocates its temporaries: the local positions and slots, the rank's partial
``out`` / ``lse``, and with ``attn_sink`` the merge's sink shard).

:func:`dcp_slot_mapping` is the write side (the slots of new tokens on this rank, ``-1`` for
tokens other ranks own, as :func:`selkv.write_kv_cache` skips them), and
:func:`dcp_shard_kv_cache` builds one rank's shard of a full cache (host-side, for tests).
"""

from __future__ import annotations

import torch

from ._ops import expect_dims
from .cache_ops import convert_req_indices_to_slots
from .decode import DecodeMetadata, sparse_mla_decode
from .merge import merge_attn_states

__all__ = [
    "dcp_all_gather",
    "dcp_local_decode",
    "dcp_local_positions",
    "dcp_merge",
    "dcp_shard_kv_cache",
    "dcp_slot_mapping",
    "dcp_sparse_mla_decode",
]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise RuntimeError(f"selkv.dcp: rank {rank} is not in [0, world_size={world_size})")


def dcp_local_positions(positions: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Global request-local token positions -> this rank's local positions.

    ``t >= 0`` with ``t % world_size == rank`` maps to ``t // world_size``; everything else
    (other ranks' tokens, negative entries) to ``-1``. int32 in, int32 out, same shape.
    """
    _check_rank(rank, world_size)
    p = positions
    owned = (p >= 0) & (torch.remainder(p, world_size) == rank)
    return torch.where(owned, torch.div(p, world_size, rounding_mode="floor"),
                       torch.full((), -1, dtype=p.dtype, device=p.device)).to(torch.int32)


def dcp_slot_mapping(
    positions: torch.Tensor,
    req_ids: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    rank: int,
    world_size: int,
) -> torch.Tensor:
    """The slots of new tokens in this rank's shard (for :func:`selkv.write_kv_cache`).

    Args:
        positions: int ``[T]`` request-local positions of the tokens.
        req_ids: int ``[T]`` the request (row of ``block_table``) of each token.
        block_table: int32 ``[num_reqs, max_local_blocks]``, this rank's block table (local
            position ``p`` of request ``r`` is in block ``block_table[r, p // page_size]``).
        page_size, rank, world_size: as named.

    Returns:
        int64 ``[T]``: the local slot of each token this rank owns, ``-1`` for the others and
        for tokens whose request id is outside ``[0, num_reqs)`` (padding, e.g. ``-1``) or whose
        block is not in the table, as :func:`selkv.convert_req_indices_to_slots` treats them.
    """
    op = "selkv.dcp_slot_mapping"
    expect_dims(op, "positions", positions, 1, "[T]")
    expect_dims(op, "req_ids", req_ids, 1, "[T]")
    expect_dims(op, "block_table", block_table, 2, "[num_reqs, max_local_blocks]")
    if req_ids.shape[0] != positions.shape[0]:
        raise RuntimeError(f"{op}: req_ids: expected [T] = [{positions.shape[0]}] like positions, got "
                           f"{tuple(req_ids.shape)}")
    if int(page_size) < 1:
        raise RuntimeError(f"{op}: page_size: must be >= 1, got {page_size}")
    local = dcp_local_positions(positions, rank, world_size).long()
    if block_table.numel() == 0:  # no request has a block here
        return torch.full(positions.shape, -1, dtype=torch.int64, device=positions.device)
    req = req_ids.long()
    owned = (local >= 0) & (req >= 0) & (req < block_table.shape[0])
    safe = torch.where(owned, local, 0)
    col = safe // page_size
    in_table = col < block_table.shape[1]
    # (indices clamped first: a padding request id is never used to index the table)
    blk = block_table[torch.where(owned, req, 0), torch.where(in_table, col, 0)].long()
    slot = blk * page_size + safe % page_size
    ok = owned & in_table & (blk >= 0)
    return torch.where(ok, slot, torch.full((), -1, dtype=torch.int64, device=slot.device))


def dcp_shard_kv_cache(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: list[int] | torch.Tensor,
    rank: int,
    world_size: int,
    *,
    page_size: int | None = None,
    num_blocks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Builds rank ``rank``'s shard of a full paged cache (host-side helper, for tests).

    Copies the records of tokens ``t < seq_lens[r]`` with ``t % world_size == rank`` of every
    request ``r`` into a fresh cache at local positions ``t // world_size``, blocks allocated
    consecutively request by request. Per-token record formats only (``ds_mla_fp8``,
    ``nope_fp8``).

    Returns:
        ``(local_cache [num_blocks, page_size, rec], local_block_table int32 [R, max_blocks])``,
        unused table entries ``-1``. ``page_size`` defaults to the full cache's; ``num_blocks``
        to the blocks needed (at least 1).
    """
    _check_rank(rank, world_size)
    full_page = cache.shape[1]
    page = full_page if page_size is None else int(page_size)
    lens = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
    n_local = [max(0, (n - rank + world_size - 1) // world_size) for n in lens]
    n_blk = [(n + page - 1) // page for n in n_local]
    need = sum(n_blk)
    nb = max(need, 1) if num_blocks is None else int(num_blocks)
    if nb < need:
        raise RuntimeError(f"selkv.dcp_shard_kv_cache: {need} blocks needed, num_blocks={nb}")
    table = torch.full((len(lens), max(max(n_blk, default=0), 1)), -1, dtype=torch.int32)
    local_cache = torch.zeros((nb, page, cache.shape[2]), dtype=cache.dtype, device=cache.device)
    bt = block_table.cpu().long()
    nxt = 0
    for r, n in enumerate(lens):
        table[r, : n_blk[r]] = torch.arange(nxt, nxt + n_blk[r], dtype=torch.int32)
        nxt += n_blk[r]
        if n_local[r] == 0:
            continue
        t = torch.arange(rank, n, world_size)
        loc = t // world_size
        src_b, src_o = bt[r, t // full_page], t % full_page
        dst_b, dst_o = table[r, loc // page].long(), loc % page
        dev = cache.device
        local_cache[dst_b.to(dev), dst_o.to(dev)] = cache[src_b.to(dev), src_o.to(dev)]
    return local_cache, table.to(block_table.device)


def dcp_local_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_positions: torch.Tensor,
    block_table: torch.Tensor,
    metadata: DecodeMetadata,
    sm_scale: float | None = None,
    *,
    rank: int,
    world_size: int,
    topk_length: torch.Tensor | None = None,
    req_id_per_token: torch.Tensor | None = None,
    token_seq_lens: torch.Tensor | None = None,
    indices_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's partial decode over its shard (no communication).

    Args:
        q: bf16 ``[B, S_q, H, 576]``, the same on every rank.
        kv_cache: this rank's shard ``uint8 [num_blocks, page_size, 656]``.
        topk_positions: int32 ``[B, S_q, K]`` global request-local token positions (the
            indexer's top-k; negative = none), the same on every rank.
        block_table: int32 ``[num_reqs, max_local_blocks]``, this rank's block table; row
            ``req_id_per_token[b * S_q + s]`` serves query row ``(b, s)`` (default: row ``b``).
        metadata: the plan for ``(B, S_q, H, K, topk_length)`` (as for the full-cache decode).
        topk_length: optional int32 ``[B]``, the plan's tensor; applies to the global entries.
        token_seq_lens: optional int32 ``[>= B * S_q]``, each query row's request length in global
            tokens (e.g. after this step's write): a position at or past it is invalid (skipped,
            never read) on every rank. Without it positions are bounded by the local block table
            only, so a position in ``[seq_len, allocated)`` reads its (stale or unwritten) slot.
        indices_out: optional int32 ``[B, S_q, K]`` buffer for the local slots.
        out, lse, workspace: as for :func:`selkv.sparse_mla_decode` (no ``attn_sink`` here:
            it is applied after the merge).

    Returns:
        ``(out [B, S_q, H, 512] bf16, lse [B, S_q, H] fp32)`` over the owned selected tokens
        (``0`` / ``-inf`` for a row with none).
    """
    op = "selkv.dcp_local_decode"
    expect_dims(op, "topk_positions", topk_positions, 3, "[B, S_q, K]")
    expect_dims(op, "kv_cache", kv_cache, 3, "[num_blocks, page_size, 656]")
    B, S, K = topk_positions.shape
    if req_id_per_token is None:
        req_id_per_token = torch.arange(B, dtype=torch.int32, device=topk_positions.device)
        req_id_per_token = req_id_per_token.repeat_interleave(S)
    local = dcp_local_positions(topk_positions, rank, world_size).view(B * S, K)
    local_lens = None
    if token_seq_lens is not None:
        expect_dims(op, "token_seq_lens", token_seq_lens, 1, "[>= B * S_q]")
        # this rank holds global positions rank, rank + W, ...: local p < ceil((len - rank) / W)
        local_lens = torch.clamp(token_seq_lens.to(torch.int64) - rank + world_size - 1, min=0)
        local_lens = local_lens.div(world_size, rounding_mode="floor").to(torch.int32)
    slots, _ = convert_req_indices_to_slots(
        local,
        req_id_per_token,
        block_table,
        kv_cache.shape[1],
        kv_cache.shape[0],
        return_valid_counts=False,
        out=None if indices_out is None else indices_out.view(B * S, K),
        token_seq_lens=local_lens,
    )
    return sparse_mla_decode(q, kv_cache, slots.view(B, S, K), metadata, sm_scale,
                             topk_length=topk_length, out=out, lse=lse, workspace=workspace)


def dcp_all_gather(
    out: torch.Tensor,
    lse: torch.Tensor,
    group=None,
    *,
    gather_out: torch.Tensor | None = None,
    gather_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gathers every rank's partial ``(out [..., H, D], lse [..., H])`` into stacked
    ``[W, ...]`` tensors (rank order), two ``all_gather_into_tensor`` calls (any backend:
    bf16 / fp16 travel as bytes, which every backend moves)."""
    import torch.distributed as dist

    W = dist.get_world_size(group)
    if gather_out is None:
        gather_out = torch.empty((W, *out.shape), dtype=out.dtype, device=out.device)
    if gather_lse is None:
        gather_lse = torch.empty((W, *lse.shape), dtype=lse.dtype, device=lse.device)

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.uint8) if t.dtype in (torch.bfloat16, torch.float16) else t

    dist.all_gather_into_tensor(raw(gather_out).view(-1), raw(out.contiguous()).view(-1),
                                group=group)
    dist.all_gather_into_tensor(gather_lse.view(-1), lse.contiguous().view(-1), group=group)
    return gather_out, gather_lse


def dcp_merge(
    outs: torch.Tensor,
    lses: torch.Tensor,
    *,
    attn_sink: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merges stacked partial decodes ``outs [W, B, S_q, H, D]``, ``lses [W, B, S_q, H]`` with
    :func:`selkv.merge_attn_states` (C9), then applies ``attn_sink`` (fp32 ``[H]``:
    ``out *= 1 / (1 + exp(attn_sink[h] - lse))``) when given.

    Returns ``(out [B, S_q, H, D], lse [B, S_q, H])``.
    """
    expect_dims("selkv.dcp_merge", "outs", outs, 5, "[W, B, S_q, H, D]")
    W, B, S, H, D = outs.shape
    T = B * S
    if out is None:
        out = torch.empty((B, S, H, D), dtype=outs.dtype, device=outs.device)
    if lse is None:
        lse = torch.empty((B, S, H), dtype=torch.float32, device=outs.device)
    if attn_sink is None:
        merge_attn_states(outs.view(W, T, H, D), lses.view(W, T, H),
                          out=out.view(T, H, D), lse=lse.view(T, H))
        return out, lse
    if attn_sink.dim() != 1 or attn_sink.shape[0] != H:  # (expand would broadcast a [1] silently)
        raise RuntimeError(f"selkv.dcp_merge: attn_sink: expected [num_heads] = [{H}], got "
                           f"{list(attn_sink.shape)}")
    # The sink is one more shard with out 0 and lse attn_sink[h]: sum_i w_i out_i / (sum_i w_i +
    # exp(sink - m)) is the sink formula, rounded once. The returned lse excludes the sink.
    shards = list(outs.view(W, T, H, D).unbind(0))
    shard_lses = list(lses.view(W, T, H).unbind(0))
    shards.append(torch.zeros_like(shards[0]))
    shard_lses.append(attn_sink.to(torch.float32).expand(T, H).contiguous())
    merge_attn_states(shards, shard_lses, out=out.view(T, H, D), return_lse=False)
    torch.logsumexp(lses.view(W, T, H), dim=0, out=lse.view(T, H))
    return out, lse


def dcp_sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_positions: torch.Tensor,
    block_table: torch.Tensor,
    metadata: DecodeMetadata,
    sm_scale: float | None = None,
    *,
    group=None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    req_id_per_token: torch.Tensor | None = None,
    token_seq_lens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    gather_out: torch.Tensor | None = None,
    gather_lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over a KV cache sharded across the ranks of ``group`` (token ``t`` on
    rank ``t % W``): :func:`dcp_local_decode` on this rank's shard, :func:`dcp_all_gather`,
    :func:`dcp_merge`. Every rank gets the full result.

    Arguments are :func:`dcp_local_decode`'s (rank and world size from ``group``, default the
    default group) plus ``attn_sink`` (fp32 ``[H]``, applied after the merge), the outputs
    ``out`` / ``lse`` and the gather buffers ``gather_out`` bf16 ``[W, B, S_q, H, 512]`` /
    ``gather_lse`` fp32 ``[W, B, S_q, H]`` (row ``r`` holds rank ``r``'s partial). Equals :func:`selkv.sparse_mla_decode` over the whole cache with the global
    slots, within DESIGN §5's tolerances.
    """
    import torch.distributed as dist

    W, rank = dist.get_world_size(group), dist.get_rank(group)
    expect_dims("selkv.dcp_sparse_mla_decode", "topk_positions", topk_positions, 3, "[B, S_q, K]")
    expect_dims("selkv.dcp_sparse_mla_decode", "q", q, 4, "[B, S_q, H, 576]")
    B, S, _ = topk_positions.shape
    H = q.shape[2]
    if gather_out is None:
        gather_out = torch.empty((W, B, S, H, 512), dtype=torch.bfloat16, device=q.device)
    if gather_lse is None:
        gather_lse = torch.empty((W, B, S, H), dtype=torch.float32, device=q.device)
    # The partial goes to its own buffers (the collective's input must not alias its output).
    part_out, part_lse = dcp_local_decode(
        q, kv_cache, topk_positions, block_table, metadata, sm_scale, rank=rank, world_size=W,
        topk_length=topk_length, req_id_per_token=req_id_per_token, token_seq_lens=token_seq_lens,
        workspace=workspace)
    dcp_all_gather(part_out, part_lse, group, gather_out=gather_out, gather_lse=gather_lse)
    return dcp_merge(gather_out, gather_lse, attn_sink=attn_sink, out=out, lse=lse)
