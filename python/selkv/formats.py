"""KV record formats (byte-exact, little endian); mirrors ``include/selkv/format_traits.h``.

``ds_mla_fp8`` (656 bytes/token, DeepSeek-V3.2)::

    [0, 512)    512 x FP8 E4M3 NoPE, element i at byte i
    [512, 528)  4 x fp32 scales; scale k covers elements [128k, 128k + 128)
    [528, 656)  64 x bf16 RoPE, unquantized

``nope_fp8`` (528 bytes/token, GLM NoPE): the 656-byte record without the RoPE part.

A paged cache is a ``torch.uint8`` tensor ``[num_blocks, page_size, record_bytes]`` whose pages
are dense; the block stride (``cache.stride(0)``) may be larger than a page. Physical slot =
``block * page_size + offset``.

Scale modes of the writer (readers accept either): ``"pow2"`` (default),
``s = 2**ceil(log2(max(amax / 448, 1e-4)))``, for which dequantization is exact in bf16;
``"amax"``, ``s = max(amax / 448, FLT_MIN)``, what vLLM writes.
"""

from __future__ import annotations

NOPE_DIM = 512  # latent (NoPE) elements per token
ROPE_DIM = 64  # RoPE elements per token
QK_DIM = NOPE_DIM + ROPE_DIM  # 576
V_DIM = 512
TILE_ELEMS = 128  # elements sharing one fp32 scale
NUM_TILES = NOPE_DIM // TILE_ELEMS  # 4

NOPE_OFFSET = 0
SCALE_OFFSET = NOPE_DIM  # 512
ROPE_OFFSET = SCALE_OFFSET + 4 * NUM_TILES  # 528
DS_MLA_FP8_RECORD_BYTES = ROPE_OFFSET + 2 * ROPE_DIM  # 656
NOPE_FP8_RECORD_BYTES = ROPE_OFFSET  # 528

E4M3_MAX = 448.0

FORMATS = ("ds_mla_fp8", "nope_fp8")
SCALE_MODES = ("pow2", "amax")

_RECORD_BYTES = {"ds_mla_fp8": DS_MLA_FP8_RECORD_BYTES, "nope_fp8": NOPE_FP8_RECORD_BYTES}


def _check_format(format: str) -> None:
    if format not in _RECORD_BYTES:
        raise ValueError(f"selkv: format: expected one of {FORMATS}, got {format!r}")


def record_bytes(format: str) -> int:
    """Bytes per token of a record: 656 for ``ds_mla_fp8``, 528 for ``nope_fp8``."""
    _check_format(format)
    return _RECORD_BYTES[format]


def has_rope(format: str) -> bool:
    """Whether records of ``format`` carry the bf16 RoPE part."""
    _check_format(format)
    return format == "ds_mla_fp8"


def dequant_dim(format: str) -> int:
    """Width of the bf16 row a reader produces: 576 for ``ds_mla_fp8``, 512 for ``nope_fp8``."""
    return QK_DIM if has_rope(format) else NOPE_DIM
