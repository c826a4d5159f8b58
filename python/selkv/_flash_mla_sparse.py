"""FlashMLA ``flash_mla_sparse_fwd`` over selkv's sparse prefill (C7); re-exported by
:mod:`selkv.flash_mla`."""

from __future__ import annotations

import torch

from . import prefill as _prefill


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA ``flash_mla_sparse_fwd``: sparse MLA prefill over bf16 KV.

    Arguments (FlashMLA's names and order):
        q: bf16 ``[s_q, h_q, d_qk]``; ``h_q`` 64 or 128, ``d_qk`` 576 or 512.
        kv: bf16 ``[s_kv, h_kv, d_qk]`` with ``h_kv == 1`` (a 2-d ``[s_kv, d_qk]`` is accepted).
        indices: int32 ``[s_q, h_kv, topk]`` (or ``[s_q, topk]``), ``topk`` a multiple of 64.
            Every entry outside ``[0, s_kv)`` is skipped without being read (FlashMLA: ``-1`` or
            ``>= s_kv``).
        sm_scale: softmax scale.
        d_v: must be 512.
        attn_sink: optional fp32 ``[h_q]``: ``out *= exp(lse) / (exp(lse) + exp(attn_sink))``
            (``-inf`` has no effect, ``+inf`` zeroes the output); no effect on ``lse`` /
            ``max_logits``. Fused in the kernel's epilogue (on the fp32 output, before its one
            rounding to bf16).
        topk_length: optional int32 ``[s_q]``: token ``i`` attends only to its first
            ``topk_length[i]`` entries.

    Returns:
        ``(out, max_logits, lse)``: bf16 ``[s_q, h_q, 512]``, fp32 ``[s_q, h_q]``, fp32
        ``[s_q, h_q]``. FlashMLA's convention for a token with no valid entry: ``out = 0``,
        ``max_logits = -inf``, ``lse = +inf``.
    """
    if d_v != 512:
        raise ValueError(f"flash_mla_sparse_fwd: d_v: must be 512, got {d_v}")
    if q.dim() != 3:
        raise ValueError(f"flash_mla_sparse_fwd: q: expected shape [s_q, h_q, d_qk], got {tuple(q.shape)}")
    if kv.dim() == 3:
        if kv.size(1) != 1:
            raise ValueError(
                "flash_mla_sparse_fwd: kv: expected h_kv == 1 (shape [s_kv, 1, d_qk]), got shape "
                f"{tuple(kv.shape)}"
            )
        kv = kv.select(1, 0)
    elif kv.dim() != 2:
        raise ValueError(f"flash_mla_sparse_fwd: kv: expected shape [s_kv, 1, d_qk], got {tuple(kv.shape)}")
    if indices.dim() == 3:
        if indices.size(1) != 1:
            raise ValueError(
                "flash_mla_sparse_fwd: indices: expected h_kv == 1 (shape [s_q, 1, topk]), got shape "
                f"{tuple(indices.shape)}"
            )
        indices = indices.select(1, 0)
    elif indices.dim() != 2:
        raise ValueError(
            f"flash_mla_sparse_fwd: indices: expected shape [s_q, 1, topk], got {tuple(indices.shape)}"
        )
    if attn_sink is not None and (
        attn_sink.dim() != 1 or attn_sink.size(0) != q.size(1) or attn_sink.dtype != torch.float32
    ):
        raise ValueError(
            "flash_mla_sparse_fwd: attn_sink: expected fp32 [h_q] = [" f"{q.size(1)}], got "
            f"{attn_sink.dtype} {tuple(attn_sink.shape)}"
        )
    # attn_sink is fused in the kernel's epilogue (out *= exp(lse) / (exp(lse) + exp(sink))).
    out, max_logits, lse = _prefill.sparse_prefill(
        q, kv, indices, sm_scale, topk_length=topk_length, attn_sink=attn_sink
    )
    # FlashMLA's convention for a token with no valid entry: lse = +inf (max_logits stays -inf).
    torch.nan_to_num_(lse, nan=float("nan"), posinf=float("inf"), neginf=float("inf"))
    return out, max_logits, lse
