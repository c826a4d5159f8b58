"""KV-cache operations (DESIGN C1-C3): cache write, index conversion, gather + upconvert.

Each function wraps one out-variant operator ``torch.ops.selkv.<name>``. The operators have
CUDA kernels (the C++ API, launched on the current stream, CUDA-graph capturable, no host
synchronization), CPU kernels (the bit-exact CPU reference, for testing and as a reference
implementation) and Meta kernels (the C++ API's checks without the data, for ``torch.compile``:
a traced call fails as the run would). The device of the
tensors picks the implementation; mixing devices is an error.

Arguments are validated and fail closed: a wrong dtype, device, rank, size or stride raises
``RuntimeError`` naming the operator and the argument; a valid request the build does not
support raises ``NotImplementedError``.
"""

from __future__ import annotations

import torch

from . import formats as _formats
from ._ops import ops as _ops

__all__ = [
    "empty_kv_cache",
    "write_kv_cache",
    "convert_req_indices_to_slots",
    "gather_kv_bf16",
]


def empty_kv_cache(
    num_blocks: int,
    page_size: int,
    format: str = "ds_mla_fp8",
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Allocates an uninitialized paged cache ``uint8 [num_blocks, page_size, record_bytes]``.

    For ``model1_fp8`` the pages are padded to ``page_bytes(format, page_size)`` (a multiple of
    576 bytes, as FlashMLA allocates them): the result is a view ``[num_blocks, page_size, 584]``
    with ``stride(0) == page_bytes`` of a ``[num_blocks, page_bytes]`` buffer.
    """
    rb = _formats.record_bytes(format)
    if format == "model1_fp8":
        pb = _formats.page_bytes(format, page_size)
        buf = torch.empty((num_blocks, pb), dtype=torch.uint8, device=device)
        return buf.as_strided((num_blocks, page_size, rb), (pb, rb, 1))
    return torch.empty((num_blocks, page_size, rb), dtype=torch.uint8, device=device)


def write_kv_cache(
    latent: torch.Tensor,
    rope: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    cache: torch.Tensor,
    format: str = "ds_mla_fp8",
    scale_mode: str = "pow2",
) -> torch.Tensor:
    """Quantizes tokens into FP8 records of a paged cache, in place (C1).

    Args:
        latent: bf16 ``[T, 512]`` (``[T, 448]`` for ``model1_fp8``), last dim dense (rows may be
            strided).
        rope: bf16 ``[T, 64]`` for ``ds_mla_fp8`` and ``model1_fp8``; must be ``None`` for
            ``nope_fp8``.
        slot_mapping: int64 ``[T]`` contiguous; token ``t`` goes to physical slot
            ``slot_mapping[t]``. Negative slots (CUDA-graph padding) and slots
            ``>= num_blocks * page_size`` are skipped, never written. Valid slots must be
            distinct (two tokens writing one slot race on the GPU; the CPU op keeps the later).
        cache: uint8 ``[num_blocks, page_size, record_bytes(format)]``, pages dense, block
            stride ``cache.stride(0) >= page_bytes(format, page_size)``. Modified in place.
        format: ``"ds_mla_fp8"`` (656-byte records), ``"nope_fp8"`` (528) or ``"model1_fp8"``
            (FlashMLA MODEL1: 584 bytes a token, scales in the page tail).
        scale_mode: ``"pow2"`` (default) or ``"amax"`` (not for ``model1_fp8``, whose UE8M0
            scales are powers of two); see :mod:`selkv.formats`.

    Returns:
        ``cache``.
    """
    _ops.write_kv_cache(latent, rope, slot_mapping, cache, format, scale_mode)
    return cache


def convert_req_indices_to_slots(
    req_local_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    num_blocks: int,
    *,
    compact: bool = False,
    return_valid_counts: bool = True,
    out: torch.Tensor | None = None,
    valid_counts: torch.Tensor | None = None,
    token_seq_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Maps request-local top-k token positions to physical cache slots (C2).

    For row ``t`` with ``r = req_id_per_token[t]`` and ``pos = req_local_indices[t, k]``:
    ``slot = block_table[r, pos // page_size] * page_size + pos % page_size``, or ``-1`` when
    ``r`` is not a row of ``block_table``, ``pos < 0``, ``pos >= token_seq_lens[t]`` (when given),
    the block index is past ``block_table.size(1)``, or the block id is outside
    ``[0, num_blocks)``.

    Args:
        req_local_indices: int32 ``[T, topk]``, last dim dense.
        req_id_per_token: int32 ``[>= T]`` contiguous; only the first ``T`` entries are read.
        block_table: int32 ``[num_reqs, max_blocks_per_req]``, last dim dense.
        page_size: tokens per cache block.
        num_blocks: blocks in the cache (block ids ``>= num_blocks`` are invalid).
        compact: move the valid slots of each row to its front (original order), ``-1`` after
            them, so that ``valid_counts`` can serve as ``topk_length``.
        return_valid_counts: also compute the number of valid slots per row.
        out: optional int32 ``[T, topk]`` output (may be ``req_local_indices`` itself).
        valid_counts: optional int32 ``[T]`` output for the counts (implies
            ``return_valid_counts``).
        token_seq_lens: optional int32 ``[>= T]`` contiguous: the positions row ``t`` may use
            (e.g. its request's length after this step's write); a position at or past it is
            ``-1``, whatever the block table holds there (stale or unwritten slots).

    Returns:
        ``(slots, valid_counts)``; ``valid_counts`` is ``None`` when not requested.
    """
    if out is None:
        out = torch.empty(
            req_local_indices.shape, dtype=torch.int32, device=req_local_indices.device
        )
    if valid_counts is None and return_valid_counts:
        valid_counts = torch.empty(
            req_local_indices.shape[:1], dtype=torch.int32, device=req_local_indices.device
        )
    _ops.convert_req_indices_to_slots(
        req_local_indices,
        req_id_per_token,
        block_table,
        page_size,
        num_blocks,
        out,
        valid_counts,
        compact,
        token_seq_lens,
    )
    return out, valid_counts


def gather_kv_bf16(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    ws_starts: torch.Tensor,
    format: str = "ds_mla_fp8",
    *,
    num_rows: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gathers cached tokens of several requests and dequantizes them to bf16 (C3).

    For request ``r``: tokens ``[seq_starts[r], seq_starts[r] + seq_lens[r])`` are read
    through ``block_table[r]`` and written to rows ``[ws_starts[r], ws_starts[r] +
    seq_lens[r])`` of ``out``. Starts need not be page aligned. Tokens whose block is missing
    (past ``block_table.size(1)``, or a block id outside ``[0, num_blocks)``) come out as
    zeros; rows outside ``out`` are never written; rows no request covers are left as they
    were.

    Args:
        cache: uint8 ``[num_blocks, page_size, record_bytes(format)]``.
        block_table: int32 ``[>= num_reqs, max_blocks_per_req]``; rows past ``num_reqs``
            are not read.
        seq_starts, seq_lens, ws_starts: int32 ``[num_reqs]`` contiguous.
        format: ``"ds_mla_fp8"`` (output ``[rows, 576]``), ``"nope_fp8"`` (``[rows, 512]``) or
            ``"model1_fp8"`` (``[rows, 512]``: 448 NoPE + 64 RoPE).
        num_rows: rows of the output to allocate when ``out`` is not given. When both are
            omitted it is ``max(ws_starts + seq_lens)``, which synchronizes the host: pass
            ``num_rows`` or ``out`` on hot paths and under CUDA-graph capture.
        out: optional bf16 ``[rows, dequant_dim(format)]`` output, last dim dense.

    Returns:
        ``out``.
    """
    if out is None:
        if num_rows is None:
            ends = ws_starts.to(torch.int64) + seq_lens.to(torch.int64)
            num_rows = int(ends.max().clamp_min(0)) if ends.numel() else 0
        out = torch.empty(
            (num_rows, _formats.dequant_dim(format)), dtype=torch.bfloat16, device=cache.device
        )
    _ops.gather_kv_bf16(cache, block_table, seq_starts, seq_lens, ws_starts, format, out)
    return out
