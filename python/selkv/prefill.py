"""Sparse MLA prefill (DESIGN C7), selected-row dequantization (C4) and the composed prefill
paths from the paged FP8 cache (``include/selkv/{prefill,dequant,composed}.h``).

- :func:`sparse_prefill` -- q ``[T, H, D_qk]`` bf16, kv ``[N, D_qk]`` bf16, indices ``[T, K]``
  -> ``(out [T, H, 512] bf16, max_logits [T, H] fp32, lse [T, H] fp32)``.
- :func:`dequant_selected` -- paged FP8 cache + physical indices ``[T, K]`` -> bf16 workspace
  rows + remapped indices, ready for :func:`sparse_prefill`.
- :func:`dequant_sparse_prefill` -- both in one call (FP8 cache -> C4 -> C7).
- :func:`gather_sparse_prefill` -- the dense-prefill route: gather each request's chunk into a
  bf16 workspace (C3) and attend with chunk-relative indices (C3 -> C7).

Index semantics (DESIGN §2): an entry is valid iff it lies in its range (``0 <= idx < N`` for kv
rows, ``0 <= slot < num_blocks * page_size`` for physical slots) and ``k < topk_length[t]`` when
given; everything else (-1, INT_MAX, garbage) contributes nothing and is never read. A token with
no valid entry gives ``out = 0`` and ``lse = max_logits = -inf``. Each entry is one softmax term
(duplicates count twice).

All functions allocate their outputs / workspace when none is passed; pass them (``out=``,
``workspace=``) to stay allocation-free, e.g. under CUDA graphs. CPU tensors run the CPU oracle
(C4 / C3 bit-exact; attention in fp64, ``out`` rounded to bf16) behind the same checks; the
operators have Meta kernels for ``torch.compile``. Errors raise ``RuntimeError`` naming the op and
the argument (``NotImplementedError`` on a GPU other than SM90).
"""

from __future__ import annotations

import torch

from . import formats as _formats
from ._ops import expect_dims
from ._ops import ops as _ops

__all__ = [
    "dequant_prefill_workspace_size",
    "dequant_selected",
    "dequant_selected_workspace_rows",
    "dequant_sparse_prefill",
    "gather_prefill_workspace_size",
    "gather_sparse_prefill",
    "sparse_prefill",
]


def _stats_outputs(op, q, out, max_logits, lse):
    expect_dims(op, "q", q, 3, "[num_tokens, num_heads, d_qk]")
    T, H = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty((T, H, 512), dtype=torch.bfloat16, device=q.device)
    if max_logits is None:
        max_logits = torch.empty((T, H), dtype=torch.float32, device=q.device)
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    return out, max_logits, lse


def _default_scale(q: torch.Tensor, sm_scale: float | None) -> float:
    return float(q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)


def sparse_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    *,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill over bf16 KV (C7).

    Args:
        q: bf16 ``[T, H, D_qk]``, ``H`` in {64, 128}, ``D_qk`` in {576, 512}; last dim dense,
            16-byte aligned rows. Tokens of many requests are flat in ``T``.
        kv: bf16 ``[N, D_qk]`` (``v = kv[:, :512]``), last dim dense.
        indices: int32 ``[T, K]`` rows of ``kv``, ``K`` a multiple of 64; last dim dense.
        sm_scale: softmax scale of ``q . kv``; default ``D_qk ** -0.5``. Finite and ``> 0`` with
            ``sm_scale * log2(e)`` finite in fp32, else a RuntimeError naming it.
        topk_length: optional int32 ``[T]``: only the first ``topk_length[t]`` entries of row
            ``t`` are read.
        out, max_logits, lse: optional outputs (bf16 ``[T, H, 512]``, fp32 ``[T, H]`` twice).
        attn_sink: optional fp32 ``[H]``: ``out *= 1 / (1 + exp(attn_sink[h] - lse))``, fused
            in the kernel's epilogue (``lse`` and ``max_logits`` unchanged).

    Returns:
        ``(out, max_logits, lse)``: ``max_logits`` the largest valid scaled score, ``lse`` the
        natural-log logsumexp; ``-inf`` both (and ``out = 0``) for a token with no valid entry.
    """
    out, max_logits, lse = _stats_outputs("selkv::sparse_prefill", q, out, max_logits, lse)
    _ops.sparse_prefill(q, kv, indices, topk_length, _default_scale(q, sm_scale), out, max_logits, lse, attn_sink)
    return out, max_logits, lse


def dequant_selected_workspace_rows(num_tokens: int, topk: int, num_slots: int) -> int:
    """Rows of the bf16 workspace :func:`dequant_selected` needs: ``min(T * K, P)``."""
    return int(_ops.dequant_selected_workspace_rows(num_tokens, topk, num_slots))


def dequant_selected(
    cache: torch.Tensor,
    indices: torch.Tensor,
    format: str = "ds_mla_fp8",
    *,
    topk_length: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    out_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected-row dequantization of a paged FP8 cache (C4, seed 003).

    With ``N = T * K`` entries and ``P = num_blocks * page_size`` slots: when ``N < P`` only the
    selected entries are dequantized (workspace row ``t * K + k``, ``out_indices[t, k] = t * K +
    k``); otherwise the whole pool is (row ``s`` = slot ``s``, indices kept). Invalid entries
    come out as exactly ``-1`` either way (their workspace rows are not written). No host sync,
    no data-dependent unique/sort: the mode follows from the shapes.

    Args:
        cache: uint8 ``[num_blocks, page_size, 656 | 528 | 584]`` paged cache (pages dense).
        indices: int32 ``[T, K]`` physical slots (any ``K >= 0``).
        format: ``"ds_mla_fp8"`` (rows of 576), ``"nope_fp8"`` or ``"model1_fp8"`` (rows of 512).
        topk_length: optional int32 ``[T]``.
        workspace: optional bf16 ``[rows >= dequant_selected_workspace_rows(T, K, P), D]``.
        out_indices: optional int32 ``[T, K]`` (may be ``indices`` itself: in place).

    Returns:
        ``(workspace, out_indices)``; feed them to :func:`sparse_prefill` as ``kv`` / ``indices``
        (bit-exact ``bf16(float(e4m3) * scale)`` rows).
    """
    expect_dims("selkv::dequant_selected", "indices", indices, 2, "[T, K]")
    expect_dims("selkv::dequant_selected", "cache", cache, 3, "[num_blocks, page_size, record_bytes]")
    T, K = indices.shape[0], indices.shape[1]
    P = cache.shape[0] * cache.shape[1]
    if workspace is None:
        rows = dequant_selected_workspace_rows(T, K, P)
        workspace = torch.empty((rows, _formats.dequant_dim(format)), dtype=torch.bfloat16, device=cache.device)
    if out_indices is None:
        out_indices = torch.empty((T, K), dtype=torch.int32, device=indices.device)
    _ops.dequant_selected(cache, indices, topk_length, format, workspace, out_indices)
    return workspace, out_indices


def dequant_prefill_workspace_size(num_tokens: int, topk: int, num_slots: int, format: str = "ds_mla_fp8") -> int:
    """Bytes of the workspace :func:`dequant_sparse_prefill` needs (bf16 rows + remapped indices)."""
    return int(_ops.dequant_prefill_workspace_size(num_tokens, topk, num_slots, format))


def dequant_sparse_prefill(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    format: str = "ds_mla_fp8",
    *,
    topk_length: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill straight from the paged FP8 cache: C4 then C7 in one call.

    Args:
        q: bf16 ``[T, H, D_qk]`` with ``D_qk = 576`` for ``ds_mla_fp8``, 512 for ``nope_fp8``.
        cache: uint8 ``[num_blocks, page_size, 656 | 528]``.
        indices: int32 ``[T, K]`` physical slots, ``K`` a multiple of 64.
        sm_scale: default ``D_qk ** -0.5``.
        format: ``"ds_mla_fp8"`` or ``"nope_fp8"``.
        topk_length: optional int32 ``[T]``.
        workspace: optional uint8 1-d buffer of at least
            :func:`dequant_prefill_workspace_size` bytes (a smaller one is an error naming the
            bytes needed).
        out, max_logits, lse: optional outputs.
        attn_sink: optional fp32 ``[H]``, as in :func:`sparse_prefill`.

    Returns:
        ``(out, max_logits, lse)`` as :func:`sparse_prefill` over the dequantized rows.
    """
    expect_dims("selkv::dequant_sparse_prefill", "indices", indices, 2, "[T, K]")
    expect_dims("selkv::dequant_sparse_prefill", "cache", cache, 3, "[num_blocks, page_size, record_bytes]")
    T, K = indices.shape[0], indices.shape[1]
    if workspace is None:
        n = dequant_prefill_workspace_size(T, K, cache.shape[0] * cache.shape[1], format)
        workspace = torch.empty((max(n, 16),), dtype=torch.uint8, device=cache.device)
    out, max_logits, lse = _stats_outputs("selkv::dequant_sparse_prefill", q, out, max_logits, lse)
    _ops.dequant_sparse_prefill(
        q, cache, indices, topk_length, format, _default_scale(q, sm_scale), workspace, out, max_logits, lse,
        attn_sink,
    )
    return out, max_logits, lse


def gather_prefill_workspace_size(num_kv_rows: int, format: str = "ds_mla_fp8") -> int:
    """Bytes of the workspace :func:`gather_sparse_prefill` needs for ``num_kv_rows`` rows."""
    return int(_ops.gather_prefill_workspace_size(num_kv_rows, format))


def gather_sparse_prefill(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    ws_starts: torch.Tensor,
    indices: torch.Tensor,
    num_kv_rows: int,
    sm_scale: float | None = None,
    format: str = "ds_mla_fp8",
    *,
    topk_length: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense-prefill route (seed 004): C3 gather of each request's chunk, then C7.

    Request ``r``'s tokens ``[seq_starts[r], seq_starts[r] + seq_lens[r])`` are read through
    ``block_table[r]``, dequantized and written to workspace rows ``[ws_starts[r], ws_starts[r] +
    seq_lens[r])`` (see :func:`selkv.gather_kv_bf16`); then each token attends over its
    ``indices`` row, which holds workspace rows (chunk-relative, valid iff ``0 <= idx <
    num_kv_rows``). Point only at gathered rows: rows no request covers are not written.

    Args:
        q: bf16 ``[T, H, D_qk]`` (576 for ``ds_mla_fp8``, 512 for ``nope_fp8``).
        cache: uint8 ``[num_blocks, page_size, 656 | 528]``.
        block_table: int32 ``[>= num_reqs, max_blocks_per_req]``.
        seq_starts, seq_lens, ws_starts: int32 ``[num_reqs]``.
        indices: int32 ``[T, K]`` workspace rows, ``K`` a multiple of 64.
        num_kv_rows: rows of the gathered workspace (a host int, e.g. the chunk's token count).
        sm_scale: default ``D_qk ** -0.5``.
        format: ``"ds_mla_fp8"`` or ``"nope_fp8"``.
        topk_length: optional int32 ``[T]``.
        workspace: optional uint8 1-d buffer of at least :func:`gather_prefill_workspace_size`
            bytes.
        out, max_logits, lse: optional outputs.
        attn_sink: optional fp32 ``[H]``, as in :func:`sparse_prefill`.

    Returns:
        ``(out, max_logits, lse)`` as :func:`sparse_prefill`.
    """
    if workspace is None:
        n = gather_prefill_workspace_size(num_kv_rows, format)
        workspace = torch.empty((max(n, 16),), dtype=torch.uint8, device=cache.device)
    out, max_logits, lse = _stats_outputs("selkv::gather_sparse_prefill", q, out, max_logits, lse)
    _ops.gather_sparse_prefill(
        q,
        cache,
        block_table,
        seq_starts,
        seq_lens,
        ws_starts,
        indices,
        topk_length,
        format,
        int(num_kv_rows),
        _default_scale(q, sm_scale),
        workspace,
        out,
        max_logits,
        lse,
        attn_sink,
    )
    return out, max_logits, lse
