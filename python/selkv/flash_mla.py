"""FlashMLA-compatible API.

An inference engine that uses FlashMLA's Python API switches to selkv by changing an import::

    from selkv import flash_mla   # instead of: import flash_mla

The names below keep FlashMLA's signatures and conventions (including its result for query rows
with no valid index: ``lse = +inf``, ``out = 0``).

- ``get_mla_metadata`` -- returns an empty scheduler-metadata object; the split-KV schedule is
  made on the device at the first ``flash_mla_with_kvcache`` call that uses it (graph-capturable)
- ``flash_mla_with_kvcache`` -- sparse MLA decode over the paged FP8 ``ds_mla_fp8`` cache
  (``is_fp8_kvcache=True`` with ``indices``); the dense and ``extra_*`` paths raise
  :class:`NotImplementedError`
- ``flash_mla_sparse_fwd`` -- sparse MLA prefill over bf16 KV (``d_qk`` 576 or 512)
- ``get_packed_kv_workspace_size`` / ``get_packed_mla_metadata`` / ``pack_selected_kv`` /
  ``flash_mla_with_packed_kvcache`` -- packed selected-KV path (not implemented yet)

Differences from FlashMLA, all on the safe side: every index that is not a valid slot (not just
``-1``) is skipped without being read; argument errors raise ``ValueError`` /
``RuntimeError`` naming the argument instead of failing an ``assert``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import torch

from . import decode as _decode
from ._flash_mla_sparse import flash_mla_sparse_fwd  # sparse MLA prefill (C7)

__all__ = [
    "FlashMLASchedMeta",
    "get_mla_metadata",
    "flash_mla_with_kvcache",
    "flash_mla_sparse_fwd",
    "get_packed_kv_workspace_size",
    "get_packed_mla_metadata",
    "pack_selected_kv",
    "flash_mla_with_packed_kvcache",
]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Scheduler metadata of the decode (FlashMLA's class of the same name).

    Empty when made by :func:`get_mla_metadata`; the first :func:`flash_mla_with_kvcache`
    call that uses it records the call's configuration in ``config`` and plans the schedule
    on the device. Later calls must use the same configuration (checked).

    With ``topk_length`` the schedule depends on its values, as in FlashMLA: make a new object
    per decoding step (one per step, shared by the layers of that step). The plan snapshots the
    values at its first call; reusing the object after ``topk_length`` was changed *in place*
    computes the result for the snapshot (consistently, never a mix), and passing another
    ``topk_length`` tensor plans again.
    """

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None = None
        extra_topk: int | None = None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None  # the int32 device schedule
    num_splits: torch.Tensor | None = None  # unused by selkv (its schedule is self-contained)
    selkv_metadata: _decode.DecodeMetadata | None = None  # the plan (buffers + host shape)


def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]:
    """FlashMLA ``get_mla_metadata``: returns ``(FlashMLASchedMeta(), None)``.

    Takes any arguments (ignored), like FlashMLA's current interface; the schedule is planned
    at the first :func:`flash_mla_with_kvcache` call using the returned object.
    """
    return FlashMLASchedMeta(), None


def _kv_cache_view(k_cache: torch.Tensor) -> torch.Tensor:
    """FlashMLA's FP8 cache ``[num_blocks, page_block_size, 1, 656]`` (uint8 / int8 /
    float8_e4m3fn) as selkv's uint8 ``[num_blocks, page_block_size, 656]`` view (no copy)."""
    if k_cache.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        raise ValueError(
            "flash_mla_with_kvcache: k_cache: expected dtype uint8, int8 or float8_e4m3fn "
            f"(656-byte ds_mla_fp8 records), got {k_cache.dtype}"
        )
    kv = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
    if kv.dim() == 4:
        if kv.size(2) != 1:
            raise ValueError(
                "flash_mla_with_kvcache: k_cache: expected num_heads_k == 1 (shape "
                f"[num_blocks, page_block_size, 1, 656]), got shape {tuple(k_cache.shape)}"
            )
        kv = kv.select(2, 0)
    elif kv.dim() != 3:
        raise ValueError(
            "flash_mla_with_kvcache: k_cache: expected shape [num_blocks, page_block_size, 1, "
            f"656], got {tuple(k_cache.shape)}"
        )
    return kv


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA ``flash_mla_with_kvcache``, sparse FP8 path (DeepSeek-V3.2 layout).

    Arguments (FlashMLA's names and order):
        q: bf16 ``(batch_size, seq_len_q, num_heads_q, 576)``; ``num_heads_q`` 64 or 128.
        k_cache: ``(num_blocks, page_block_size, 1, 656)`` uint8 / int8 / float8_e4m3fn,
            656-byte ``ds_mla_fp8`` records (512 FP8 NoPE, 4 fp32 scales, 64 bf16 RoPE); each
            page dense.
        block_table, cache_seqlens: ignored by the sparse path (may be ``None``).
        head_dim_v: must be 512.
        tile_scheduler_metadata: the :class:`FlashMLASchedMeta` from :func:`get_mla_metadata`.
            Reusable across calls (layers) with the same shapes and the same ``topk_length``
            values, as in FlashMLA.
        num_splits: must be ``None``.
        softmax_scale: default ``576 ** -0.5``; finite and > 0 with ``softmax_scale * log2(e)``
            finite in fp32 (else :class:`ValueError` naming it).
        causal: must be ``False``.
        is_fp8_kvcache: must be ``True``.
        indices: int32 ``(batch_size, seq_len_q, topk)`` physical slots
            (``block * page_block_size + offset``), ``topk`` a multiple of 64. Any invalid
            entry (``-1``, ``INT_MAX``, out of range) is skipped, never read.
        attn_sink: optional fp32 ``(num_heads_q,)``; ``out *= exp(lse) / (exp(lse) +
            exp(attn_sink))``; no effect on the returned lse.
        extra_k_cache, extra_indices_in_kvcache, extra_topk_length: not supported (must be
            ``None``).
        topk_length: optional int32 ``(batch_size,)``: only the first ``topk_length[b]``
            indices of row ``b`` are processed.

    Returns:
        ``(out, softmax_lse)``: ``out`` bf16 ``(batch_size, seq_len_q, num_heads_q, 512)``;
        ``softmax_lse`` fp32 ``(batch_size, num_heads_q, seq_len_q)`` (a transposed view, as in
        FlashMLA), natural log; ``+inf`` (and ``out = 0``) for a query row with no valid index.
    """
    sched = tile_scheduler_metadata
    if not isinstance(sched, FlashMLASchedMeta):
        raise TypeError(
            "flash_mla_with_kvcache: tile_scheduler_metadata: expected the FlashMLASchedMeta "
            f"returned by selkv.flash_mla.get_mla_metadata(), got {type(sched).__name__}"
        )
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits: must be None")
    if indices is None:
        raise NotImplementedError(
            "flash_mla_with_kvcache: dense attention (indices=None) is not supported by selkv; "
            "pass indices (sparse FP8 path)"
        )
    if (
        extra_k_cache is not None
        or extra_indices_in_kvcache is not None
        or extra_topk_length is not None
    ):
        raise NotImplementedError(
            "flash_mla_with_kvcache: extra_k_cache / extra_indices_in_kvcache / "
            "extra_topk_length are not supported by selkv"
        )
    if causal:
        raise ValueError("flash_mla_with_kvcache: causal: must be False for sparse attention")
    if not is_fp8_kvcache:
        raise NotImplementedError(
            "flash_mla_with_kvcache: is_fp8_kvcache: selkv's sparse decode needs the FP8 "
            "cache (is_fp8_kvcache=True)"
        )
    if head_dim_v != 512:
        raise ValueError(f"flash_mla_with_kvcache: head_dim_v: must be 512, got {head_dim_v}")
    if q.dim() != 4:
        raise ValueError(
            "flash_mla_with_kvcache: q: expected shape (batch_size, seq_len_q, num_heads_q, "
            f"576), got {tuple(q.shape)}"
        )
    if indices.dim() != 3:
        raise ValueError(
            "flash_mla_with_kvcache: indices: expected shape (batch_size, seq_len_q, topk), "
            f"got {tuple(indices.shape)}"
        )
    kv = _kv_cache_view(k_cache)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    topk = indices.shape[-1]
    config = FlashMLASchedMeta.Config(
        b, s_q, h_q, k_cache.shape[1], k_cache.shape[2] if k_cache.dim() == 4 else 1,
        causal, is_fp8_kvcache, topk,
    )
    if not sched.have_initialized:
        sched.selkv_metadata = _decode.get_decode_metadata(
            b, s_q, h_q, topk, topk_length, device=q.device
        )
        sched.tile_scheduler_metadata = sched.selkv_metadata.metadata
        sched.config = config
        sched.have_initialized = True
    else:
        if sched.config != config:
            raise ValueError(
                "flash_mla_with_kvcache: tile_scheduler_metadata: made for "
                f"{sched.config}, but called with {config}; use one metadata object per "
                "configuration"
            )
        md = sched.selkv_metadata
        assert md is not None
        if (topk_length is None) != (md.topk_length is None) or (
            topk_length is not None and topk_length is not md.topk_length
        ):
            # Same shapes, another topk_length tensor (FlashMLA allows equal values): plan again
            # into the same buffers (one tiny kernel, no allocation when it fits).
            _decode.get_decode_metadata(b, s_q, h_q, topk, topk_length, out=md)
            sched.tile_scheduler_metadata = md.metadata
    try:
        out, lse = _decode.sparse_mla_decode(
            q,
            kv,
            indices,
            sched.selkv_metadata,
            softmax_scale,
            topk_length=topk_length,
            attn_sink=attn_sink,
        )
    except RuntimeError as e:
        # The C++ API owns the scale rule (DESIGN §2) and names it sm_scale: say it as the caller did.
        if ": sm_scale:" in str(e):
            raise ValueError(f"flash_mla_with_kvcache: softmax_scale: {e}") from e
        raise
    # FlashMLA's convention for a query row with no valid index: lse = +inf (out is 0 already).
    # One elementwise kernel, graph-capturable; finite values and NaN are kept.
    torch.nan_to_num_(lse, nan=float("nan"), posinf=float("inf"), neginf=float("inf"))
    return out, lse.transpose(1, 2)


def _not_yet(name: str) -> NoReturn:
    raise NotImplementedError(f"selkv.flash_mla.{name} is not implemented yet")


def get_packed_kv_workspace_size(*args: Any, **kwargs: Any) -> Any:
    """Workspace bytes of the packed selected-KV path (not implemented yet)."""
    _not_yet("get_packed_kv_workspace_size")


def get_packed_mla_metadata(*args: Any, **kwargs: Any) -> Any:
    """Scheduler metadata of the packed selected-KV path (not implemented yet)."""
    _not_yet("get_packed_mla_metadata")


def pack_selected_kv(*args: Any, **kwargs: Any) -> Any:
    """Packs selected records into the tile-major workspace (not implemented yet)."""
    _not_yet("pack_selected_kv")


def flash_mla_with_packed_kvcache(*args: Any, **kwargs: Any) -> Any:
    """Sparse MLA decode over the packed workspace (not implemented yet)."""
    _not_yet("flash_mla_with_packed_kvcache")
