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
Meta: checks only; CUDA: the C++ API on the current stream: the SM90 page-4 kernel for batches of
at least 4096 rows selecting K >= 384 blocks that pass a plan, the exact simple kernel otherwise).

Plan / run (as FlashInfer's): the page-4 kernel reads a plan of the selection (its row groups' blocks),
made by :func:`qsa_plan` (``torch.ops.selkv.qsa_plan``: CUDA the C++ ``selkv::qsa_plan`` kernel,
CPU the byte-identical reference ``selkv::ref::qsa_plan``, Meta checks only) into a uint8 buffer
of :func:`qsa_metadata_size` bytes, and passed to :func:`qsa_sparse_prefill` as ``metadata=``.
Without a plan (``metadata=None``) every call takes the exact simple kernel.
"""

from __future__ import annotations

import math

import torch

from ._ops import ops as _ops

__all__ = ["qsa_metadata_size", "qsa_page4_wanted", "qsa_plan", "qsa_sparse_prefill", "qsa_workspace_size"]


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
    metadata: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
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
        metadata: the page-4 plan of this call's selection, made by :func:`qsa_plan` from the same
            ``block_table``, ``seq_lens``, ``req_ids``, ``positions`` and selection (uint8,
            ``qsa_metadata_size(R, K)`` bytes or more, on q's device; a smaller one is an error
            naming ``metadata``). ``None`` (default): no plan, the exact simple kernel. With a plan,
            a CUDA call of ``R >= 4096`` rows and ``K >= 384`` on SM90 takes the page-4 kernel (below
            that K the simple kernel is faster and the plan goes unread; ``force_simple=True``
            or ``SELKV_QSA_PAGE4=0`` keep the simple kernel). The page-4 kernel attends to the plan's selection, not the call's: re-plan
            whenever the selection, ``seq_lens`` or the block table change. CPU and Meta check the
            plan's size and ignore its contents.
        workspace: the page-4 route's scratch (uint8, :func:`qsa_workspace_size` ``(D)`` bytes or
            more, on q's device, no initial contents): with it the page-4 kernel gives every SM an
            equal share of the call's tiles. ``None`` (default): a CUDA call that takes the page-4
            route allocates one from torch's caching allocator (pass a reused one to avoid that);
            other calls need none. Written by the call: concurrent calls need distinct workspaces.

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
    if (workspace is None and metadata is not None and not force_simple and q.is_cuda and q.dim() == 3
            and qsa_page4_wanted(q.shape[0], _max_blocks(selection, block_ids))):
        workspace = torch.empty(qsa_workspace_size(q.shape[2]), dtype=torch.uint8, device=q.device)
    _ops.qsa_sparse_prefill(
        q, k_cache, v_cache, block_table, seq_lens, req_ids, positions,
        selection, block_ids, block_counts, float(scale), bool(force_simple), out, lse, metadata, workspace,
    )
    return (out, lse) if return_lse else out


def _max_blocks(selection: torch.Tensor | None, block_ids: torch.Tensor | None) -> int:
    """K of a call from its selection's shape (expanded: (cols - 3) / 4; compact: block_ids' width)."""
    if selection is not None and selection.dim() == 2:
        return (selection.shape[1] - 3) // 4
    if block_ids is not None and block_ids.dim() == 2:
        return block_ids.shape[1]
    return 0


def qsa_workspace_size(head_dim: int) -> int:
    """Bytes of the page-4 route's workspace for ``head_dim`` (128 or 256; 0 otherwise), the same
    for every call and GPU (``selkv::qsa_workspace_size``)."""
    return int(_ops.qsa_workspace_size(int(head_dim)))


def qsa_metadata_size(num_rows: int, max_blocks: int) -> int:
    """Bytes of the page-4 plan of ``num_rows`` rows selecting up to ``max_blocks`` (K) blocks.

    ``selkv::qsa_metadata_size``: ``4 * (round_up(8 + 4 R + 2 R (K + 1), 4) + 4 R (K + 1))`` for
    ``R = num_rows`` (layout in ``src/qsa/qsa_group_layout.h``); 0 for ``num_rows <= 0`` or K
    outside ``[1, 512]``.
    """
    return int(_ops.qsa_metadata_size(int(num_rows), int(max_blocks)))


def qsa_page4_wanted(num_rows: int, max_blocks: int) -> bool:
    """Whether a call of ``num_rows`` rows selecting up to ``max_blocks`` (K) blocks, given a plan,
    asks for the page-4 route: ``R >= 4096``, ``K >= 384`` and ``SELKV_QSA_PAGE4`` not ``"0"``
    (``selkv::qsa_page4_wanted``; on SM90 the call then takes the page-4 kernel). A call that does
    not ask for it never reads a plan, so build one with :func:`qsa_plan` only when this is true.
    """
    return bool(_ops.qsa_page4_wanted(int(num_rows), int(max_blocks)))


def qsa_plan(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    selection: torch.Tensor | None = None,
    block_ids: torch.Tensor | None = None,
    block_counts: torch.Tensor | None = None,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_pages: int,
    page_size: int,
    metadata: torch.Tensor | None = None,
) -> torch.Tensor:
    """The page-4 plan of a selection, for ``qsa_sparse_prefill(..., metadata=plan)`` (C8).

    For every group of consecutive rows that one page-4 CTA serves (``min(64 // (Hq / Hkv), 32)``
    rows: 10 at Hq / Hkv = 6), lists the group's distinct selected 4-token blocks (physical page,
    4-aligned slot; the rows' requests in order of first appearance, ascending logical block
    within one, so each row's causal partial block after its complete blocks) and, per token, the
    rows that use it; invalid tokens are dropped, and a row whose expanded selection is not made of
    4-token blocks, or that selects a block twice, is marked for the simple kernel (layout:
    ``src/qsa/qsa_group_layout.h``). Reads the selection, ``req_ids``, ``positions``,
    ``seq_lens`` and ``block_table`` only, never q or the caches.

    Plan / run, as FlashInfer's: make the plan outside the CUDA graph (once per selection: every
    layer and call that uses the same selection, ``seq_lens`` and block table can share it), then
    run the attention with ``metadata=plan`` inside it; the plan must be re-made whenever those
    inputs change. The CUDA plan itself has no host sync and, with a preallocated ``metadata``,
    allocates nothing (the C++ ``selkv::qsa_plan`` is graph capturable), so it may also be
    captured when the selection is only known inside the graph.

    Args:
        block_table, seq_lens, req_ids, positions: as for :func:`qsa_sparse_prefill`.
        selection: expanded form, int32 ``[R, 4K + 3]``.
        block_ids, block_counts: compact form, int32 ``[R, K]`` and ``[R]``.
        num_q_heads, num_kv_heads, head_dim: q's and the caches' sizes (``Hq``, ``Hkv``, ``D``);
            the grouping follows ``Hq / Hkv``, the C++ argument rules check all three.
        num_pages, page_size: the caches' ``[num_pages, P, ...]`` sizes (the validity rule and
            the physical slots depend on them).
        metadata: optional uint8 output of ``qsa_metadata_size(R, K)`` bytes or more (16-byte
            aligned on the GPU), on the device of the other tensors; allocated when ``None``.

    Returns:
        ``metadata``: the plan. CUDA and CPU write the same bytes (CUDA: the current stream,
        CPU: the reference). Every byte of ``qsa_metadata_size(R, K)`` is written.
    """
    if metadata is None:
        if selection is not None:
            k = (selection.shape[-1] - 3) // 4 if selection.dim() == 2 else 0
        else:
            k = block_ids.shape[-1] if block_ids is not None and block_ids.dim() == 2 else 0
        rows = req_ids.shape[0] if req_ids.dim() >= 1 else 0
        # A bad shape gives 0 bytes here; the op then names the argument.
        metadata = torch.empty(qsa_metadata_size(rows, k), dtype=torch.uint8, device=req_ids.device)
    _ops.qsa_plan(
        block_table, seq_lens, req_ids, positions, selection, block_ids, block_counts,
        int(num_q_heads), int(num_kv_heads), int(head_dim), int(num_pages), int(page_size), metadata,
    )
    return metadata
