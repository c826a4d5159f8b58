// Device-side parameters of the C8 kernels (the plan kernel and the exact simple kernel), filled
// by qsa_api.cpp from QsaSparsePrefillParams. Plain data, no CUDA or selkv headers, so the simple
// kernel's translation unit compiles on its own for any target (CI assembles it for sm_70).
#pragma once

#include <cstdint>

namespace selkv::qsa {

// Where a row's selection comes from and how an entry resolves (selkv/qsa.h "Validity").
struct QsaSelectionParams {
  int32_t num_rows;
  int32_t max_blocks;     // K
  bool compact;
  const int32_t* selection;  // expanded [R, 4K + 3]
  int64_t selection_stride;
  const int32_t* block_ids;  // compact [R, K]
  int64_t block_ids_stride;
  const int32_t* block_counts;
  const int32_t* req_ids;
  const int32_t* positions;
  const int32_t* seq_lens;
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t num_req;
  int32_t block_table_width;
  int32_t page_size;
  int64_t num_pages;
};

struct QsaSimpleParams {
  QsaSelectionParams sel;
  int32_t num_kv_heads;
  int32_t group;           // Hq / Hkv
  const void* q;           // [R, Hq, D]
  int64_t q_row_stride, q_head_stride;   // elements
  const void* k;
  int64_t k_page_stride, k_slot_stride, k_head_stride;
  const void* v;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  float scale_log2;        // scale * log2(e): scores are kept in the base-2 domain
  void* out;
  int64_t out_row_stride, out_head_stride;
  float* lse;              // null: not written
  int64_t lse_row_stride, lse_head_stride;
};

}  // namespace selkv::qsa
