// C4 argument validation (include/selkv/dequant.h). Pure C++, no CUDA call, so the CPU suite
// (tests/cpp/test_dequant_selected_checks.cpp) covers every rejection.
#include <cstdint>
#include <limits>

#include "common/check.h"
#include "cache/overlap_checks.h"
#include "selkv/dequant.h"

namespace selkv {
namespace {
bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
}  // namespace

Status check_dequant_selected(const DequantSelectedParams& p) {
  constexpr const char* kOp = "selkv::dequant_selected_kv";
  const PagedKvCache& c = p.cache;
  SELKV_CHECK_ARG(fmt::known_format(c.format), "cache.format", "unknown KvFormat ", int(c.format));
  SELKV_CHECK_ARG(c.num_blocks >= 0, "cache.num_blocks", "must be >= 0, got ", c.num_blocks);
  SELKV_CHECK_ARG(c.page_size >= 1, "cache.page_size", "must be >= 1, got ", c.page_size);
  const int64_t page_bytes = fmt::page_bytes(c.format, c.page_size);
  SELKV_CHECK_ARG(c.block_stride_bytes >= page_bytes, "cache.block_stride_bytes", "must be >= the page bytes of ",
                  c.page_size, " ", fmt::format_name(c.format), " tokens = ", page_bytes, ", got ",
                  c.block_stride_bytes);
  SELKV_CHECK_ARG(c.block_stride_bytes % 16 == 0, "cache.block_stride_bytes",
                  "must be a multiple of 16, got ", c.block_stride_bytes);
  SELKV_CHECK_ARG(c.num_blocks <= std::numeric_limits<int64_t>::max() / c.block_stride_bytes,
                  "cache.num_blocks", "num_blocks * block_stride_bytes overflows int64");
  // Slots are int32 (DESIGN §2): a pool past 2^31 slots cannot be addressed by any index.
  SELKV_CHECK_ARG(c.num_blocks <= (int64_t(1) << 31) / c.page_size, "cache.num_blocks",
                  "num_blocks * page_size must be <= 2^31 (int32 slots), got ", c.num_blocks,
                  " * ", c.page_size);
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.topk >= 0, "topk", "must be >= 0, got ", p.topk);
  SELKV_CHECK_ARG(p.num_tokens <= std::numeric_limits<int64_t>::max() / (int64_t(p.topk) + 1),
                  "num_tokens", "num_tokens * topk overflows int64");
  const int64_t P = c.num_slots();
  const int64_t N = p.num_tokens * int64_t(p.topk);
  const int64_t need = dequant_selected_workspace_rows(p.num_tokens, p.topk, P);
  const int D = fmt::dequant_dim(c.format);
  if (p.workspace_rows < need) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": workspace_rows: need ", need, " rows of ", D,
                                 " bf16 (", need * D * 2, " bytes at a dense row stride), got ",
                                 p.workspace_rows, " rows"));
  }
  if (N > 0) {
    SELKV_CHECK_ARG(p.indices != nullptr, "indices", "must not be null");
    SELKV_CHECK_ARG(aligned(p.indices, 4), "indices", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.indices_row_stride >= p.topk, "indices_row_stride", "must be >= topk (",
                    p.topk, "), got ", p.indices_row_stride);
    SELKV_CHECK_ARG(p.out_indices != nullptr, "out_indices", "must not be null");
    SELKV_CHECK_ARG(aligned(p.out_indices, 4), "out_indices", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.out_indices_row_stride >= p.topk, "out_indices_row_stride",
                    "must be >= topk (", p.topk, "), got ", p.out_indices_row_stride);
    if (static_cast<const void*>(p.out_indices) == static_cast<const void*>(p.indices)) {
      SELKV_CHECK_ARG(p.out_indices_row_stride == p.indices_row_stride, "out_indices_row_stride",
                      "must equal indices_row_stride when out_indices aliases indices");
    }
    if (p.topk_length != nullptr) {
      SELKV_CHECK_ARG(aligned(p.topk_length, 4), "topk_length", "must be 4-byte aligned");
    }
  }
  if (need > 0) {
    SELKV_CHECK_ARG(c.data != nullptr, "cache.data", "must not be null");
    SELKV_CHECK_ARG(aligned(c.data, 16), "cache.data", "must be 16-byte aligned");
    SELKV_CHECK_ARG(p.workspace != nullptr, "workspace", "must not be null");
    SELKV_CHECK_ARG(aligned(p.workspace, 16), "workspace", "must be 16-byte aligned");
    SELKV_CHECK_ARG(p.workspace_row_stride >= D, "workspace_row_stride", "must be >= ", D,
                    ", got ", p.workspace_row_stride);
    SELKV_CHECK_ARG(p.workspace_row_stride % 8 == 0, "workspace_row_stride",
                    "must be a multiple of 8 elements (16-byte aligned rows), got ",
                    p.workspace_row_stride);
    SELKV_CHECK_ARG(need <= std::numeric_limits<int64_t>::max() / 2 / p.workspace_row_stride,
                    "workspace_row_stride", "rows * row stride overflows");
  }
  if (N > 0 || need > 0) SELKV_RETURN_IF_ERROR(cache::check_dequant_overlaps(kOp, p, need));
  return Status::Ok();
}

}  // namespace selkv
