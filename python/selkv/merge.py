"""LSE merge of partial attention results (DESIGN C9).

Shard ``i`` of a KV split (context parallelism, split prefill / decode) gives ``out_i [T, H, D]``
and ``lse_i [T, H]`` (natural log, fp32). Per row, over the shards whose lse is not ``-inf``::

    m = max lse_i;  w_i = exp(lse_i - m);  out = sum w_i out_i / sum w_i;  lse = m + log(sum w_i)

in fp32, in shard order (deterministic). A NaN lse in any shard makes the row NaN; a ``+inf``
lse wins (``out`` = the first such shard's out, ``lse = +inf``) unless ``pos_inf_is_empty``,
which treats ``+inf`` as empty (FlashAttention / FlashMLA write ``+inf`` for rows without keys);
all shards empty gives ``out = 0``, ``lse = -inf``. The out of an empty shard never enters the
sum, even if it holds NaN.

Both functions wrap the out-variant operator ``torch.ops.selkv.merge_attn_states`` (CUDA: the
C++ API on the current stream, CUDA-graph capturable; CPU: the reference; Meta: checks only).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ._ops import ops as _ops

__all__ = ["merge_attn_states", "merge_attn_states_vllm"]


def _shards(x: torch.Tensor | Sequence[torch.Tensor], rank: int) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        if x.dim() != rank + 1:
            raise RuntimeError(
                f"selkv.merge_attn_states: expected a list of {rank}-d tensors or one stacked "
                f"{rank + 1}-d tensor, got shape {tuple(x.shape)}"
            )
        return list(x.unbind(0))
    return list(x)


def merge_attn_states(
    outs: torch.Tensor | Sequence[torch.Tensor],
    lses: torch.Tensor | Sequence[torch.Tensor],
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    pos_inf_is_empty: bool = False,
    return_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Merges N partial (out, lse) results into one (C9).

    Args:
        outs: N shards of ``[T, H, D]`` (bf16, fp16 or fp32; a list, or one stacked
            ``[N, T, H, D]`` tensor), 1 <= N <= 16, D a multiple of 8. Last dim dense; the other
            strides are free but shared by all shards (views of one stacked tensor always are).
        lses: N shards of fp32 ``[T, H]`` (a list or a stacked ``[N, T, H]``), any strides
            shared by the shards (a transposed ``[H, T]`` buffer works).
        out: optional ``[T, H, D]`` output of the dtype of ``outs``; must not overlap any input.
        lse: optional fp32 ``[T, H]`` output.
        pos_inf_is_empty: treat a ``+inf`` lse as an empty shard (FlashAttention's convention).
        return_lse: allocate ``lse`` when not given (otherwise only ``out`` is computed).

    Returns:
        ``(out, lse)``; ``lse`` is ``None`` when neither given nor requested.
    """
    outs_l = _shards(outs, 3)
    lses_l = _shards(lses, 2)
    if not outs_l:
        raise RuntimeError("selkv::merge_attn_states: outs: expected 1 to 16 shards, got 0")
    first = outs_l[0]
    if out is None:
        out = torch.empty(first.shape, dtype=first.dtype, device=first.device)
    if lse is None and return_lse:
        lse = torch.empty(first.shape[:2], dtype=torch.float32, device=first.device)
    _ops.merge_attn_states(outs_l, lses_l, out, lse, pos_inf_is_empty)
    return out, lse


def merge_attn_states_vllm(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: torch.Tensor | None = None,
) -> None:
    """vLLM's ``merge_attn_states`` (``vllm.attention.ops.merge_attn_states``) under its
    argument order and layouts.

    ``output``, ``prefix_output``, ``suffix_output``: ``[T, H, D]``; ``prefix_lse``,
    ``suffix_lse`` and the optional ``output_lse``: fp32 ``[H, T]`` (head-major). An infinite
    lse (``+inf``, as FlashAttention writes for a row without keys, or ``-inf``) marks an empty
    partial. Differences from vLLM's kernel: when both partials are empty ``output`` is 0 and
    ``output_lse`` is ``-inf`` (vLLM copies ``prefix_output``), and a NaN lse gives a NaN row.
    Writes ``output`` (and ``output_lse``) in place.
    """
    _ops.merge_attn_states(
        [prefix_output, suffix_output],
        [prefix_lse.t(), suffix_lse.t()],
        output,
        None if output_lse is None else output_lse.t(),
        True,
    )
