// Byte layout of the packed KV buffer (include/selkv/packed.h), on the host and the device: the
// pack / patch kernels, their oracle and the packed decode all address it through these.
//   records  [0, entries * 656): entry e = (b * S_q + s) * K + k at byte e * 656;
//   validity [entries * 656, + entries / 8): uint32 word e / 32, bit e % 32.
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
// Bytes of the whole buffer (records, then validity words); shape assumed valid.
SELKV_HD constexpr int64_t packed_bytes(int64_t rows, int64_t topk) {
  return packed_validity_offset(rows, topk) + rows * topk / 8;
}

static_assert(kTileEntries * kRecordBytes % 128 == 0, "a 64-record tile is 128-byte aligned");

}  // namespace selkv::packed
