// Byte layout of the packed KV buffer (include/selkv/packed.h), on the host and the device: the
// pack / patch kernels, their oracle and the packed decode all address it through these.
//   records  [0, entries * 656): entry e = (b * S_q + s) * K + k at byte e * 656;
//   validity [entries * 656, + entries / 8): uint32 word e / 32, bit e % 32;
//   shape    [entries * 656 + entries / 8, + 16): uint32 {fingerprint(B, S_q, K), B, S_q, K}, written
//            by the pack; the decode and the patch compare all four against their own shape (the
//            sizes alone depend only on B * S_q * K), and a patch at another shape poisons them.
// entries = B * S_q * K < 2^31 (checked by packed_kv_workspace_size and the op checks).
#pragma once

#include <cstdint>

#include "selkv/format_traits.h"  // SELKV_HD

namespace selkv::packed {

inline constexpr int kRecordBytes = KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes;  // 656
inline constexpr int kTileEntries = 64;  // K is a multiple of this: a row is K / 64 tiles
inline constexpr int64_t kMaxEntries = int64_t(1) << 31;  // entries must stay below (int32)

// Byte offset of entry e's record.
SELKV_HD constexpr int64_t packed_record_offset(int64_t entry) { return entry * kRecordBytes; }
// Byte offset of the validity words of a buffer of rows * topk entries (16-byte aligned: topk is
// a multiple of 64).
SELKV_HD constexpr int64_t packed_validity_offset(int64_t rows, int64_t topk) {
  return rows * topk * kRecordBytes;
}
// Byte offset of the shape words (right after the validity words: 8-byte aligned, K / 8 being a
// multiple of 8).
SELKV_HD constexpr int64_t packed_shape_offset(int64_t rows, int64_t topk) {
  return packed_validity_offset(rows, topk) + rows * topk / 8;
}
inline constexpr int kShapeBytes = 16;
// Bytes of the whole buffer (records, validity words, shape words); shape assumed valid.
SELKV_HD constexpr int64_t packed_bytes(int64_t rows, int64_t topk) {
  return packed_shape_offset(rows, topk) + kShapeBytes;
}
// The first shape word: (B, S_q, K) mixed into 32 bits (FNV-1a over the three values), so that a
// buffer packed for another shape of the same size (or not packed at all) fails the check.
SELKV_HD constexpr uint32_t packed_shape_fingerprint(int32_t batch, int32_t seq_q, int32_t topk) {
  uint32_t h = 0x811c9dc5u ^ 0x5e1c6b00u;  // FNV offset basis, salted for this layout
  h = (h ^ uint32_t(batch)) * 0x01000193u;
  h = (h ^ uint32_t(seq_q)) * 0x01000193u;
  h = (h ^ uint32_t(topk)) * 0x01000193u;
  return h;
}

// The shape words of (B, S_q, K) as the two little-endian 8-byte halves the kernels load (the
// words are 8-byte aligned): {fingerprint, B} and {S_q, K}.
struct PackedShape {
  uint64_t lo, hi;
};
SELKV_HD constexpr PackedShape packed_shape(int32_t batch, int32_t seq_q, int32_t topk) {
  return {uint64_t(packed_shape_fingerprint(batch, seq_q, topk)) | uint64_t(uint32_t(batch)) << 32,
          uint64_t(uint32_t(seq_q)) | uint64_t(uint32_t(topk)) << 32};
}
SELKV_HD constexpr bool packed_shape_matches(uint64_t lo, uint64_t hi, int32_t batch, int32_t seq_q, int32_t topk) {
  const PackedShape s = packed_shape(batch, seq_q, topk);
  return lo == s.lo && hi == s.hi;
}
// What a patch at another shape writes into the K word (uint32 word kShapeTopkWord of the four):
// no call's K (a positive multiple of 64) matches it, so every later decode of the buffer gives
// NaN rows until it is packed again.
inline constexpr int kShapeTopkWord = 3;
inline constexpr uint32_t kPoisonedTopk = 0xFFFFFFFFu;

static_assert(kTileEntries * kRecordBytes % 128 == 0, "a 64-record tile is 128-byte aligned");

}  // namespace selkv::packed
