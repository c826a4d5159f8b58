// selkv/formats.h — KV record formats (DESIGN §1): the runtime face of selkv/format_traits.h
// (which holds the one definition of every byte offset) and the paged-cache view.
//
//   ds_mla_fp8 (656 B/token, DeepSeek-V3.2):
//     [0,512)   512 x FP8 E4M3 NoPE, element i at byte i
//     [512,528) 4 x fp32 scales; scale k covers elements [128k, 128k+128)
//     [528,656) 64 x bf16 RoPE, unquantized
//   nope_fp8 (528 B/token, GLM NoPE): the 656-byte record without the RoPE part.
//   model1_fp8 (584 B/token, FlashMLA MODEL1): per page, page_size 576-byte records (448 E4M3
//     NoPE + 64 bf16 RoPE), then page_size x 8 bytes of UE8M0 scales (7 tiles of 64 + 1 pad),
//     the page padded to a multiple of 576 bytes (format_traits.h).
//   bf16 (2*D B/token): D = 576 (latent 512 + RoPE 64) or 512 (latent only; MODEL1: 448 + 64).
//
// Paged cache: uint8 pages of page_bytes(format, page_size) bytes (page_size * record_bytes for
// the in-record formats), each page contiguous; the block stride may be larger. Physical slot =
// block * page_size + offset.
#pragma once

#include <cstdint>

#include "selkv/format_traits.h"

namespace selkv {

// How the writer picks the per-tile scale s (readers accept either).
enum class ScaleMode : int32_t {
  kPow2 = 0,  // s = 2^ceil(log2(max(amax/448, 1e-4))): dequantization exact in bf16 arithmetic
  kAmax = 1,  // s = max(amax/448, FLT_MIN): what vLLM writes
};

namespace fmt {

// The ds_mla_fp8 layout under short names, for code that only handles that format (decode,
// prefill, tests); per-format code reads KvFormatTraits.
using DsMla = KvFormatTraits<KvFormat::kDsMlaFp8>;
inline constexpr int kNopeDim = DsMla::kNopeDim;    // latent (NoPE) elements per token
inline constexpr int kRopeDim = DsMla::kRopeDim;    // RoPE elements per token
inline constexpr int kQkDim = DsMla::kDequantDim;  // 576
inline constexpr int kVDim = 512;
inline constexpr int kTileElems = DsMla::kTileElems;  // elements sharing one fp32 scale
inline constexpr int kNumTiles = DsMla::kNumTiles;    // 4

inline constexpr int kNopeOffset = DsMla::kNopeOffset;    // 512 x e4m3
inline constexpr int kScaleOffset = DsMla::kScaleOffset;  // 512: 4 x fp32
inline constexpr int kRopeOffset = DsMla::kRopeOffset;    // 528: 64 x bf16
inline constexpr int kDsMlaRecordBytes = DsMla::kRecordBytes;                            // 656
inline constexpr int kNopeRecordBytes = KvFormatTraits<KvFormat::kNopeFp8>::kRecordBytes;  // 528
inline constexpr int kModel1RecordBytes = KvFormatTraits<KvFormat::kModel1Fp8>::kRecordBytes;  // 584

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kPow2ScaleFloor = 1e-4f;  // lower clamp of amax/448 in pow2 mode

// The formats selkv knows (the cache ops and C4 accept all of them; decode ds_mla_fp8 and
// model1_fp8; the composed prefill routes ds_mla_fp8 and nope_fp8).
SELKV_HD constexpr bool known_format(KvFormat f) {
  return f == KvFormat::kDsMlaFp8 || f == KvFormat::kNopeFp8 || f == KvFormat::kModel1Fp8;
}
SELKV_HD constexpr const char* format_name(KvFormat f) {
  return f == KvFormat::kDsMlaFp8 ? "ds_mla_fp8" : f == KvFormat::kNopeFp8 ? "nope_fp8"
                                  : f == KvFormat::kModel1Fp8 ? "model1_fp8" : "unknown";
}
// Bytes of one token's data, scales included: 656, 528, 584 (model1_fp8, not contiguous in the
// page: 576 record bytes + 8 scale bytes in the page tail).
SELKV_HD constexpr int record_bytes(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kRecordBytes; });
}
// Bytes a page of page_size tokens occupies: the least block stride.
SELKV_HD constexpr int64_t page_bytes(KvFormat f, int64_t page_size) {
  return dispatch_format(f, [&](auto t) { return decltype(t)::page_bytes(page_size); });
}
SELKV_HD constexpr bool has_rope(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kHasRope; });
}
// Latent (quantized) and RoPE elements per token of format f; rope_dim is 0 without RoPE.
SELKV_HD constexpr int nope_dim(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kNopeDim; });
}
SELKV_HD constexpr int rope_dim(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kRopeDim; });
}
// Width of the bf16 row a reader produces for a record of format f: 576 or 512.
SELKV_HD constexpr int dequant_dim(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kDequantDim; });
}

}  // namespace fmt

// A view of a paged FP8 KV cache on the device (or on the host, for the oracle).
struct PagedKvCache {
  const void* data = nullptr;      // uint8 [num_blocks, page_size, record_bytes], 16-byte aligned
  int64_t num_blocks = 0;
  int32_t page_size = 0;           // tokens per block, any value >= 1
  int64_t block_stride_bytes = 0;  // >= fmt::page_bytes(format, page_size), multiple of 16
  KvFormat format = KvFormat::kDsMlaFp8;

  SELKV_HD int64_t num_slots() const { return num_blocks * page_size; }
  // Byte offset of a physical slot's record (caller guarantees 0 <= slot < num_slots()): the
  // whole record for the in-record formats, the 576 NoPE + RoPE bytes for model1_fp8.
  SELKV_HD int64_t slot_offset(int64_t slot) const {
    const int64_t block = slot / page_size;
    const int64_t in_page = slot - block * page_size;
    return block * block_stride_bytes +
           dispatch_format(format, [&](auto t) { return decltype(t)::record_offset(in_page); });
  }
  // Byte offset of a physical slot's first scale (model1_fp8: in its page's scale tail).
  SELKV_HD int64_t scale_offset(int64_t slot) const {
    const int64_t block = slot / page_size;
    const int64_t in_page = slot - block * page_size;
    return block * block_stride_bytes +
           dispatch_format(format, [&](auto t) { return decltype(t)::scale_offset(in_page, page_size); });
  }
  // Byte offset of a block's page.
  SELKV_HD int64_t page_offset(int64_t block) const { return block * block_stride_bytes; }
};

}  // namespace selkv
