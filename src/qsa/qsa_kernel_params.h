// Device-side parameters of the C8 kernels (the plan kernel, the exact simple kernel and the SM90
// page-4 kernel), filled by qsa_api.cpp from QsaSparsePrefillParams. Plain data, no CUDA or selkv headers, so the simple
// kernel's translation unit compiles on its own for any target (CI assembles it for sm_70).
#pragma once

#include <cstdint>

#include "qsa/qsa_group_layout.h"  // kGroupMaxRows

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

// The attention inputs and outputs both attention kernels read: q [R, Hq, D], the K and V views
// [pages, P, Hkv, D] (strides in elements), the base-2 scale, out [R, Hq, D] and the optional lse.
struct QsaAttnIo {
  const void* q;
  int64_t q_row_stride, q_head_stride;
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

// The simple kernel's chunks (qsa_simple_mma.cuh: a warp a chunk stream, 16 selection columns a
// chunk) against the longest row, 4 * 512 + 3 expanded columns (qsa_api.cpp checks them against
// selkv/qsa.h's kQsaMaxBlocks), and its CTA size by selection width: 4 warps for selections of at
// least kQsaSimpleWideMinBlocks blocks (`max_blocks`), 2 below, where a row's few chunks spread
// over fewer warps and twice the CTAs an SM hide more of a CTA's prologue and merge.
inline constexpr int kQsaWarpChunkCols = 16;
inline constexpr int kQsaWarpMaxChunks = 129;
inline constexpr int kQsaSimpleWideMinBlocks = 128;

struct QsaSimpleParams {
  QsaSelectionParams sel;
  int32_t num_kv_heads;
  int32_t group;           // Hq / Hkv
  QsaAttnIo io;
  // Fix-up pass after the page-4 kernel: a CTA computes its (row, kv head) only when element 0 of
  // one of its G heads' out is non-finite (the page-4 kernel's flag for pairs it cannot serve).
  bool only_nonfinite;
};

// The SM90 page-4 kernel (qsa_page4.cuh): one CTA per group of rows_per_cta consecutive rows and
// kv head, reading the plan of qsa_plan.
struct QsaPage4Params {
  const int32_t* md;       // the group plan (src/qsa/qsa_group_layout.h)
  int32_t num_rows;        // R
  int32_t max_blocks;      // K
  int32_t num_kv_heads;
  int32_t group;           // Hq / Hkv
  int32_t rows_per_cta;    // rows of one CTA, 1 .. qsa_page4_max_rows(group)
  int32_t page_size;
  int64_t num_pages;
  QsaAttnIo io;
};

// (row, head) pairs of one page-4 CTA (the M of its warpgroup MMA tiles) and rows it may group:
// as many as fill them, at most kGroupMaxRows (one bit each in the plan's token words).
inline constexpr int kQsaPage4Pairs = 64;
inline constexpr int qsa_page4_max_rows(int group) {
  return group < 1 ? 0 : (kQsaPage4Pairs / group < kGroupMaxRows ? kQsaPage4Pairs / group : kGroupMaxRows);
}

}  // namespace selkv::qsa
