// selkv/formats.h — KV record formats (DESIGN §1): the runtime face of selkv/format_traits.h
// (which holds the one definition of every byte offset) and the paged-cache view.
//
//   ds_mla_fp8 (656 B/token, DeepSeek-V3.2):
//     [0,512)   512 x FP8 E4M3 NoPE, element i at byte i
//     [512,528) 4 x fp32 scales; scale k covers elements [128k, 128k+128)
//     [528,656) 64 x bf16 RoPE, unquantized
//   nope_fp8 (528 B/token, GLM NoPE): the 656-byte record without the RoPE part.
//   bf16 (2*D B/token): D = 576 (latent 512 + RoPE 64) or 512 (latent only).
//
// Paged cache: [num_blocks, page_size, record_bytes] uint8, each page contiguous; the block
// stride may be larger than page_size * record_bytes. Physical slot = block * page_size + offset.
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

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kPow2ScaleFloor = 1e-4f;  // lower clamp of amax/448 in pow2 mode

SELKV_HD constexpr int record_bytes(KvFormat f) {
  return dispatch_format(f, [](auto t) { return decltype(t)::kRecordBytes; });
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
  int64_t block_stride_bytes = 0;  // >= page_size * record_bytes, multiple of 16
  KvFormat format = KvFormat::kDsMlaFp8;

  SELKV_HD int64_t num_slots() const { return num_blocks * page_size; }
  // Byte offset of a physical slot (caller guarantees 0 <= slot < num_slots()).
  SELKV_HD int64_t slot_offset(int64_t slot) const {
    const int64_t block = slot / page_size;
    const int64_t in_page = slot - block * page_size;
    return block * block_stride_bytes + in_page * fmt::record_bytes(format);
  }
};

}  // namespace selkv
