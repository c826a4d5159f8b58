#include "cache/cache_checks.h"

#include <cstdint>
#include <limits>

#include "common/check.h"
#include "cache/overlap_checks.h"

namespace selkv::cache {
namespace {

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
bool valid_format(KvFormat f) { return fmt::known_format(f); }
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Shared by C1 and C3: the paged-cache view. The kernels address records with 16-byte vector
// accesses, so the base and the block stride must be 16-byte aligned (record sizes 656 and 528,
// model1_fp8's record stride 576 are multiples of 16, so every record then is; model1_fp8's
// 8-byte scale groups are 8-byte aligned).
Status check_cache_view(const char* kOp, const void* cache, int64_t num_blocks, int32_t page_size,
                        int64_t block_stride_bytes, KvFormat format) {
  SELKV_CHECK_ARG(valid_format(format), "format", "unknown KvFormat ", int(format));
  SELKV_CHECK_ARG(num_blocks >= 0, "num_blocks", "must be >= 0, got ", num_blocks);
  SELKV_CHECK_ARG(page_size >= 1, "page_size", "must be >= 1, got ", page_size);
  const int64_t page_bytes = fmt::page_bytes(format, page_size);
  SELKV_CHECK_ARG(block_stride_bytes >= page_bytes, "block_stride_bytes", "must be >= the page bytes of ",
                  page_size, " ", fmt::format_name(format), " tokens = ", page_bytes, ", got ",
                  block_stride_bytes);
  SELKV_CHECK_ARG(block_stride_bytes % 16 == 0, "block_stride_bytes",
                  "must be a multiple of 16, got ", block_stride_bytes);
  SELKV_CHECK_ARG(num_blocks <= std::numeric_limits<int64_t>::max() / block_stride_bytes,
                  "num_blocks", "num_blocks * block_stride_bytes overflows int64");
  SELKV_CHECK_ARG(num_blocks <= std::numeric_limits<int64_t>::max() / page_size, "num_blocks",
                  "num_blocks * page_size overflows int64");
  if (num_blocks > 0) {
    SELKV_CHECK_ARG(cache != nullptr, "cache", "must not be null");
    SELKV_CHECK_ARG(aligned(cache, 16), "cache", "must be 16-byte aligned");
  }
  return Status::Ok();
}

}  // namespace

// ---- C1 ----------------------------------------------------------------------------------------
Status check_write_kv_cache(const WriteKvCacheParams& p, Work* work) {
  constexpr const char* kOp = "selkv::write_kv_cache";
  *work = Work::kNone;
  SELKV_CHECK_ARG(p.scale_mode == ScaleMode::kPow2 || p.scale_mode == ScaleMode::kAmax,
                  "scale_mode", "unknown ScaleMode ", int(p.scale_mode));
  SELKV_CHECK_ARG(p.format != KvFormat::kModel1Fp8 || p.scale_mode == ScaleMode::kPow2, "scale_mode",
                  "model1_fp8 stores UE8M0 (power-of-two) scales: scale_mode must be pow2");
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_RETURN_IF_ERROR(
      check_cache_view(kOp, p.cache, p.num_blocks, p.page_size, p.block_stride_bytes, p.format));
  if (!fmt::has_rope(p.format)) {
    SELKV_CHECK_ARG(p.rope == nullptr, "rope", "must be null for nope_fp8 (records have no RoPE)");
  }
  if (p.num_tokens == 0) return Status::Ok();
  // One 8-token CTA per 8 tokens: grid.x <= 2^31 - 1.
  SELKV_CHECK_ARG(p.num_tokens <= kInt32Max, "num_tokens", "must be <= 2^31 - 1, got ",
                  p.num_tokens);
  SELKV_CHECK_ARG(p.latent != nullptr, "latent", "must not be null");
  SELKV_CHECK_ARG(aligned(p.latent, 16), "latent", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.latent_row_stride >= fmt::nope_dim(p.format), "latent_row_stride", "must be >= ",
                  fmt::nope_dim(p.format), ", got ", p.latent_row_stride);
  SELKV_CHECK_ARG(p.latent_row_stride % 8 == 0, "latent_row_stride",
                  "must be a multiple of 8 elements (16-byte aligned rows), got ",
                  p.latent_row_stride);
  if (fmt::has_rope(p.format)) {
    SELKV_CHECK_ARG(p.rope != nullptr, "rope", "required for ", fmt::format_name(p.format));
    SELKV_CHECK_ARG(aligned(p.rope, 16), "rope", "must be 16-byte aligned");
    SELKV_CHECK_ARG(p.rope_row_stride >= fmt::rope_dim(p.format), "rope_row_stride", "must be >= ",
                    fmt::rope_dim(p.format), ", got ", p.rope_row_stride);
    SELKV_CHECK_ARG(p.rope_row_stride % 8 == 0, "rope_row_stride",
                    "must be a multiple of 8 elements (16-byte aligned rows), got ",
                    p.rope_row_stride);
  }
  SELKV_CHECK_ARG(p.slot_mapping != nullptr, "slot_mapping", "must not be null");
  SELKV_CHECK_ARG(aligned(p.slot_mapping, 8), "slot_mapping", "must be 8-byte aligned");
  if (p.num_blocks == 0) return Status::Ok();  // no blocks: every slot is out of range
  SELKV_RETURN_IF_ERROR(check_write_overlaps(kOp, p));
  *work = Work::kLaunch;
  return Status::Ok();
}

// ---- C2 ----------------------------------------------------------------------------------------
Status check_convert_indices(const ConvertIndicesParams& p, Work* work) {
  constexpr const char* kOp = "selkv::convert_req_indices_to_slots";
  *work = Work::kNone;
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.num_tokens <= kInt32Max, "num_tokens", "must be <= 2^31 - 1 (one CTA per row), got ",
                  p.num_tokens);
  SELKV_CHECK_ARG(p.topk >= 0 && p.topk <= kMaxConvertTopk, "topk", "must be in [0, ", kMaxConvertTopk,
                  "], got ", p.topk);
  SELKV_CHECK_ARG(p.num_reqs >= 0, "num_reqs", "must be >= 0, got ", p.num_reqs);
  SELKV_CHECK_ARG(p.max_blocks_per_req >= 0, "max_blocks_per_req", "must be >= 0, got ",
                  p.max_blocks_per_req);
  SELKV_CHECK_ARG(p.page_size >= 1, "page_size", "must be >= 1, got ", p.page_size);
  SELKV_CHECK_ARG(p.num_blocks >= 0, "num_blocks", "must be >= 0, got ", p.num_blocks);
  SELKV_CHECK_ARG(p.num_blocks <= (int64_t(1) << 31) / p.page_size, "num_blocks",
                  "num_blocks * page_size must fit int32 slots, got ", p.num_blocks, " * ",
                  p.page_size);
  if (p.valid_counts != nullptr) {
    SELKV_CHECK_ARG(aligned(p.valid_counts, 4), "valid_counts", "must be 4-byte aligned");
  }
  if (p.num_tokens == 0) return Status::Ok();
  if (p.topk == 0) return Status::Ok();  // launcher zero-fills valid_counts
  SELKV_CHECK_ARG(p.req_local_indices != nullptr, "req_local_indices", "must not be null");
  SELKV_CHECK_ARG(aligned(p.req_local_indices, 4), "req_local_indices", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.indices_row_stride >= p.topk, "indices_row_stride", "must be >= topk (",
                  p.topk, "), got ", p.indices_row_stride);
  SELKV_CHECK_ARG(p.req_id_per_token != nullptr, "req_id_per_token", "must not be null");
  SELKV_CHECK_ARG(aligned(p.req_id_per_token, 4), "req_id_per_token", "must be 4-byte aligned");
  if (p.token_seq_lens != nullptr) {
    SELKV_CHECK_ARG(aligned(p.token_seq_lens, 4), "token_seq_lens", "must be 4-byte aligned");
  }
  SELKV_CHECK_ARG(p.out_slots != nullptr, "out_slots", "must not be null");
  SELKV_CHECK_ARG(aligned(p.out_slots, 4), "out_slots", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.out_row_stride >= p.topk, "out_row_stride", "must be >= topk (", p.topk,
                  "), got ", p.out_row_stride);
  const bool reads_table = p.num_reqs > 0 && p.max_blocks_per_req > 0;
  if (reads_table) {
    SELKV_CHECK_ARG(p.block_table != nullptr, "block_table", "must not be null");
    SELKV_CHECK_ARG(aligned(p.block_table, 4), "block_table", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.block_table_row_stride >= p.max_blocks_per_req, "block_table_row_stride",
                    "must be >= max_blocks_per_req (", p.max_blocks_per_req, "), got ",
                    p.block_table_row_stride);
  }
  SELKV_RETURN_IF_ERROR(check_convert_overlaps(kOp, p));
  *work = Work::kLaunch;
  return Status::Ok();
}

// ---- C3 ----------------------------------------------------------------------------------------
Status check_gather_kv(const GatherKvParams& p, Work* work) {
  constexpr const char* kOp = "selkv::gather_kv_bf16";
  *work = Work::kNone;
  SELKV_RETURN_IF_ERROR(
      check_cache_view(kOp, p.cache, p.num_blocks, p.page_size, p.block_stride_bytes, p.format));
  SELKV_CHECK_ARG(p.num_reqs >= 0, "num_reqs", "must be >= 0, got ", p.num_reqs);
  SELKV_CHECK_ARG(p.num_reqs <= kMaxGatherReqs, "num_reqs", "must be <= ", kMaxGatherReqs,
                  " per call (split larger batches), got ", p.num_reqs);
  SELKV_CHECK_ARG(p.max_blocks_per_req >= 0, "max_blocks_per_req", "must be >= 0, got ",
                  p.max_blocks_per_req);
  SELKV_CHECK_ARG(p.out_rows >= 0, "out_rows", "must be >= 0, got ", p.out_rows);
  if (p.num_reqs == 0 || p.out_rows == 0) return Status::Ok();  // nothing can be written
  SELKV_CHECK_ARG(p.seq_starts != nullptr, "seq_starts", "must not be null");
  SELKV_CHECK_ARG(aligned(p.seq_starts, 4), "seq_starts", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.seq_lens != nullptr, "seq_lens", "must not be null");
  SELKV_CHECK_ARG(aligned(p.seq_lens, 4), "seq_lens", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.ws_starts != nullptr, "ws_starts", "must not be null");
  SELKV_CHECK_ARG(aligned(p.ws_starts, 4), "ws_starts", "must be 4-byte aligned");
  const int dim = fmt::dequant_dim(p.format);
  SELKV_CHECK_ARG(p.out != nullptr, "out", "must not be null");
  SELKV_CHECK_ARG(aligned(p.out, 16), "out", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.out_row_stride >= dim, "out_row_stride", "must be >= ", dim, ", got ",
                  p.out_row_stride);
  SELKV_CHECK_ARG(p.out_row_stride % 8 == 0, "out_row_stride",
                  "must be a multiple of 8 elements (16-byte aligned rows), got ",
                  p.out_row_stride);
  SELKV_CHECK_ARG(p.out_rows <= std::numeric_limits<int64_t>::max() / 2 / p.out_row_stride,
                  "out_rows", "out_rows * out_row_stride overflows");
  if (p.max_blocks_per_req > 0) {
    SELKV_CHECK_ARG(p.block_table != nullptr, "block_table", "must not be null");
    SELKV_CHECK_ARG(aligned(p.block_table, 4), "block_table", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.block_table_row_stride >= p.max_blocks_per_req, "block_table_row_stride",
                    "must be >= max_blocks_per_req (", p.max_blocks_per_req, "), got ",
                    p.block_table_row_stride);
  }
  SELKV_RETURN_IF_ERROR(check_gather_overlaps(kOp, p));
  *work = Work::kLaunch;
  return Status::Ok();
}

}  // namespace selkv::cache

// ---- the public validation-only calls (include/selkv/cache_ops.h) ---------------------------------
namespace selkv {

Status check_write_kv_cache(const WriteKvCacheParams& p) {
  cache::Work work;
  return cache::check_write_kv_cache(p, &work);
}
Status check_convert_req_indices_to_slots(const ConvertIndicesParams& p) {
  cache::Work work;
  return cache::check_convert_indices(p, &work);
}
Status check_gather_kv_bf16(const GatherKvParams& p) {
  cache::Work work;
  return cache::check_gather_kv(p, &work);
}

}  // namespace selkv
