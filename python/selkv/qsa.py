"""QSA sparse prefill over selected 4-token blocks of a paged fp16 / bf16 KV cache (DESIGN C8).

Row ``r`` is one query token of request ``req_ids[r]`` at causal position ``positions[r]``. It
attends to the tokens its selection lists, either

- expanded: int32 ``selection [R, 4K + 3]`` of logical token positions (``-1`` = none; vLLM's
  ``[R, 2051]`` for K = 512), each column one softmax term; or
- compact: int32 ``block_ids [R, K]`` with ``block_counts [R]``: the first
  ``clamp(block_counts[r], 0, K)`` blocks ``b`` select tokens ``4b .. 4b+3``, then the causal
  partial block of the row's position (tokens ``4 * ((p + 1) // 4) .. p``) is added.

A listed token ``t`` of request ``req`` is used iff ``0 <= req < num_req``,
``0 <= t < seq_lens[req]``, ``t // P < block_table.size(1)`` and the page
``block_table[req, t // P]`` is in ``[0, num_pages)``; anything else is skipped and never read.
Query head ``h`` reads KV head ``h // (Hq // Hkv)``. A row / head with no valid token gives
``out = 0`` and ``lse = -inf``. The semantics are those of ``include/selkv/qsa.h``.

Wraps the out-variant operator ``torch.ops.selkv.qsa_sparse_prefill`` (CPU: the fp64 reference;
Meta: checks only; CUDA: the C++ API on the current stream, today the exact simple kernel for
every batch; the SM90 page-4 kernel for large batches is planned).
"""

from __future__ import annotations

import math

import torch

from ._ops import ops as _ops

__all__ = ["qsa_sparse_prefill"]


def qsa_sparse_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    selection: torch.Tensor | None = None,
    block_ids: torch.Tensor | None = None,
    block_counts: torch.Tensor | None = None,
    scale: float | None = None,
    force_simple: bool = False,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of each query row over its selected cache tokens (C8).

    Args:
        q: ``[R, Hq, D]`` fp16 or bf16, D 128 or 256, last dim dense.
        k_cache, v_cache: ``[num_pages, P, Hkv, D]`` of q's dtype, any strides with a dense last
            dim; P a multiple of 4, Hq / Hkv in [1, 8]. An interleaved ``[num_pages, 2, P, Hkv, D]``
            buffer is passed as ``kv[:, 0]`` and ``kv[:, 1]`` (nothing is copied).
        block_table: int32 ``[num_req, width]``: logical page -> physical page.
        seq_lens: int32 ``[num_req]``: live tokens of each request.
        req_ids, positions: int32 ``[R]``: request and causal position of each row.
        selection: expanded form, int32 ``[R, 4K + 3]`` (1 <= K <= 512).
        block_ids, block_counts: compact form, int32 ``[R, K]`` and ``[R]``.
        scale: softmax scale; default ``1 / sqrt(D)``.
        force_simple: always take the simple kernel (CUDA routing; no effect on the result).
        out: optional ``[R, Hq, D]`` output of q's dtype.
        return_lse: also return the fp32 ``[R, Hq]`` log-sum-exp (natural log).

    Returns:
        ``out``, or ``(out, lse)`` when ``return_lse``.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.dim() >= 1 and q.shape[-1] > 0 else 1.0
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty(tuple(q.shape[:2]), dtype=torch.float32, device=q.device)
    _ops.qsa_sparse_prefill(
        q, k_cache, v_cache, block_table, seq_lens, req_ids, positions,
        selection, block_ids, block_counts, float(scale), bool(force_simple), out, lse,
    )
    return (out, lse) if return_lse else out
