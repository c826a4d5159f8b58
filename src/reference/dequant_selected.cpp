// Oracle for C4 selected-row dequantization (include/selkv/dequant.h): plain loops over host
// pointers. Also home of the two shape rules (mode, workspace rows) that the GPU op shares.
#include <cstdint>
#include <limits>

#include "cache/overlap_checks.h"
#include "common/check.h"
#include "reference/oracle.h"
#include "selkv/dequant.h"

namespace selkv {

DequantMode dequant_selected_mode(int64_t num_tokens, int64_t topk, int64_t num_slots) {
  const int64_t n = (num_tokens <= 0 || topk <= 0) ? 0 : num_tokens * topk;
  return n < num_slots ? DequantMode::kSelected : DequantMode::kFullPool;
}

int64_t dequant_selected_workspace_rows(int64_t num_tokens, int64_t topk, int64_t num_slots) {
  const int64_t n = (num_tokens <= 0 || topk <= 0) ? 0 : num_tokens * topk;
  const int64_t p = num_slots < 0 ? 0 : num_slots;
  return n < p ? n : p;
}

namespace ref {

Status dequant_selected(const DequantSelectedParams& p) {
  constexpr const char* kOp = "selkv::ref::dequant_selected";
  const KvFormat f = p.cache.format;
  SELKV_CHECK_ARG(fmt::known_format(f), "cache.format",
                  "unknown KvFormat ", int(f));
  SELKV_CHECK_ARG(p.cache.num_blocks >= 0, "cache.num_blocks", "must be >= 0");
  SELKV_CHECK_ARG(p.cache.page_size >= 1, "cache.page_size", "must be >= 1");
  const int64_t pb = fmt::page_bytes(f, p.cache.page_size);
  SELKV_CHECK_ARG(p.cache.block_stride_bytes >= pb, "cache.block_stride_bytes", "must be >= the page bytes of ",
                  p.cache.page_size, " ", fmt::format_name(f), " tokens = ", pb);
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0");
  SELKV_CHECK_ARG(p.topk >= 0, "topk", "must be >= 0");
  const int64_t P = p.cache.num_slots();
  const int64_t need = dequant_selected_workspace_rows(p.num_tokens, p.topk, P);
  if (p.workspace_rows < need) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": workspace_rows: need ", need, " rows, got ",
                                 p.workspace_rows));
  }
  const int D = fmt::dequant_dim(f);
  const int64_t N = p.num_tokens * int64_t(p.topk);
  if (N > 0) {
    SELKV_CHECK_ARG(p.indices != nullptr, "indices", "must not be null");
    SELKV_CHECK_ARG(p.out_indices != nullptr, "out_indices", "must not be null");
    SELKV_CHECK_ARG(p.indices_row_stride >= p.topk, "indices_row_stride", "must be >= topk");
    SELKV_CHECK_ARG(p.out_indices_row_stride >= p.topk, "out_indices_row_stride",
                    "must be >= topk");
  }
  if (need > 0) {
    SELKV_CHECK_ARG(p.workspace != nullptr, "workspace", "must not be null");
    SELKV_CHECK_ARG(p.workspace_row_stride >= D, "workspace_row_stride", "must be >= ", D);
    SELKV_CHECK_ARG(p.cache.data != nullptr, "cache.data", "must not be null");
  }
  if (N > 0 || need > 0) SELKV_RETURN_IF_ERROR(cache::check_dequant_overlaps(kOp, p, need));  // the GPU op's rule
  auto* ws = static_cast<uint16_t*>(p.workspace);
  const bool selected = dequant_selected_mode(p.num_tokens, p.topk, P) == DequantMode::kSelected;
  if (!selected) {
    for (int64_t s = 0; s < P; ++s) decode_slot(p.cache, s, ws + s * p.workspace_row_stride);
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    int64_t limit = p.topk;
    if (p.topk_length != nullptr) {
      const int64_t len = p.topk_length[t];
      limit = len < 0 ? 0 : (len < p.topk ? len : p.topk);
    }
    for (int64_t k = 0; k < p.topk; ++k) {
      const int64_t slot = p.indices[t * p.indices_row_stride + k];
      const bool valid = k < limit && slot >= 0 && slot < P;
      int32_t out = -1;
      if (valid) {
        if (selected) {
          const int64_t j = t * p.topk + k;
          decode_slot(p.cache, slot, ws + j * p.workspace_row_stride);
          out = int32_t(j);
        } else {
          out = int32_t(slot);
        }
      }
      p.out_indices[t * p.out_indices_row_stride + k] = out;
    }
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace selkv
