"""Sparse MLA decode over a paged FP8 cache (DESIGN C5): ``ds_mla_fp8`` (DeepSeek-V3.2, q and K
576 dims) or ``model1_fp8`` (FlashMLA's MODEL1, q and K 512 dims, V = all of K), the latter with an
optional extra KV cache (its own pages, indices and top-k lengths) attended in the same softmax.

Two steps, as in the C++ API (``include/selkv/decode.h``)::

    md = selkv.get_decode_metadata(B, S_q, H, K, topk_length)       # plan (one tiny kernel)
    out, lse = selkv.sparse_mla_decode(q, kv_cache, indices, md, sm_scale,
                                       topk_length=topk_length)    # per layer / per call

The plan computes the split-KV partition on the device (no host synchronization; CUDA-graph
capturable) and records, host side, the shape it was made for. Every decode call is checked
against it by the C++ layer: a different batch, S_q, head count, top-k, or a different
``topk_length`` tensor is an error, never a silent misread. With ``topk_length`` the plan
depends on its *contents*: make it again (into the same buffers with ``out=md``) whenever they
change, e.g. once per engine step, inside the same CUDA graph. The plan keeps a snapshot of
the lengths: a decode after the values changed without a new plan computes the result for the
lengths at planning time (consistently), never a mix.

Streams: the plan's schedule is read-only during a decode, so one plan serves decodes on any
stream once that stream is ordered after the planning stream (``wait_stream`` / an event, as for
any tensor). The split accumulators are written by every decode: a decode on the planning stream
uses the plan's workspace, a decode on another stream gets its own from torch's stream-ordered
allocator (or pass ``workspace=``), so concurrent decodes of one plan never share one.

Index semantics (DESIGN §2): ``indices[b, s, k]`` is a physical slot ``block * page_size +
offset``; it is valid iff ``0 <= slot < num_blocks * page_size`` and ``k < topk_length[b]``
(when given). Anything else (-1, INT_MAX, other garbage) contributes nothing and is never
dereferenced. A query row without a valid index gives ``out = 0`` and ``lse = -inf``.

Packed KV (DESIGN C6, ``include/selkv/packed.h``): :func:`sparse_mla_decode_packed` is the same
decode over a buffer made by :func:`selkv.pack_selected_kv` (the selected records copied out of
the cache, e.g. early, on a side stream) instead of the cache and indices. It takes the same plan
(:func:`get_decode_metadata` for the same ``(B, S_q, H, K, topk_length)``) and the same workspace
rules, and returns the same bits as :func:`sparse_mla_decode` over the cache and indices the
buffer was packed from::

    packed = selkv.pack_selected_kv(kv_cache, indices, topk_length)     # any stream, earlier
    out, lse = selkv.sparse_mla_decode_packed(q, packed, md, sm_scale, topk=K,
                                              topk_length=topk_length)

CPU tensors run the fp64 reference (``out`` rounded to bf16) behind the same checks; the
operators also have Meta kernels (checks only) for ``torch.compile``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ._ops import expect_dims
from ._ops import ops as _ops

__all__ = [
    "DecodeMetadata",
    "decode_metadata_size",
    "get_decode_metadata",
    "sparse_mla_decode",
    "sparse_mla_decode_packed",
]


@functools.cache
def _plan_index() -> dict[str, int]:
    """Name -> position in the plan list; the layout is the C++ binding's
    (``torch.ops.selkv.decode_plan_fields``), read once."""
    return {name: i for i, name in enumerate(_ops.decode_plan_fields())}


def _plan_field(plan: list[int], name: str) -> int:
    return plan[_plan_index()[name]]


@dataclasses.dataclass
class DecodeMetadata:
    """A decode plan made by :func:`get_decode_metadata`.

    Attributes:
        metadata: int32 device buffer holding the split-KV schedule.
        workspace: uint8 device buffer for the split accumulators (sized by the plan).
        plan: the host-side description the C++ API checks every call against, an opaque
            ``list[int]`` laid out by the C++ binding; its fields are named by
            ``torch.ops.selkv.decode_plan_fields()`` and read with :meth:`field` or the
            properties below.
        topk_length: the ``topk_length`` tensor the plan was made with (kept alive here; the
            decode must be called with this same tensor), or ``None``.
        stream: the CUDA stream the plan was made on (``None`` on the CPU): decodes on this
            stream use ``workspace``, decodes on other streams allocate their own.
    """

    metadata: torch.Tensor
    workspace: torch.Tensor
    plan: list[int]
    topk_length: torch.Tensor | None = None
    stream: torch.cuda.Stream | None = None
    extra_topk_length: torch.Tensor | None = None

    def field(self, name: str) -> int:
        """The plan's field ``name`` (one of ``torch.ops.selkv.decode_plan_fields()``)."""
        return _plan_field(self.plan, name)

    @property
    def batch(self) -> int:
        return self.field("batch")

    @property
    def seq_q(self) -> int:
        return self.field("seq_q")

    @property
    def num_heads(self) -> int:
        return self.field("num_heads")

    @property
    def topk(self) -> int:
        return self.field("topk")

    @property
    def num_sm_parts(self) -> int:
        return self.field("num_sm_parts")

    @property
    def min_blocks_per_part(self) -> int:
        return self.field("min_blocks_per_part")

    @property
    def extra_topk(self) -> int:
        return self.field("extra_topk")


def decode_metadata_size(batch: int, seq_q: int) -> int:
    """Number of int32 values of the metadata buffer for ``batch * seq_q`` query rows."""
    return int(_ops.decode_metadata_size(batch, seq_q))


def get_decode_metadata(
    batch: int,
    seq_q: int,
    num_heads: int,
    topk: int,
    topk_length: torch.Tensor | None = None,
    *,
    num_sms: int = 0,
    min_blocks_per_part: int = 0,
    device: torch.device | str | None = None,
    out: DecodeMetadata | None = None,
    extra_topk: int = 0,
    extra_topk_length: torch.Tensor | None = None,
) -> DecodeMetadata:
    """Plans a sparse MLA decode (split-KV schedule, computed on the device).

    Args:
        batch: batch rows ``B`` of the decode calls this plan serves (exactly the rows passed;
            e.g. only the decode rows of a mixed batch).
        seq_q: query tokens per batch row ``S_q``.
        num_heads: query heads ``H``, 64 or 128.
        topk: index entries per query row ``K``, a positive multiple of 64.
        topk_length: optional int32 ``[B]`` (dynamic top-k): only the first
            ``topk_length[b]`` entries of row ``b`` are read. The plan depends on the values;
            remake it when they change, and pass this same tensor to the decode.
        num_sms: SMs to schedule for; 0 = all SMs of the device.
        min_blocks_per_part: split-KV granularity, the fewest 64-token blocks a part gets
            (0 = the measured default for ``num_heads`` and the call's block count; with
            ``topk_length`` the plan may then give each block its own part when they all fit
            the grid and some row is longer than the default).
        device: where to allocate the buffers when ``out`` is not given (default: the device
            of ``topk_length``, else the current CUDA device). A CPU device plans for the
            CPU reference.
        out: a previous plan whose buffers are reused (when large enough), e.g. to remake the
            plan inside a CUDA graph without allocating.
        extra_topk: ``K2``, index entries per query row of the extra KV cache (``model1_fp8``
            decodes only), 0 (none) or a multiple of 64. A row's 64-token blocks are the main
            cache's then the extra cache's.
        extra_topk_length: optional int32 ``[B]``: only the first ``extra_topk_length[b]``
            extra entries of row ``b`` are read (needs ``extra_topk > 0``); pass this same tensor
            to the decode.

    Returns:
        a :class:`DecodeMetadata`.

    Call it outside ``torch.compile`` regions (its result is host-side data), like FlashMLA's
    ``get_mla_metadata``; it is CUDA-graph capturable.
    """
    if out is not None:
        dev = out.metadata.device
    elif device is not None:
        dev = torch.device(device)
    elif topk_length is not None:
        dev = topk_length.device
    elif extra_topk_length is not None:
        dev = extra_topk_length.device
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
    n = decode_metadata_size(batch, seq_q)
    if out is not None and out.metadata.numel() >= n:
        metadata = out.metadata
    else:
        metadata = torch.empty((n,), dtype=torch.int32, device=dev)
    plan = [
        int(v)
        for v in _ops.get_decode_metadata(
            batch,
            seq_q,
            num_heads,
            topk,
            topk_length,
            num_sms,
            metadata,
            min_blocks_per_part,
            extra_topk,
            extra_topk_length,
        )
    ]
    ws_bytes = max(_plan_field(plan, "workspace_bytes"), 16)
    if out is not None and out.workspace.numel() >= ws_bytes:
        workspace = out.workspace
    else:
        workspace = torch.empty((ws_bytes,), dtype=torch.uint8, device=metadata.device)
    stream = torch.cuda.current_stream(metadata.device) if metadata.device.type == "cuda" else None
    if out is not None:
        out.metadata, out.workspace, out.plan, out.topk_length, out.stream = (
            metadata,
            workspace,
            plan,
            topk_length,
            stream,
        )
        out.extra_topk_length = extra_topk_length
        return out
    return DecodeMetadata(metadata, workspace, plan, topk_length, stream, extra_topk_length)


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    metadata: DecodeMetadata,
    sm_scale: float | None = None,
    *,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    empty_lse_pos_inf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode: attention of each query row over its selected FP8 cache slots.

    Args:
        q: bf16 ``[B, S_q, H, D]``, ``D`` = 576 (``ds_mla_fp8``: 512 latent + 64 RoPE) or 512
            (``model1_fp8``: 448 + 64), last dim dense, 16-byte aligned rows.
        kv_cache: uint8 paged cache, pages dense, the block stride may be larger: ``[num_blocks,
            page_size, 656]`` ``ds_mla_fp8``, or ``[num_blocks, page_size, 584]`` ``model1_fp8``
            (a view of the padded pages, as FlashMLA's tests build it; see
            :func:`selkv.empty_kv_cache`). The format follows from the last dim.
        indices: int32 ``[B, S_q, K]`` physical slots, last dim dense; invalid entries are
            skipped (see the module docstring).
        metadata: the plan from :func:`get_decode_metadata` for exactly this
            ``(B, S_q, H, K, topk_length)``.
        sm_scale: softmax scale applied to ``q . k``; default ``D ** -0.5``. Finite and
            ``> 0`` with ``sm_scale * log2(e)`` finite in fp32, else a RuntimeError naming it.
        topk_length: optional int32 ``[B]``; must be the tensor the plan was made with.
        attn_sink: optional fp32 ``[H]``: ``out *= 1 / (1 + exp(attn_sink[h] - lse))``
            (``lse`` is returned unchanged).
        out: optional bf16 ``[B, S_q, H, 512]`` output (last dim dense).
        lse: optional fp32 ``[B, S_q, H]`` output (last dim dense).
        workspace: optional uint8 buffer of at least ``metadata.workspace.numel()`` bytes for
            the split accumulators (default: the plan's on its own stream, a fresh one on any
            other stream, so that decodes running at the same time never share one).
        extra_kv_cache: optional second ``model1_fp8`` cache (its own page size, block count
            and block stride) whose selected slots join the same softmax (FlashMLA's
            ``extra_k_cache``); needs ``extra_indices`` and a plan made with ``extra_topk``.
        extra_indices: int32 ``[B, S_q, K2]`` physical slots of ``extra_kv_cache`` (DESIGN §2
            with its own slot count).
        extra_topk_length: optional int32 ``[B]``; must be the tensor the plan was made with.
        empty_lse_pos_inf: the lse of a row with no valid slot is ``+inf`` (FlashMLA's
            convention) instead of ``-inf``; written by the kernels, no extra pass.

    Returns:
        ``(out, lse)``: ``out`` bf16 ``[B, S_q, H, 512]``; ``lse`` fp32 ``[B, S_q, H]``, the
        natural-log logsumexp of ``sm_scale * q . k`` over the valid slots of both caches
        (``-inf``, or ``+inf`` with ``empty_lse_pos_inf``, and ``out = 0`` for a row with no
        valid slot).

    ``B = 0`` or ``S_q = 0`` (no rows) is a no-op returning empty outputs.

    Raises:
        RuntimeError naming the argument on a wrong dtype / device / shape / stride /
        alignment, outputs that overlap each other or an input, or a plan mismatch;
        NotImplementedError on a GPU other than SM90.
    """
    sm_scale, out, lse, workspace = _call_args("selkv::sparse_mla_decode", q, metadata, sm_scale, out, lse, workspace)
    _ops.sparse_mla_decode(
        q,
        kv_cache,
        indices,
        topk_length,
        attn_sink,
        metadata.metadata,
        metadata.plan,
        workspace,
        sm_scale,
        out,
        lse,
        extra_kv_cache,
        extra_indices,
        extra_topk_length,
        bool(empty_lse_pos_inf),
    )
    return out, lse


def sparse_mla_decode_packed(
    q: torch.Tensor,
    packed_kv: torch.Tensor,
    metadata: DecodeMetadata,
    sm_scale: float | None = None,
    *,
    topk: int | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    empty_lse_pos_inf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over a packed KV buffer (DESIGN C6): :func:`sparse_mla_decode` with the
    cache and indices replaced by the buffer :func:`selkv.pack_selected_kv` made from them.

    Args:
        q: bf16 ``[B, S_q, H, 576]``, as for :func:`sparse_mla_decode`.
        packed_kv: contiguous uint8 buffer packed for ``(B, S_q, topk)``, at least
            ``selkv.packed_kv_workspace_size(B, S_q, topk)`` bytes (opaque; its layout is
            ``include/selkv/packed.h``'s). Order the decode after the pack (and any patch) that
            wrote it, e.g. with an event when they ran on another stream.
        metadata: the plan from :func:`get_decode_metadata` for exactly this
            ``(B, S_q, H, topk, topk_length)``: the same plan a native decode takes.
        sm_scale: as for :func:`sparse_mla_decode` (default ``576 ** -0.5``).
        topk: ``K``, the entries per query row the buffer was packed with (the buffer does not
            record it); default: the plan's ``K`` (a different value is a plan mismatch).
        topk_length: optional int32 ``[B]``; must be the tensor the plan was made with. Pass the
            lengths the buffer was packed with: entries at or past the planned length are not
            attended, and entries the pack marked invalid never are.
        attn_sink, out, lse, workspace, empty_lse_pos_inf: as for :func:`sparse_mla_decode`
            (the same workspace rules: the plan's on its own stream, a fresh one on any other
            stream).

    Returns:
        ``(out, lse)`` as :func:`sparse_mla_decode` returns them; bitwise equal to
        :func:`sparse_mla_decode` over the cache and indices the buffer was packed from (same
        plan), as long as the buffer was packed after those cache entries were written.

    Raises:
        RuntimeError naming the argument on a wrong dtype / device / shape / stride /
        alignment, a ``packed_kv`` smaller than ``packed_kv_workspace_size(B, S_q, topk)``,
        outputs that overlap each other or an input, or a plan mismatch (a ``topk`` other than
        the plan's included); NotImplementedError on a GPU other than SM90.
    """
    sm_scale, out, lse, workspace = _call_args("selkv::sparse_mla_decode_packed", q, metadata, sm_scale, out, lse,
                                               workspace)
    if topk is None:
        topk = _plan_field(metadata.plan, "topk")
    _ops.sparse_mla_decode_packed(
        q,
        packed_kv,
        int(topk),
        topk_length,
        attn_sink,
        metadata.metadata,
        metadata.plan,
        workspace,
        sm_scale,
        out,
        lse,
        bool(empty_lse_pos_inf),
    )
    return out, lse


def _call_args(
    op: str,
    q: torch.Tensor,
    metadata: DecodeMetadata,
    sm_scale: float | None,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    workspace: torch.Tensor | None,
) -> tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The defaults both decodes share: the scale, the outputs and the split workspace (the
    plan's on the stream that made it, a fresh one on any other stream)."""
    expect_dims(op, "q", q, 4, "[batch, seq_q, num_heads, d_qk]")
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    B, S, H = q.shape[0], q.shape[1], q.shape[2]
    if out is None:
        out = torch.empty((B, S, H, 512), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((B, S, H), dtype=torch.float32, device=q.device)
    if workspace is None:
        workspace = metadata.workspace
        if (
            metadata.stream is not None
            and q.device.type == "cuda"
            and torch.cuda.current_stream(q.device) != metadata.stream
        ):
            workspace = torch.empty_like(workspace)
    return float(sm_scale), out, lse, workspace
