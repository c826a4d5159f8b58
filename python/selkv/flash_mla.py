"""FlashMLA-compatible API.

An inference engine that uses FlashMLA's Python API switches to selkv by changing an import::

    from selkv import flash_mla   # instead of: import flash_mla

The names below keep FlashMLA's signatures and conventions (including its result for query rows
with no valid index: ``lse = +inf``, ``out = 0``).

- ``get_mla_metadata`` -- returns an empty scheduler-metadata object; the split-KV schedule is
  made on the device at the first ``flash_mla_with_kvcache`` call that uses it (graph-capturable)
- ``flash_mla_with_kvcache`` -- sparse MLA decode over the paged FP8 cache
  (``is_fp8_kvcache=True`` with ``indices``): the V3.2 layout (``d_qk`` 576, 656-byte records)
  and MODEL1 (``d_qk`` 512, 584 bytes per token), the latter with ``extra_k_cache`` /
  ``extra_indices_in_kvcache`` / ``extra_topk_length``; the dense path raises
  :class:`NotImplementedError`
- ``flash_mla_sparse_fwd`` -- sparse MLA prefill over bf16 KV (``d_qk`` 576 or 512)
- ``get_packed_kv_workspace_size`` -- bytes of a packed selected-KV buffer (selkv's size, see
  below)
- ``get_packed_mla_metadata`` -- validates its arguments and returns a
  :class:`FlashMLASchedMeta` that ``flash_mla_with_packed_kvcache`` plans on first use: the
  packed decode uses the same schedule as ``flash_mla_with_kvcache`` (selkv has one planner)
- ``pack_selected_kv`` -- copies the selected records of the cache into a packed buffer
- ``flash_mla_with_packed_kvcache`` -- sparse MLA decode over that buffer; its result equals
  ``flash_mla_with_kvcache``'s over the cache and indices it was packed from (bitwise on the GPU)

What raises: the dense path of ``flash_mla_with_kvcache`` (and ``is_fp8_kvcache=False``) raises
:class:`NotImplementedError`, as does a GPU other than SM90 (and ``extra_k_cache`` with the V3.2
layout, which FlashMLA does not have either);
argument errors raise ``ValueError`` (``TypeError`` for a ``tile_scheduler_metadata`` that is
not a :class:`FlashMLASchedMeta`) or ``RuntimeError`` (from the operators' own checks), naming
the argument, instead of failing an ``assert``.

Differences from FlashMLA, on the safe side: every index that is not a valid slot (not just
``-1``) is skipped without being read; in a packed buffer the valid entries of a row need not be
a prefix, and a topk length of 0 is accepted (the row attends nothing). The price: selkv's packed
buffer holds a validity bit per entry and 16 bytes of shape words after the records, so it is
``B * S_q * K / 8 + 16`` bytes larger than FlashMLA's ``B * S_q * K * 656`` (size it with
``get_packed_kv_workspace_size``); decoding it at another shape gives NaN rows.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch

from . import decode as _decode
from . import packed as _packed
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

    :func:`get_packed_mla_metadata` returns one whose ``config`` is already set from its
    arguments (the first :func:`flash_mla_with_packed_kvcache` call is checked against it) and
    that records ``num_sms`` and ``device`` in the ``selkv_*`` fields. The schedule depends only
    on ``(b, s_q, h_q, topk, topk_length)``: the native and the packed decode of a step may
    share one object.
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
    selkv_num_sms: int = 0  # SMs the plan is made for (0: the device's; get_packed_mla_metadata)
    selkv_device: torch.device | None = None  # where it must be used (get_packed_mla_metadata)


def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]:
    """FlashMLA ``get_mla_metadata``: returns ``(FlashMLASchedMeta(), None)``.

    Takes any arguments (ignored), like FlashMLA's current interface; the schedule is planned
    at the first :func:`flash_mla_with_kvcache` call using the returned object.
    """
    return FlashMLASchedMeta(), None


_BYTE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


def _kv_cache_view(
    k_cache: torch.Tensor, op: str = "flash_mla_with_kvcache", name: str = "k_cache"
) -> torch.Tensor:
    """FlashMLA's FP8 cache ``[num_blocks, page_block_size, 1, 656]`` (V3.2) or ``[num_blocks,
    page_block_size, 1, 584]`` (MODEL1: a view of the padded pages, as FlashMLA's
    ``quantize_k_cache`` returns it), uint8 / int8 / float8_e4m3fn, as selkv's uint8
    ``[num_blocks, page_block_size, 656 or 584]`` view (no copy)."""
    if k_cache.dtype not in _BYTE_DTYPES:
        raise ValueError(
            f"{op}: {name}: expected dtype uint8, int8 or float8_e4m3fn "
            f"(656-byte ds_mla_fp8 or 584-byte model1_fp8 records), got {k_cache.dtype}"
        )
    kv = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
    if kv.dim() == 4:
        if kv.size(2) != 1:
            raise ValueError(
                f"{op}: {name}: expected num_heads_k == 1 (shape "
                f"[num_blocks, page_block_size, 1, 656 or 584]), got shape {tuple(k_cache.shape)}"
            )
        kv = kv.select(2, 0)
    elif kv.dim() != 3:
        raise ValueError(
            f"{op}: {name}: expected shape [num_blocks, page_block_size, 1, "
            f"656 or 584], got {tuple(k_cache.shape)}"
        )
    return kv


def _check_sched(op: str, sched: Any) -> FlashMLASchedMeta:
    if not isinstance(sched, FlashMLASchedMeta):
        raise TypeError(
            f"{op}: tile_scheduler_metadata: expected the FlashMLASchedMeta returned by "
            "selkv.flash_mla.get_mla_metadata() or get_packed_mla_metadata(), got "
            f"{type(sched).__name__}"
        )
    return sched


def _check_device(op: str, sched: FlashMLASchedMeta, q: torch.Tensor) -> None:
    if sched.selkv_device is not None and q.device != sched.selkv_device:
        raise ValueError(
            f"{op}: tile_scheduler_metadata: made for device {sched.selkv_device}, but q is on "
            f"{q.device}"
        )


def _check_shape_key(op: str, config: FlashMLASchedMeta.Config | None, key: tuple) -> None:
    """A call's ``(b, s_q, h_q, topk)`` against the configuration of its metadata (the plan
    depends on these and on ``topk_length`` only)."""
    if config is not None and (config.b, config.s_q, config.h_q, config.topk) != key:
        raise ValueError(
            f"{op}: tile_scheduler_metadata: made for (batch_size, seq_len_q, num_heads_q, topk) "
            f"= {(config.b, config.s_q, config.h_q, config.topk)}, but called with {key}; use "
            "one metadata object per configuration"
        )


def _plan(
    sched: FlashMLASchedMeta,
    b: int,
    s_q: int,
    h_q: int,
    topk: int,
    topk_length: torch.Tensor | None,
    device: torch.device,
    extra_topk: int = 0,
    extra_topk_length: torch.Tensor | None = None,
) -> _decode.DecodeMetadata:
    """The selkv plan of ``sched`` (its configuration already checked) for a call with this
    ``topk_length`` (and ``extra_topk_length``): made at the first call; made again, into the
    same buffers, when another length tensor is passed (FlashMLA allows equal values in a new
    tensor)."""
    md = sched.selkv_metadata
    if md is None:
        md = _decode.get_decode_metadata(
            b,
            s_q,
            h_q,
            topk,
            topk_length,
            num_sms=sched.selkv_num_sms,
            device=device,
            extra_topk=extra_topk,
            extra_topk_length=extra_topk_length,
        )
        sched.selkv_metadata = md
    elif topk_length is not md.topk_length or extra_topk_length is not md.extra_topk_length:
        # one tiny kernel, no allocation when the buffers fit
        _decode.get_decode_metadata(
            b,
            s_q,
            h_q,
            topk,
            topk_length,
            num_sms=sched.selkv_num_sms,
            out=md,
            extra_topk=extra_topk,
            extra_topk_length=extra_topk_length,
        )
    sched.tile_scheduler_metadata = md.metadata
    return md


def _decode_call(op: str, fn: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs a selkv decode and returns its result in FlashMLA's conventions: lse ``+inf`` for a
    query row with no valid index (written so by the kernels; out is 0), lse as the
    ``(B, H, S_q)`` view (no copy)."""
    try:
        out, lse = fn(*args, empty_lse_pos_inf=True, **kwargs)
    except RuntimeError as e:
        # The C++ API owns the scale rule (DESIGN §2) and names it sm_scale: say it as the
        # caller did.
        if ": sm_scale:" in str(e):
            raise ValueError(f"{op}: softmax_scale: {e}") from e
        raise
    return out, lse.transpose(1, 2)


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
    """FlashMLA ``flash_mla_with_kvcache``, sparse FP8 path (DeepSeek-V3.2 and MODEL1 layouts).

    Arguments (FlashMLA's names and order):
        q: bf16 ``(batch_size, seq_len_q, num_heads_q, d_qk)``; ``num_heads_q`` 64 or 128;
            ``d_qk`` 576 (V3.2) or 512 (MODEL1).
        k_cache: uint8 / int8 / float8_e4m3fn, each page dense: V3.2 ``(num_blocks,
            page_block_size, 1, 656)``, 656-byte ``ds_mla_fp8`` records (512 FP8 NoPE, 4 fp32
            scales, 64 bf16 RoPE); MODEL1 ``(num_blocks, page_block_size, 1, 584)`` over pages
            padded to a multiple of 576 bytes (``model1_fp8``: per page the 576-byte NoPE + RoPE
            records, then 8 scale bytes per token), as FlashMLA's ``quantize_k_cache`` makes it.
        block_table, cache_seqlens: ignored by the sparse path (may be ``None``).
        head_dim_v: must be 512.
        tile_scheduler_metadata: the :class:`FlashMLASchedMeta` from :func:`get_mla_metadata`.
            Reusable across calls (layers) with the same shapes and the same ``topk_length``
            values, as in FlashMLA.
        num_splits: must be ``None``.
        softmax_scale: default ``d_qk ** -0.5`` (``576 ** -0.5``, MODEL1 ``512 ** -0.5``); finite and > 0 with ``softmax_scale * log2(e)``
            finite in fp32 (else :class:`ValueError` naming it).
        causal: must be ``False``.
        is_fp8_kvcache: must be ``True``.
        indices: int32 ``(batch_size, seq_len_q, topk)`` physical slots
            (``block * page_block_size + offset``), ``topk`` a multiple of 64. Any invalid
            entry (``-1``, ``INT_MAX``, out of range) is skipped, never read.
        attn_sink: optional fp32 ``(num_heads_q,)``; ``out *= exp(lse) / (exp(lse) +
            exp(attn_sink))``; no effect on the returned lse.
        extra_k_cache: MODEL1 only, optional second cache in ``k_cache``'s layout with its own
            ``page_block_size`` and block count; its selected tokens join the same softmax.
        extra_indices_in_kvcache: int32 ``(batch_size, seq_len_q, extra_topk)`` physical slots
            of ``extra_k_cache`` (``extra_topk`` a multiple of 64); with ``extra_k_cache``.
        topk_length: optional int32 ``(batch_size,)``: only the first ``topk_length[b]``
            indices of row ``b`` are processed.
        extra_topk_length: optional int32 ``(batch_size,)``, the same for the extra indices.

    Returns:
        ``(out, softmax_lse)``: ``out`` bf16 ``(batch_size, seq_len_q, num_heads_q, 512)``;
        ``softmax_lse`` fp32 ``(batch_size, num_heads_q, seq_len_q)`` (a transposed view, as in
        FlashMLA), natural log; ``+inf`` (and ``out = 0``) for a query row with no valid index.
    """
    op = "flash_mla_with_kvcache"
    sched = _check_sched(op, tile_scheduler_metadata)
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits: must be None")
    if indices is None:
        raise NotImplementedError(
            "flash_mla_with_kvcache: dense attention (indices=None) is not supported by selkv; "
            "pass indices (sparse FP8 path)"
        )
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError(
            "flash_mla_with_kvcache: extra_k_cache and extra_indices_in_kvcache go together"
        )
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("flash_mla_with_kvcache: extra_topk_length: given without extra_k_cache")
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
            f"576 or 512), got {tuple(q.shape)}"
        )
    if indices.dim() != 3:
        raise ValueError(
            "flash_mla_with_kvcache: indices: expected shape (batch_size, seq_len_q, topk), "
            f"got {tuple(indices.shape)}"
        )
    kv = _kv_cache_view(k_cache)
    extra_kv = None
    extra_topk = 0
    if extra_k_cache is not None:
        extra_kv = _kv_cache_view(extra_k_cache, op, "extra_k_cache")
        if extra_indices_in_kvcache.dim() != 3:
            raise ValueError(
                "flash_mla_with_kvcache: extra_indices_in_kvcache: expected shape (batch_size, "
                f"seq_len_q, extra_topk), got {tuple(extra_indices_in_kvcache.shape)}"
            )
        extra_topk = extra_indices_in_kvcache.shape[-1]
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    topk = indices.shape[-1]
    config = FlashMLASchedMeta.Config(
        b, s_q, h_q, k_cache.shape[1], k_cache.shape[2] if k_cache.dim() == 4 else 1,
        causal, is_fp8_kvcache, topk,
        extra_k_cache.shape[1] if extra_k_cache is not None else None,
        extra_topk if extra_k_cache is not None else None,
    )
    if not sched.have_initialized:
        # (a config set by get_packed_mla_metadata: the same shapes; the page size is free)
        _check_shape_key(op, sched.config, (b, s_q, h_q, topk))
        _check_device(op, sched, q)
        sched.config = config
        sched.have_initialized = True
    elif sched.config != config:
        raise ValueError(
            f"{op}: tile_scheduler_metadata: made for {sched.config}, but called with "
            f"{config}; use one metadata object per configuration"
        )
    md = _plan(sched, b, s_q, h_q, topk, topk_length, q.device, extra_topk, extra_topk_length)
    return _decode_call(
        op,
        _decode.sparse_mla_decode,
        q,
        kv,
        indices,
        md,
        softmax_scale,
        topk_length=topk_length,
        attn_sink=attn_sink,
        extra_kv_cache=extra_kv,
        extra_indices=extra_indices_in_kvcache,
        extra_topk_length=extra_topk_length,
    )


# ---- packed selected-KV path (DESIGN C6) ---------------------------------------------------------
_MAX_ENTRIES = 2**31  # B * S_q * K must stay below (selkv/packed.h)


def _int_arg(op: str, name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{op}: {name}: expected an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{op}: {name}: expected an int, got {type(v).__name__}") from None


def _packed_shape(op: str, batch_size: Any, query_len: Any, topk: Any) -> tuple[int, int, int]:
    """(B, S_q, K) of a packed buffer, validated (FlashMLA's rules, and selkv's entry bound)."""
    b = _int_arg(op, "batch_size", batch_size)
    s_q = _int_arg(op, "query_len", query_len)
    k = _int_arg(op, "topk", topk)
    if b < 1:
        raise ValueError(f"{op}: batch_size: must be >= 1, got {b}")
    if s_q < 1:
        raise ValueError(f"{op}: query_len: must be >= 1, got {s_q}")
    if k < 64 or k % 64 != 0:
        raise ValueError(f"{op}: topk: must be a positive multiple of 64, got {k}")
    if b * s_q * k >= _MAX_ENTRIES:
        raise ValueError(
            f"{op}: topk: batch_size * query_len * topk must be < 2^31 entries, got {b * s_q * k}"
        )
    return b, s_q, k


def get_packed_kv_workspace_size(batch_size: int, query_len: int, topk: int) -> int:
    """FlashMLA ``get_packed_kv_workspace_size``: bytes of the packed buffer that
    :func:`pack_selected_kv` fills for ``(batch_size, query_len, topk)``.

    selkv's size (``selkv.packed_kv_workspace_size``): the ``B * S_q * K`` 656-byte records,
    then one validity bit per entry and 16 bytes of shape words, so ``B * S_q * K / 8 + 16``
    bytes more than FlashMLA's ``B * S_q * K * 656``. Allocate it as contiguous uint8 and pass it as ``out`` to
    :func:`pack_selected_kv`.

    Raises:
        ValueError naming the argument: ``batch_size`` or ``query_len`` < 1, ``topk`` not a
        positive multiple of 64, or ``batch_size * query_len * topk >= 2^31``.
    """
    b, s_q, k = _packed_shape("get_packed_kv_workspace_size", batch_size, query_len, topk)
    return int(_packed.packed_kv_workspace_size(b, s_q, k))


def get_packed_mla_metadata(
    *,
    batch_size: int,
    query_len: int,
    num_heads: int,
    topk: int,
    device: torch.device | str,
    topk_length: int | Sequence[int] | None = None,
    num_sms: int | None = None,
) -> FlashMLASchedMeta:
    """FlashMLA ``get_packed_mla_metadata``: scheduler metadata for
    :func:`flash_mla_with_packed_kvcache`.

    selkv has one decode planner: the packed decode uses the schedule ``flash_mla_with_kvcache``
    uses, so that both give the same bits (FlashMLA's H=64 request-local scheduler is not
    implemented; ``topk_length`` does not select a schedule here). This validates the arguments
    and returns a
    :class:`FlashMLASchedMeta` with ``config`` set from them; the first
    :func:`flash_mla_with_packed_kvcache` call using it is checked against that ``config`` and
    makes the plan on the device (graph-capturable), for the ``topk_length`` *tensor* that call
    passes.

    Arguments (keyword-only, as FlashMLA's):
        batch_size, query_len: ``B`` and ``S_q``, >= 1.
        num_heads: 64 or 128.
        topk: ``K``, a positive multiple of 64.
        device: the device the decode runs on (``q``'s device; checked at the first call).
        topk_length: host lengths, an int (every batch row) or one int per batch row, each in
            ``[0, topk]``; only validated (the decode uses the tensor passed to
            :func:`flash_mla_with_packed_kvcache`). A tensor is rejected: pass it to the decode.
        num_sms: SMs to schedule for (>= 1); ``None``: all SMs of the device. A value other than
            the device's count changes the split and so the last bits of the result relative to
            ``flash_mla_with_kvcache`` (which schedules for the whole device).

    Raises:
        ValueError naming the argument.
    """
    op = "get_packed_mla_metadata"
    b, s_q, k = _packed_shape(op, batch_size, query_len, topk)
    h = _int_arg(op, "num_heads", num_heads)
    if h not in (64, 128):
        raise ValueError(f"{op}: num_heads: must be 64 or 128, got {h}")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError, ValueError) as e:
        raise ValueError(f"{op}: device: not a device: {device!r} ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{op}: device: {dev}, but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise ValueError(f"{op}: device: expected a CUDA (or CPU) device, got {dev}")
    if topk_length is not None:
        if isinstance(topk_length, torch.Tensor):
            raise ValueError(
                f"{op}: topk_length: expected host ints (an int or one per batch row), got a "
                "tensor; pass the tensor to flash_mla_with_packed_kvcache"
            )
        if isinstance(topk_length, (int, bool)) or hasattr(topk_length, "__index__"):
            lengths = [_int_arg(op, "topk_length", topk_length)] * b
        else:
            try:
                lengths = [_int_arg(op, "topk_length", v) for v in topk_length]
            except TypeError:
                raise ValueError(
                    f"{op}: topk_length: expected an int or a sequence of ints, got "
                    f"{type(topk_length).__name__}"
                ) from None
        if len(lengths) != b:
            raise ValueError(
                f"{op}: topk_length: expected one value per batch row ({b}), got {len(lengths)}"
            )
        bad = [v for v in lengths if not 0 <= v <= k]
        if bad:
            raise ValueError(f"{op}: topk_length: values must be in [0, topk={k}], got {bad[0]}")
    sms = 0
    if num_sms is not None:
        sms = _int_arg(op, "num_sms", num_sms)
        if sms < 1:
            raise ValueError(f"{op}: num_sms: must be >= 1 (or None: the device's), got {sms}")
    return FlashMLASchedMeta(
        config=FlashMLASchedMeta.Config(b, s_q, h, 64, 1, False, True, k),
        selkv_num_sms=sms,
        selkv_device=dev,
    )


def _packed_buffer(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """A packed buffer argument as the flat uint8 view the selkv ops take (no copy)."""
    if t.dtype not in _BYTE_DTYPES:
        raise ValueError(
            f"{op}: {name}: expected a uint8 (or int8 / float8_e4m3fn) buffer, got {t.dtype}"
        )
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name}: expected a contiguous buffer, got strides {t.stride()}")
    return t.view(torch.uint8).view(-1)


def pack_selected_kv(
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FlashMLA ``pack_selected_kv``: copies the selected 656-byte records of the cache into a
    packed buffer for :func:`flash_mla_with_packed_kvcache` (``selkv.pack_selected_kv``).

    Arguments:
        k_cache: as for :func:`flash_mla_with_kvcache`: ``(num_blocks, page_block_size, 1,
            656)`` (or without the head dim) uint8 / int8 / float8_e4m3fn.
        indices: int32 ``(batch_size, seq_len_q, topk)`` physical slots, ``topk`` a multiple of
            64. Every invalid entry (not a slot of the cache, or at or past ``topk_length``) is
            marked invalid in the buffer and never read; valid entries need not be a prefix.
        topk_length: optional int32 ``(batch_size,)`` tensor: entries ``k >= topk_length[b]``
            are invalid. Pass the same tensor to the decode.
        out: optional contiguous uint8 buffer of at least
            ``get_packed_kv_workspace_size(batch_size, seq_len_q, topk)`` bytes.

    Returns:
        the packed buffer, a flat uint8 tensor of exactly
        ``get_packed_kv_workspace_size(batch_size, seq_len_q, topk)`` bytes (a view of ``out``
        when given): pass this returned tensor to :func:`flash_mla_with_packed_kvcache`, which
        derives ``topk`` from its size.

    Asynchronous on the current stream (graph-capturable); pack on another stream and order the
    decode after it with an event, as for any producer.
    """
    op = "pack_selected_kv"
    kv = _kv_cache_view(k_cache, op)
    if indices.dim() != 3:
        raise ValueError(
            f"{op}: indices: expected shape (batch_size, seq_len_q, topk), got "
            f"{tuple(indices.shape)}"
        )
    if out is not None:
        out = _packed_buffer(op, "out", out)
    buf = _packed.pack_selected_kv(kv, indices, topk_length, out=out)
    flat = buf.view(-1)
    n = int(_packed.packed_kv_workspace_size(*indices.shape))
    return flat if flat.numel() == n else flat[:n]


def _packed_topk(op: str, n: int, b: int, s_q: int, hint: int | None) -> int:
    """The ``K`` whose packed buffer for ``(b, s_q, K)`` is exactly ``n`` bytes: the inverse of
    the size function (strictly increasing in K), by bisection over multiples of 64; ``hint``
    (the metadata's K) is tried first."""
    size = _packed.packed_kv_workspace_size
    if hint is not None and b * s_q * hint < _MAX_ENTRIES and int(size(b, s_q, hint)) == n:
        return hint
    rows = b * s_q
    # size(K) >= rows * K * 656, and rows * K < 2^31
    lo, hi = 1, min(n // (rows * 64 * 656), (_MAX_ENTRIES - 1) // (rows * 64))
    while lo <= hi:
        m = (lo + hi) // 2
        got = int(size(b, s_q, 64 * m))
        if got == n:
            return 64 * m
        if got < n:
            lo = m + 1
        else:
            hi = m - 1
    raise ValueError(
        f"{op}: packed_k_cache: {n} bytes is not get_packed_kv_workspace_size(batch_size={b}, "
        f"query_len={s_q}, topk) for any topk (a multiple of 64): pass the buffer "
        "pack_selected_kv returned for these q rows"
    )


def flash_mla_with_packed_kvcache(
    q: torch.Tensor,
    packed_k_cache: torch.Tensor,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    softmax_scale: float | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA ``flash_mla_with_packed_kvcache``: sparse MLA decode over a packed buffer.

    The result equals :func:`flash_mla_with_kvcache`'s over the cache, indices and
    ``topk_length`` the buffer was packed from (bitwise on the GPU with the same schedule: the
    same kernel reads the same bytes in the same order), provided the buffer was packed after
    those cache entries were written.

    Arguments:
        q: bf16 ``(batch_size, seq_len_q, num_heads_q, 576)``; ``num_heads_q`` 64 or 128.
        packed_k_cache: the buffer :func:`pack_selected_kv` returned for these rows; ``topk`` is
            derived from its size (it must be exactly
            ``get_packed_kv_workspace_size(batch_size, seq_len_q, topk)`` bytes for a multiple
            of 64 ``topk``).
        head_dim_v: must be 512.
        tile_scheduler_metadata: a :class:`FlashMLASchedMeta` from
            :func:`get_packed_mla_metadata` (or :func:`get_mla_metadata`); reusable across
            layers with the same shapes and ``topk_length`` values, as in FlashMLA.
        softmax_scale: default ``q.shape[-1] ** -0.5``; finite and > 0 with
            ``softmax_scale * log2(e)`` finite in fp32.
        topk_length: optional int32 ``(batch_size,)``: the tensor the buffer was packed with.
        attn_sink: optional fp32 ``(num_heads_q,)``, as for :func:`flash_mla_with_kvcache`.

    Returns:
        ``(out, softmax_lse)`` as :func:`flash_mla_with_kvcache` returns them: ``out`` bf16
        ``(batch_size, seq_len_q, num_heads_q, 512)``, ``softmax_lse`` fp32
        ``(batch_size, num_heads_q, seq_len_q)`` (a transposed view), ``+inf`` (and ``out = 0``)
        for a query row with no valid entry.

    Raises:
        ValueError naming the argument (``head_dim_v``, ``q``, ``packed_k_cache``,
        ``tile_scheduler_metadata`` for a call that does not match its configuration,
        ``softmax_scale``); TypeError for a ``tile_scheduler_metadata`` of another type;
        RuntimeError from the operator's checks; NotImplementedError on a GPU other than SM90.
    """
    op = "flash_mla_with_packed_kvcache"
    sched = _check_sched(op, tile_scheduler_metadata)
    if head_dim_v != 512:
        raise ValueError(f"{op}: head_dim_v: must be 512, got {head_dim_v}")
    if q.dim() != 4:
        raise ValueError(
            f"{op}: q: expected shape (batch_size, seq_len_q, num_heads_q, 576), got "
            f"{tuple(q.shape)}"
        )
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    if b < 1 or s_q < 1:
        raise ValueError(
            f"{op}: q: batch_size and seq_len_q must be >= 1, got shape {tuple(q.shape)}"
        )
    packed = _packed_buffer(op, "packed_k_cache", packed_k_cache)
    config = sched.config
    topk = _packed_topk(op, packed.numel(), b, s_q, config.topk if config is not None else None)
    # (a config made by flash_mla_with_kvcache serves too: its page size does not matter here)
    _check_shape_key(op, config, (b, s_q, h_q, topk))
    if not sched.have_initialized:
        _check_device(op, sched, q)
        if config is None:
            sched.config = FlashMLASchedMeta.Config(b, s_q, h_q, 64, 1, False, True, topk)
        sched.have_initialized = True
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    md = _plan(sched, b, s_q, h_q, topk, topk_length, q.device)
    return _decode_call(
        op,
        _decode.sparse_mla_decode_packed,
        q,
        packed,
        md,
        softmax_scale,
        topk=topk,
        topk_length=topk_length,
        attn_sink=attn_sink,
    )
