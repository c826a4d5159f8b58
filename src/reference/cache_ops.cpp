// Oracle for the memory-bound cache ops C1-C3 (include/selkv/cache_ops.h): plain loops over
// host pointers with the exact skip / -1 / zero-row semantics the GPU ops promise.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cache/overlap_checks.h"
#include "common/check.h"
#include "reference/oracle.h"

namespace selkv::ref {
namespace {

bool valid_format(KvFormat f) { return fmt::known_format(f); }

}  // namespace

// ---- C1 ----------------------------------------------------------------------------------------
Status write_kv_cache(const WriteKvCacheParams& p) {
  constexpr const char* kOp = "selkv::ref::write_kv_cache";
  SELKV_CHECK_ARG(valid_format(p.format), "format", "unknown KvFormat ", int(p.format));
  SELKV_CHECK_ARG(p.scale_mode == ScaleMode::kPow2 || p.scale_mode == ScaleMode::kAmax,
                  "scale_mode", "unknown ScaleMode ", int(p.scale_mode));
  SELKV_CHECK_ARG(p.format != KvFormat::kModel1Fp8 || p.scale_mode == ScaleMode::kPow2, "scale_mode",
                  "model1_fp8 stores UE8M0 (power-of-two) scales: scale_mode must be pow2");
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.num_blocks >= 0, "num_blocks", "must be >= 0, got ", p.num_blocks);
  SELKV_CHECK_ARG(p.page_size >= 1, "page_size", "must be >= 1, got ", p.page_size);
  const int64_t pb = fmt::page_bytes(p.format, p.page_size);
  SELKV_CHECK_ARG(p.block_stride_bytes >= pb, "block_stride_bytes", "must be >= the page bytes of ",
                  p.page_size, " ", fmt::format_name(p.format), " tokens = ", pb, ", got ",
                  p.block_stride_bytes);
  if (p.num_tokens == 0) return Status::Ok();
  SELKV_CHECK_ARG(p.latent != nullptr, "latent", "must not be null");
  SELKV_CHECK_ARG(p.latent_row_stride >= fmt::nope_dim(p.format), "latent_row_stride", "must be >= ",
                  fmt::nope_dim(p.format), ", got ", p.latent_row_stride);
  if (fmt::has_rope(p.format)) {
    SELKV_CHECK_ARG(p.rope != nullptr, "rope", "required for ", fmt::format_name(p.format));
    SELKV_CHECK_ARG(p.rope_row_stride >= fmt::rope_dim(p.format), "rope_row_stride", "must be >= ",
                    fmt::rope_dim(p.format), ", got ", p.rope_row_stride);
  } else {
    SELKV_CHECK_ARG(p.rope == nullptr, "rope", "must be null for nope_fp8 (no RoPE in the record)");
  }
  SELKV_CHECK_ARG(p.slot_mapping != nullptr, "slot_mapping", "must not be null");
  SELKV_CHECK_ARG(p.cache != nullptr || p.num_blocks == 0, "cache", "must not be null");
  if (p.num_blocks > 0) SELKV_RETURN_IF_ERROR(cache::check_write_overlaps(kOp, p));  // the GPU op's rule

  const PagedKvCache view{p.cache, p.num_blocks, p.page_size, p.block_stride_bytes, p.format};
  const int64_t num_slots = view.num_slots();
  const auto* latent = static_cast<const uint16_t*>(p.latent);
  const auto* rope = static_cast<const uint16_t*>(p.rope);
  auto* cache = static_cast<uint8_t*>(p.cache);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || slot >= num_slots) continue;  // padding or out of range: never written
    encode_slot(latent + t * p.latent_row_stride, fmt::has_rope(p.format) ? rope + t * p.rope_row_stride : nullptr,
                p.scale_mode, view, cache, slot);
  }
  return Status::Ok();
}

// ---- C2 ----------------------------------------------------------------------------------------
Status convert_req_indices_to_slots(const ConvertIndicesParams& p) {
  constexpr const char* kOp = "selkv::ref::convert_req_indices_to_slots";
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.topk >= 0, "topk", "must be >= 0, got ", p.topk);
  SELKV_CHECK_ARG(p.num_reqs >= 0, "num_reqs", "must be >= 0, got ", p.num_reqs);
  SELKV_CHECK_ARG(p.max_blocks_per_req >= 0, "max_blocks_per_req", "must be >= 0, got ",
                  p.max_blocks_per_req);
  SELKV_CHECK_ARG(p.page_size >= 1, "page_size", "must be >= 1, got ", p.page_size);
  SELKV_CHECK_ARG(p.num_blocks >= 0, "num_blocks", "must be >= 0, got ", p.num_blocks);
  // Slots are int32: every valid slot must be representable.
  SELKV_CHECK_ARG(p.num_blocks * int64_t(p.page_size) <= int64_t(1) << 31, "num_blocks",
                  "num_blocks * page_size must fit int32 slots");
  if (p.num_tokens == 0 || p.topk == 0) {
    if (p.valid_counts != nullptr) {
      for (int64_t t = 0; t < p.num_tokens; ++t) p.valid_counts[t] = 0;
    }
    return Status::Ok();
  }
  SELKV_CHECK_ARG(p.req_local_indices != nullptr, "req_local_indices", "must not be null");
  SELKV_CHECK_ARG(p.indices_row_stride >= p.topk, "indices_row_stride", "must be >= topk");
  SELKV_CHECK_ARG(p.req_id_per_token != nullptr, "req_id_per_token", "must not be null");
  SELKV_CHECK_ARG(p.out_slots != nullptr, "out_slots", "must not be null");
  SELKV_CHECK_ARG(p.out_row_stride >= p.topk, "out_row_stride", "must be >= topk");
  if (p.num_reqs > 0 && p.max_blocks_per_req > 0) {
    SELKV_CHECK_ARG(p.block_table != nullptr, "block_table", "must not be null");
    SELKV_CHECK_ARG(p.block_table_row_stride >= p.max_blocks_per_req, "block_table_row_stride",
                    "must be >= max_blocks_per_req");
  }
  SELKV_RETURN_IF_ERROR(cache::check_convert_overlaps(kOp, p));  // the GPU op's rule

  std::vector<int32_t> row(p.topk);  // the row is read fully first so in-place calls work
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int32_t r = p.req_id_per_token[t];
    const int32_t lim = p.token_seq_lens != nullptr ? p.token_seq_lens[t] : INT32_MAX;
    const int32_t* in = p.req_local_indices + t * p.indices_row_stride;
    for (int k = 0; k < p.topk; ++k) {
      const int32_t pos = in[k];
      int32_t slot = -1;
      if (r >= 0 && r < p.num_reqs && pos >= 0 && pos < lim) {
        const int32_t blk = pos / p.page_size;
        if (blk < p.max_blocks_per_req) {
          const int64_t block_id = p.block_table[int64_t(r) * p.block_table_row_stride + blk];
          if (block_id >= 0 && block_id < p.num_blocks) {
            slot = int32_t(block_id * p.page_size + pos % p.page_size);
          }
        }
      }
      row[k] = slot;
    }
    int32_t* out = p.out_slots + t * p.out_row_stride;
    int32_t count = 0;
    if (p.compact) {
      for (int k = 0; k < p.topk; ++k) {
        if (row[k] >= 0) out[count++] = row[k];
      }
      for (int k = count; k < p.topk; ++k) out[k] = -1;
    } else {
      for (int k = 0; k < p.topk; ++k) {
        out[k] = row[k];
        count += row[k] >= 0;
      }
    }
    if (p.valid_counts != nullptr) p.valid_counts[t] = count;
  }
  return Status::Ok();
}

// ---- C3 ----------------------------------------------------------------------------------------
Status gather_kv_bf16(const GatherKvParams& p) {
  constexpr const char* kOp = "selkv::ref::gather_kv_bf16";
  SELKV_CHECK_ARG(valid_format(p.format), "format", "unknown KvFormat ", int(p.format));
  SELKV_CHECK_ARG(p.num_blocks >= 0, "num_blocks", "must be >= 0, got ", p.num_blocks);
  SELKV_CHECK_ARG(p.page_size >= 1, "page_size", "must be >= 1, got ", p.page_size);
  const int64_t pb = fmt::page_bytes(p.format, p.page_size);
  SELKV_CHECK_ARG(p.block_stride_bytes >= pb, "block_stride_bytes", "must be >= the page bytes of ",
                  p.page_size, " ", fmt::format_name(p.format), " tokens = ", pb);
  SELKV_CHECK_ARG(p.num_reqs >= 0, "num_reqs", "must be >= 0, got ", p.num_reqs);
  SELKV_CHECK_ARG(p.max_blocks_per_req >= 0, "max_blocks_per_req", "must be >= 0");
  SELKV_CHECK_ARG(p.out_rows >= 0, "out_rows", "must be >= 0, got ", p.out_rows);
  if (p.num_reqs == 0) return Status::Ok();
  SELKV_CHECK_ARG(p.seq_starts != nullptr, "seq_starts", "must not be null");
  SELKV_CHECK_ARG(p.seq_lens != nullptr, "seq_lens", "must not be null");
  SELKV_CHECK_ARG(p.ws_starts != nullptr, "ws_starts", "must not be null");
  const int dim = fmt::dequant_dim(p.format);
  SELKV_CHECK_ARG(p.out != nullptr || p.out_rows == 0, "out", "must not be null");
  SELKV_CHECK_ARG(p.out_row_stride >= dim, "out_row_stride", "must be >= ", dim);
  if (p.max_blocks_per_req > 0) {
    SELKV_CHECK_ARG(p.block_table != nullptr, "block_table", "must not be null");
    SELKV_CHECK_ARG(p.block_table_row_stride >= p.max_blocks_per_req, "block_table_row_stride",
                    "must be >= max_blocks_per_req");
  }
  SELKV_CHECK_ARG(p.cache != nullptr || p.num_blocks == 0, "cache", "must not be null");
  if (p.out_rows > 0) SELKV_RETURN_IF_ERROR(cache::check_gather_overlaps(kOp, p));  // the GPU op's rule

  const auto* cache = static_cast<const uint8_t*>(p.cache);
  auto* out = static_cast<uint16_t*>(p.out);
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int64_t start = p.seq_starts[r];
    const int64_t ws = p.ws_starts[r];
    // Only the tokens whose row is inside the workspace: never write outside it, and no loop over
    // a length that lands nowhere (the GPU sizes its grid by rows too).
    const int64_t i0 = ws < 0 ? -ws : 0;
    const int64_t i1 = std::min<int64_t>(p.seq_lens[r], p.out_rows - ws);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t row = ws + i;
      uint16_t* dst = out + row * p.out_row_stride;
      const int64_t pos = start + i;
      int64_t block_id = -1;
      if (pos >= 0 && pos / p.page_size < p.max_blocks_per_req) {
        block_id = p.block_table[int64_t(r) * p.block_table_row_stride + pos / p.page_size];
      }
      if (block_id < 0 || block_id >= p.num_blocks) {
        std::memset(dst, 0, sizeof(uint16_t) * dim);  // missing block: zeros
        continue;
      }
      decode_token(cache + block_id * p.block_stride_bytes, p.format, p.page_size, pos % p.page_size, dst);
    }
  }
  return Status::Ok();
}

}  // namespace selkv::ref
