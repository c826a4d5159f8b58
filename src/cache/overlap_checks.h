// Overlap rules of the cache ops C1-C4 (DESIGN §2): an output must not share memory with another
// output or an input; the documented in-place forms (C2 out_slots == req_local_indices, C4
// out_indices == indices, each with the same row stride) are the only aliases allowed. Header
// only, so the GPU checks (cache_checks.cpp, dequant_selected.cpp) and the CPU oracle
// (src/reference) apply the same rules. Each function assumes the op's size / stride checks
// passed and is called only when the op touches memory.
#pragma once

#include <cstdint>

#include "common/overlap.h"
#include "selkv/cache_ops.h"
#include "selkv/dequant.h"

namespace selkv::cache {

// The bytes a paged cache view spans (every block of the view): up to the last page's last
// token byte, page_size * record_bytes (model1_fp8: its 584-byte tokens end at the scale tail;
// the page padding after it is never touched).
inline detail::Extent cache_extent(const void* cache, int64_t num_blocks, int32_t page_size,
                                   int64_t block_stride_bytes, KvFormat format) {
  if (num_blocks <= 0) return detail::Extent{};
  return detail::byte_range(cache, (num_blocks - 1) * block_stride_bytes +
                                       int64_t(page_size) * fmt::record_bytes(format));
}

// C1 (num_tokens > 0, num_blocks > 0): the cache against latent, rope and slot_mapping.
inline Status check_write_overlaps(const char* kOp, const WriteKvCacheParams& p) {
  using detail::Dim;
  using detail::extent_of;
  const int64_t T = p.num_tokens;
  const detail::Extent cache = cache_extent(p.cache, p.num_blocks, p.page_size, p.block_stride_bytes, p.format);
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(
      kOp, "cache", cache, "latent", extent_of(p.latent, 2, {Dim{T, p.latent_row_stride}, Dim{fmt::nope_dim(p.format), 1}})));
  if (fmt::has_rope(p.format)) {
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(
        kOp, "cache", cache, "rope", extent_of(p.rope, 2, {Dim{T, p.rope_row_stride}, Dim{fmt::rope_dim(p.format), 1}})));
  }
  return detail::check_disjoint(kOp, "cache", cache, "slot_mapping", extent_of(p.slot_mapping, 8, {Dim{T, 1}}));
}

// C2 (num_tokens > 0, topk > 0): out_slots and valid_counts against each other and the inputs
// (req_local_indices, the first num_tokens entries of req_id_per_token and of token_seq_lens,
// block_table when read).
inline Status check_convert_overlaps(const char* kOp, const ConvertIndicesParams& p) {
  using detail::Dim;
  using detail::Extent;
  using detail::extent_of;
  const int64_t T = p.num_tokens;
  const bool reads_table = p.num_reqs > 0 && p.max_blocks_per_req > 0;
  const Extent in = extent_of(p.req_local_indices, 4, {Dim{T, p.indices_row_stride}, Dim{p.topk, 1}});
  const Extent out = extent_of(p.out_slots, 4, {Dim{T, p.out_row_stride}, Dim{p.topk, 1}});
  const Extent req = extent_of(p.req_id_per_token, 4, {Dim{T, 1}});
  const Extent table =
      reads_table ? extent_of(p.block_table, 4, {Dim{p.num_reqs, p.block_table_row_stride}, Dim{p.max_blocks_per_req, 1}})
                  : Extent{};
  const Extent counts = extent_of(p.valid_counts, 4, {Dim{T, 1}});
  const Extent lens = extent_of(p.token_seq_lens, 4, {Dim{T, 1}});
  if (static_cast<const void*>(p.out_slots) == static_cast<const void*>(p.req_local_indices)) {
    // In place: each CTA reads its row chunk before writing it, so only an exact alias works.
    SELKV_CHECK_ARG(p.out_row_stride == p.indices_row_stride, "out_row_stride",
                    "must equal indices_row_stride when out_slots aliases req_local_indices");
  } else {
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, "out_slots", out, "req_local_indices", in));
  }
  SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
      kOp, "out_slots", out, {{"req_id_per_token", req}, {"block_table", table}, {"token_seq_lens", lens}}));
  return detail::check_disjoint_from(kOp, "valid_counts", counts,
                                     {{"out_slots", out}, {"req_local_indices", in}, {"req_id_per_token", req},
                                      {"block_table", table}, {"token_seq_lens", lens}});
}

// C3 (num_reqs > 0, out_rows > 0): out against the cache, block_table, seq_starts, seq_lens and
// ws_starts.
inline Status check_gather_overlaps(const char* kOp, const GatherKvParams& p) {
  using detail::Dim;
  using detail::extent_of;
  const detail::Extent out = extent_of(p.out, 2, {Dim{p.out_rows, p.out_row_stride}, Dim{fmt::dequant_dim(p.format), 1}});
  const int64_t R = p.num_reqs;
  // (extent_of gives an empty extent for a size <= 0: a table of no columns is not read)
  return detail::check_disjoint_from(
      kOp, "out", out,
      {{"cache", cache_extent(p.cache, p.num_blocks, p.page_size, p.block_stride_bytes, p.format)},
       {"block_table", extent_of(p.block_table, 4, {Dim{R, p.block_table_row_stride}, Dim{p.max_blocks_per_req, 1}})},
       {"seq_starts", extent_of(p.seq_starts, 4, {Dim{R, 1}})},
       {"seq_lens", extent_of(p.seq_lens, 4, {Dim{R, 1}})},
       {"ws_starts", extent_of(p.ws_starts, 4, {Dim{R, 1}})}});
}

// C4 (N = T * K > 0 or need > 0 workspace rows): the workspace rows used and out_indices against
// each other, the cache, indices and topk_length; out_indices == indices (same stride) is in place.
inline Status check_dequant_overlaps(const char* kOp, const DequantSelectedParams& p, int64_t need) {
  using detail::Dim;
  using detail::Extent;
  using detail::extent_of;
  const PagedKvCache& c = p.cache;
  const int64_t T = p.num_tokens, K = p.topk, N = T * K;
  const Extent cache = cache_extent(c.data, c.num_blocks, c.page_size, c.block_stride_bytes, c.format);
  const Extent idx = N > 0 ? extent_of(p.indices, 4, {Dim{T, p.indices_row_stride}, Dim{K, 1}}) : Extent{};
  const Extent len = N > 0 ? extent_of(p.topk_length, 4, {Dim{T, 1}}) : Extent{};
  const Extent out_idx = N > 0 ? extent_of(p.out_indices, 4, {Dim{T, p.out_indices_row_stride}, Dim{K, 1}}) : Extent{};
  const Extent ws =
      need > 0 ? extent_of(p.workspace, 2, {Dim{need, p.workspace_row_stride}, Dim{fmt::dequant_dim(c.format), 1}})
               : Extent{};
  SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
      kOp, "workspace", ws, {{"cache", cache}, {"indices", idx}, {"topk_length", len}, {"out_indices", out_idx}}));
  SELKV_RETURN_IF_ERROR(
      detail::check_disjoint_from(kOp, "out_indices", out_idx, {{"cache", cache}, {"topk_length", len}}));
  if (static_cast<const void*>(p.out_indices) == static_cast<const void*>(p.indices)) return Status::Ok();
  return detail::check_disjoint(kOp, "out_indices", out_idx, "indices", idx);
}

}  // namespace selkv::cache
