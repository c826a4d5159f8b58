"""KV record formats (byte-exact, little endian); mirrors ``include/selkv/format_traits.h``.

``ds_mla_fp8`` (656 bytes/token, DeepSeek-V3.2)::

    [0, 512)    512 x FP8 E4M3 NoPE, element i at byte i
    [512, 528)  4 x fp32 scales; scale k covers elements [128k, 128k + 128)
    [528, 656)  64 x bf16 RoPE, unquantized

``nope_fp8`` (528 bytes/token, GLM NoPE): the 656-byte record without the RoPE part.

``model1_fp8`` (584 bytes/token, FlashMLA's MODEL1 layout): per page of ``page_size`` tokens::

    [0, page_size * 576)                 token t at t * 576: 448 x FP8 E4M3 NoPE, then 64 x bf16 RoPE
    [page_size * 576, page_size * 584)   token t at page_size * 576 + 8 t: 7 x UE8M0 scales
                                         (tile k covers NoPE elements [64k, 64k + 64)), 1 pad byte
    padding to page_bytes = round_up(page_size * 584, 576)

A UE8M0 byte ``b`` (``torch.float8_e8m0fnu``) is the scale ``2**(b - 127)``. The writer takes
``scale_mode="pow2"`` only.

A paged cache is a ``torch.uint8`` tensor ``[num_blocks, page_size, record_bytes]`` whose pages
are dense (``cache.stride(1) == record_bytes``); the block stride (``cache.stride(0)``) may be
larger than a page and must be at least ``page_bytes(format, page_size)``. For ``model1_fp8`` the
tensor's rows are a view of the page bytes (FlashMLA's convention), not one token each:
:func:`selkv.empty_kv_cache` allocates padded pages. Physical slot = ``block * page_size + offset``.

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

# model1_fp8 (FlashMLA MODEL1)
MODEL1_NOPE_DIM = 448
MODEL1_TILE_ELEMS = 64
MODEL1_NUM_TILES = MODEL1_NOPE_DIM // MODEL1_TILE_ELEMS  # 7
MODEL1_RECORD_STRIDE = MODEL1_NOPE_DIM + 2 * ROPE_DIM  # 576: NoPE + RoPE bytes of a token
MODEL1_SCALE_STRIDE = MODEL1_NUM_TILES + 1  # 8: 7 UE8M0 scales + 1 pad byte
MODEL1_FP8_RECORD_BYTES = MODEL1_RECORD_STRIDE + MODEL1_SCALE_STRIDE  # 584
MODEL1_PAGE_ALIGN = 576

E4M3_MAX = 448.0

FORMATS = ("ds_mla_fp8", "nope_fp8", "model1_fp8")
SCALE_MODES = ("pow2", "amax")

_RECORD_BYTES = {
    "ds_mla_fp8": DS_MLA_FP8_RECORD_BYTES,
    "nope_fp8": NOPE_FP8_RECORD_BYTES,
    "model1_fp8": MODEL1_FP8_RECORD_BYTES,
}


def _check_format(format: str) -> None:
    if format not in _RECORD_BYTES:
        raise ValueError(f"selkv: format: expected one of {FORMATS}, got {format!r}")


def record_bytes(format: str) -> int:
    """Bytes per token, scales included: 656 for ``ds_mla_fp8``, 528 for ``nope_fp8``, 584 for
    ``model1_fp8`` (whose 8 scale bytes live in the page tail); the last dim of a cache tensor."""
    _check_format(format)
    return _RECORD_BYTES[format]


def page_bytes(format: str, page_size: int) -> int:
    """Bytes a page of ``page_size`` tokens occupies (the least block stride):
    ``page_size * record_bytes`` for ``ds_mla_fp8`` / ``nope_fp8``, ``page_size * 584`` rounded up
    to a multiple of 576 for ``model1_fp8``."""
    _check_format(format)
    n = page_size * _RECORD_BYTES[format]
    if format == "model1_fp8":
        n = (n + MODEL1_PAGE_ALIGN - 1) // MODEL1_PAGE_ALIGN * MODEL1_PAGE_ALIGN
    return n


def has_rope(format: str) -> bool:
    """Whether records of ``format`` carry the bf16 RoPE part."""
    _check_format(format)
    return format != "nope_fp8"


def nope_dim(format: str) -> int:
    """Quantized (NoPE) elements per token: 512, or 448 for ``model1_fp8``."""
    _check_format(format)
    return MODEL1_NOPE_DIM if format == "model1_fp8" else NOPE_DIM


def dequant_dim(format: str) -> int:
    """Width of the bf16 row a reader produces: 576 for ``ds_mla_fp8``, 512 for ``nope_fp8`` and
    ``model1_fp8`` (448 NoPE + 64 RoPE)."""
    return nope_dim(format) + (ROPE_DIM if has_rope(format) else 0)
