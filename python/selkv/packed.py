"""Packed selected-KV buffers (DESIGN C6): pack the records a decode step selects once, patch single
entries later (``include/selkv/packed.h``).

- :func:`packed_kv_workspace_size` -- bytes of the packed buffer for ``(batch, seq_q, topk)``.
- :func:`pack_selected_kv` -- paged ``ds_mla_fp8`` cache + physical indices ``[B, S_q, K]`` ->
  packed buffer: entry ``e = (b * S_q + s) * K + k`` holds the 656-byte record of
  ``indices[b, s, k]`` at byte ``e * 656`` when the entry is valid, 656 zero bytes otherwise;
  then one validity bit per entry (uint32 words, bit ``e % 32`` of word ``e // 32``), then 16
  bytes of shape words (the shape it was packed for: a decode or patch at another shape fails
  closed, see :func:`patch_packed_kv`).
- :func:`patch_packed_kv` -- overwrite entries of a packed buffer with given records (e.g. the
  current token's record, once written) and mark them valid.

Validity (DESIGN §2): ``0 <= indices[b, s, k] < num_blocks * page_size`` and, when
``topk_length`` is given, ``k < topk_length[b]``; anything else (-1, INT_MAX, garbage) gives a
zero record and is never dereferenced. ``K`` must be a positive multiple of 64 and
``B * S_q * K < 2^31``. The buffer's layout is fixed so tests can check it byte for byte;
consumers should treat it as opaque.

CUDA tensors run the GPU kernels on the current stream (no host sync, CUDA-graph capturable when
``out`` is passed); CPU tensors run the byte-exact CPU oracle behind the same checks; the operators
have Meta kernels for ``torch.compile``. Errors raise ``RuntimeError`` naming the op and the argument.
"""

from __future__ import annotations

import torch

from ._ops import ops as _ops

__all__ = [
    "pack_selected_kv",
    "packed_kv_workspace_size",
    "patch_packed_kv",
]


def packed_kv_workspace_size(batch: int, seq_q: int, topk: int) -> int:
    """Bytes of a packed buffer for ``batch * seq_q`` rows of top-k ``topk``.

    ``batch * seq_q * topk * 656`` record bytes plus ``batch * seq_q * topk / 8`` bytes of
    validity words plus 16 bytes of shape words (about 1.28 MiB per row at ``topk = 2048``). 0 for an invalid shape (negative
    sizes, ``topk`` not a positive multiple of 64, ``batch * seq_q * topk >= 2^31``) or no rows.
    """
    return int(_ops.packed_kv_workspace_size(batch, seq_q, topk))


def pack_selected_kv(
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Copies the selected records of a paged FP8 cache into a packed buffer (C6 pack).

    Args:
        kv_cache: uint8 ``[num_blocks, page_size, 656]`` (``ds_mla_fp8``), pages dense, block
            stride ``kv_cache.stride(0)``.
        indices: int32 ``[B, S_q, K]`` physical slots, last dim dense; ``K`` a positive multiple
            of 64.
        topk_length: optional int32 ``[B]``: entries ``k >= topk_length[b]`` are invalid (values
            are clamped to ``[0, K]``).
        out: optional contiguous uint8 tensor of at least
            ``packed_kv_workspace_size(B, S_q, K)`` bytes (16-byte aligned); allocated (1-D, on
            ``indices.device``) when ``None``. Every byte of that size is written.

    Returns:
        The packed buffer (``out`` when given).
    """
    if out is None:
        n = packed_kv_workspace_size(*indices.shape) if indices.dim() == 3 else 0
        out = torch.empty(n, dtype=torch.uint8, device=indices.device)
    _ops.pack_selected_kv(kv_cache, indices, topk_length, out)
    return out


def patch_packed_kv(
    packed_kv: torch.Tensor,
    positions: torch.Tensor,
    records: torch.Tensor,
    *,
    batch: int,
    seq_q: int,
    topk: int,
) -> torch.Tensor:
    """Writes ``records[i]`` to entry ``positions[i]`` of a packed buffer and marks it valid.

    Args:
        packed_kv: a buffer packed for ``(batch, seq_q, topk)``; modified in place.
        positions: int64 ``[N]`` entry numbers ``(b * seq_q + s) * topk + k``; positions outside
            ``[0, batch * seq_q * topk)`` are skipped (CUDA-graph padding). Valid positions must
            be distinct.
        records: uint8 ``[N, >= 656]`` ``ds_mla_fp8`` records (the first 656 bytes of each row),
            last dim dense, row stride a multiple of 16 bytes.
        batch, seq_q, topk: the shape the buffer was packed for. A buffer packed for another
            shape (the sizes depend on ``batch * seq_q * topk`` only) gets no record: its shape
            words are poisoned instead, so every later decode of it gives NaN rows until it is
            packed again (a mistake fails closed; no error can be raised from the device).

    Returns:
        ``packed_kv``.
    """
    _ops.patch_packed_kv(packed_kv, batch, seq_q, topk, positions, records)
    return packed_kv
