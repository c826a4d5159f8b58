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

// The SM90 page-4 kernel (qsa_page4.cuh): a persistent grid over the units (group of rows_per_cta
// consecutive rows, kv head) of the plan of qsa_plan, each CTA a contiguous share of their tiles.
struct QsaPage4Params {
  const int32_t* md;       // the group plan (src/qsa/qsa_group_layout.h)
  // Scratch for units split between CTAs (qsa_page4_split_bytes(D)), or null: then every CTA
  // takes whole units (shares cut at unit boundaries, less even).
  void* split_ws;
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
// The page-4 grid: one CTA an SM, at most kQsaPage4MaxCtas. A unit split between CTAs leaves a
// partial result (its consumer threads' O fragments and (m, l), unnormalized) in a slot of the
// split scratch; the last of its pieces to finish merges them in piece order (so the bits do
// not depend on which one). Scratch: an arrival counter a CTA, then two slots a CTA (its first
// and its last unit may both be split).
inline constexpr int kQsaPage4MaxCtas = 160;
inline constexpr int64_t kQsaPage4CounterBytes = 1024;
static_assert(4 * kQsaPage4MaxCtas <= kQsaPage4CounterBytes, "one counter a CTA");
inline constexpr int64_t qsa_page4_slot_bytes(int64_t head_dim) { return (head_dim / 8 + 1) * 2 * kQsaPage4Pairs * 16 + 256; }
inline constexpr int64_t qsa_page4_split_bytes(int64_t head_dim) {
  return kQsaPage4CounterBytes + 2 * kQsaPage4MaxCtas * qsa_page4_slot_bytes(head_dim);
}
inline constexpr int qsa_page4_max_rows(int group) {
  return group < 1 ? 0 : (kQsaPage4Pairs / group < kGroupMaxRows ? kQsaPage4Pairs / group : kGroupMaxRows);
}

}  // namespace selkv::qsa
