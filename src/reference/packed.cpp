// Oracle of the C6 pack / patch ops (include/selkv/packed.h): plain loops over host pointers on
// the GPU ops' Params, behind the GPU ops' own checks (packed/packed_checks.h); nothing is
// written when they fail.
#include <cstdint>
#include <cstring>

#include "common/check.h"
#include "packed/packed_checks.h"
#include "packed/packed_layout.h"
#include "reference/oracle.h"

namespace selkv::ref {

Status pack_selected_kv(const PackSelectedKvParams& p) {
  packed::Work work;
  SELKV_RETURN_IF_ERROR(packed::check_pack(p, &work));
  if (work == packed::Work::kNone) return Status::Ok();
  const int64_t S = p.seq_q, K = p.topk, rows = int64_t(p.batch) * S;
  const int64_t P = p.cache.num_slots();
  const auto* cache = static_cast<const uint8_t*>(p.cache.data);
  auto* out = static_cast<uint8_t*>(p.packed_kv);
  auto* words = reinterpret_cast<uint32_t*>(out + packed::packed_validity_offset(rows, K));
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / S, s = row % S;
    int64_t limit = K;
    if (p.topk_length != nullptr) {
      const int64_t len = p.topk_length[b];
      limit = len < 0 ? 0 : (len < K ? len : K);
    }
    const int32_t* idx = p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      uint32_t word = 0;
      for (int64_t k = k0; k < k0 + 32; ++k) {
        const int64_t e = row * K + k;
        uint8_t* dst = out + packed::packed_record_offset(e);
        const int64_t slot = k < limit ? int64_t(idx[k]) : -1;  // no index read past the length
        if (slot >= 0 && slot < P) {
          std::memcpy(dst, cache + p.cache.slot_offset(slot), packed::kRecordBytes);
          word |= uint32_t(1) << (k - k0);
        } else {
          std::memset(dst, 0, packed::kRecordBytes);
        }
      }
      words[(row * K + k0) / 32] = word;
    }
  }
  const packed::PackedShape shape = packed::packed_shape(p.batch, p.seq_q, p.topk);
  std::memcpy(out + packed::packed_shape_offset(rows, K), &shape, sizeof shape);
  return Status::Ok();
}

Status patch_packed_kv(const PatchPackedKvParams& p) {
  packed::Work work;
  SELKV_RETURN_IF_ERROR(packed::check_patch(p, &work));
  if (work == packed::Work::kNone) return Status::Ok();
  const int64_t rows = int64_t(p.batch) * p.seq_q, entries = rows * p.topk;
  auto* out = static_cast<uint8_t*>(p.packed_kv);
  auto* words = reinterpret_cast<uint32_t*>(out + packed::packed_validity_offset(rows, p.topk));
  uint8_t* shape_words = out + packed::packed_shape_offset(rows, p.topk);
  packed::PackedShape have;
  std::memcpy(&have, shape_words, sizeof have);
  if (!packed::packed_shape_matches(have.lo, have.hi, p.batch, p.seq_q, p.topk)) {  // another shape
    std::memcpy(shape_words + 4 * packed::kShapeTopkWord, &packed::kPoisonedTopk, 4);  // poisoned, nothing written
    return Status::Ok();
  }
  for (int64_t i = 0; i < p.num_records; ++i) {
    const int64_t e = p.positions[i];
    if (e < 0 || e >= entries) continue;  // padding: never written
    std::memcpy(out + packed::packed_record_offset(e), p.records + i * p.record_stride_bytes, packed::kRecordBytes);
    words[e / 32] |= uint32_t(1) << (e % 32);
  }
  return Status::Ok();
}

}  // namespace selkv::ref
