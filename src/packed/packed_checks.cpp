// C6 pack / patch argument rules and the buffer size (include/selkv/packed.h). Built into the
// pure-C++ library selkv_reference, so the GPU launchers and the oracle share one definition.
#include "packed/packed_checks.h"

#include <cstdint>
#include <limits>

#include "cache/overlap_checks.h"  // cache_extent
#include "common/check.h"
#include "common/overlap.h"
#include "packed/packed_layout.h"

namespace selkv {
namespace {

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// B * S_q * K entries when the shape is valid, else -1 (no overflow for any int64 inputs).
int64_t entries_of(int64_t batch, int64_t seq_q, int64_t topk) {
  if (batch < 0 || seq_q < 0 || topk <= 0 || topk % packed::kTileEntries != 0 || topk > (int64_t(1) << 30))
    return -1;
  if (batch >= packed::kMaxEntries || seq_q >= packed::kMaxEntries) return -1;  // then no overflow below
  const __int128 n = __int128(batch) * seq_q * topk;
  return n < packed::kMaxEntries ? int64_t(n) : -1;
}

// The shape rules both ops share: B, S_q >= 0, K a positive multiple of 64 up to 2^30,
// B * S_q * K < 2^31 entries (int32 entry indices and validity words).
Status check_shape(const char* kOp, int32_t batch, int32_t seq_q, int32_t topk) {
  SELKV_CHECK_ARG(batch >= 0, "batch", "must be >= 0, got ", batch);
  SELKV_CHECK_ARG(seq_q >= 0, "seq_q", "must be >= 0, got ", seq_q);
  SELKV_CHECK_ARG(topk >= packed::kTileEntries && topk % packed::kTileEntries == 0, "topk",
                  "must be a positive multiple of 64, got ", topk);
  SELKV_CHECK_ARG(topk <= (int32_t(1) << 30), "topk", "must be <= 2^30, got ", topk);
  SELKV_CHECK_ARG(entries_of(batch, seq_q, topk) >= 0, "batch",
                  "batch * seq_q * topk must be < 2^31 entries, got ", batch, " * ", seq_q, " * ", topk);
  return Status::Ok();
}

// The packed buffer: large enough (kWorkspaceTooSmall names both sizes), non-null, 16-byte aligned.
Status check_buffer(const char* kOp, const void* packed_kv, size_t packed_kv_bytes, int32_t batch,
                    int32_t seq_q, int32_t topk) {
  const size_t need = packed_kv_workspace_size(batch, seq_q, topk);
  if (packed_kv_bytes < need)
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": packed_kv_bytes: needs ", need, " bytes (packed_kv_workspace_size(",
                                 batch, ", ", seq_q, ", ", topk, ")), got ", packed_kv_bytes));
  SELKV_CHECK_ARG(packed_kv != nullptr, "packed_kv", "must not be null");
  SELKV_CHECK_ARG(aligned(packed_kv, 16), "packed_kv", "must be 16-byte aligned");
  return Status::Ok();
}

}  // namespace

size_t packed_kv_workspace_size(int64_t batch, int64_t seq_q, int64_t topk) {
  const int64_t n = entries_of(batch, seq_q, topk);
  return n <= 0 ? 0 : size_t(packed::packed_bytes(1, n));
}

namespace packed {

Status check_pack(const PackSelectedKvParams& p, Work* work) {
  constexpr const char* kOp = "selkv::pack_selected_kv";
  *work = Work::kNone;
  SELKV_RETURN_IF_ERROR(check_shape(kOp, p.batch, p.seq_q, p.topk));
  const PagedKvCache& c = p.cache;
  SELKV_CHECK_ARG(c.format == KvFormat::kDsMlaFp8, "cache.format",
                  "must be ds_mla_fp8 (656-byte records), got KvFormat ", int(c.format));
  SELKV_CHECK_ARG(c.num_blocks >= 0, "cache.num_blocks", "must be >= 0, got ", c.num_blocks);
  SELKV_CHECK_ARG(c.page_size >= 1, "cache.page_size", "must be >= 1, got ", c.page_size);
  const int64_t page_bytes = int64_t(c.page_size) * kRecordBytes;
  SELKV_CHECK_ARG(c.block_stride_bytes >= page_bytes, "cache.block_stride_bytes",
                  "must be >= page_size * 656 = ", page_bytes, ", got ", c.block_stride_bytes);
  SELKV_CHECK_ARG(c.block_stride_bytes % 16 == 0, "cache.block_stride_bytes",
                  "must be a multiple of 16, got ", c.block_stride_bytes);
  SELKV_CHECK_ARG(c.num_blocks <= std::numeric_limits<int64_t>::max() / c.block_stride_bytes,
                  "cache.num_blocks", "num_blocks * block_stride_bytes overflows int64");
  if (int64_t(p.batch) * p.seq_q == 0) return Status::Ok();  // no rows: nothing is read or written
  SELKV_RETURN_IF_ERROR(check_buffer(kOp, p.packed_kv, p.packed_kv_bytes, p.batch, p.seq_q, p.topk));
  if (c.num_blocks > 0) {
    SELKV_CHECK_ARG(c.data != nullptr, "cache.data", "must not be null");
    SELKV_CHECK_ARG(aligned(c.data, 16), "cache.data", "must be 16-byte aligned");
  }
  SELKV_CHECK_ARG(p.indices != nullptr, "indices", "must not be null");
  SELKV_CHECK_ARG(aligned(p.indices, 4), "indices", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.indices_batch_stride >= 0 && p.indices_seq_stride >= 0, "indices",
                  "strides must be >= 0 (last dim contiguous), got (", p.indices_batch_stride, ", ",
                  p.indices_seq_stride, ")");
  SELKV_CHECK_ARG(aligned(p.topk_length, 4), "topk_length", "must be 4-byte aligned");
  using detail::Dim;
  const detail::Extent out = detail::byte_range(p.packed_kv, int64_t(packed_kv_workspace_size(p.batch, p.seq_q, p.topk)));
  SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
      kOp, "packed_kv", out,
      {{"cache", cache::cache_extent(c.data, c.num_blocks, c.page_size, c.block_stride_bytes, c.format)},
       {"indices", detail::extent_of(p.indices, 4, {Dim{p.batch, p.indices_batch_stride},
                                                    Dim{p.seq_q, p.indices_seq_stride}, Dim{p.topk, 1}})},
       {"topk_length", detail::extent_of(p.topk_length, 4, {Dim{p.batch, 1}})}}));
  *work = Work::kLaunch;
  return Status::Ok();
}

Status check_patch(const PatchPackedKvParams& p, Work* work) {
  constexpr const char* kOp = "selkv::patch_packed_kv";
  *work = Work::kNone;
  SELKV_RETURN_IF_ERROR(check_shape(kOp, p.batch, p.seq_q, p.topk));
  SELKV_CHECK_ARG(p.num_records >= 0, "num_records", "must be >= 0, got ", p.num_records);
  // No rows (every position is out of range) or no records: nothing is read or written.
  if (int64_t(p.batch) * p.seq_q == 0 || p.num_records == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(check_buffer(kOp, p.packed_kv, p.packed_kv_bytes, p.batch, p.seq_q, p.topk));
  SELKV_CHECK_ARG(p.positions != nullptr, "positions", "must not be null");
  SELKV_CHECK_ARG(aligned(p.positions, 8), "positions", "must be 8-byte aligned");
  SELKV_CHECK_ARG(p.records != nullptr, "records", "must not be null");
  SELKV_CHECK_ARG(aligned(p.records, 16), "records", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.record_stride_bytes >= kRecordBytes, "record_stride_bytes", "must be >= 656, got ",
                  p.record_stride_bytes);
  SELKV_CHECK_ARG(p.record_stride_bytes % 16 == 0, "record_stride_bytes", "must be a multiple of 16, got ",
                  p.record_stride_bytes);
  SELKV_CHECK_ARG(p.num_records <= std::numeric_limits<int64_t>::max() / p.record_stride_bytes, "num_records",
                  "num_records * record_stride_bytes overflows int64");
  using detail::Dim;
  const detail::Extent out = detail::byte_range(p.packed_kv, int64_t(packed_kv_workspace_size(p.batch, p.seq_q, p.topk)));
  SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
      kOp, "packed_kv", out,
      {{"records", detail::extent_of(p.records, 1, {Dim{p.num_records, p.record_stride_bytes}, Dim{kRecordBytes, 1}})},
       {"positions", detail::extent_of(p.positions, 8, {Dim{p.num_records, 1}})}}));
  *work = Work::kLaunch;
  return Status::Ok();
}

}  // namespace packed

Status check_pack_selected_kv(const PackSelectedKvParams& p) {
  packed::Work work;
  return packed::check_pack(p, &work);
}

Status check_patch_packed_kv(const PatchPackedKvParams& p) {
  packed::Work work;
  return packed::check_patch(p, &work);
}

}  // namespace selkv
