// The C8 selection walk on the device, shared by the plan kernel and the simple kernel: a row's
// selection as a flat list of columns (expanded: the 4K + 3 columns as stored; compact: 4 columns
// per counted block, then the causal partial block), each column one logical token, and the one
// validity rule of selkv/qsa.h, applied before anything behind the token is read.
#pragma once

#include <cstdint>

#include "qsa/qsa_kernel_params.h"

namespace selkv::qsa {

// What a row reads of its request, resolved once per row.
struct RowSel {
  int32_t len;           // live tokens (0 when the request id is out of range: every entry invalid)
  const int32_t* table;  // the request's block-table row, or null
  int32_t cols;          // columns of the flat list
  int32_t count;         // compact: counted blocks (columns [0, 4 * count)); expanded: unused
  int64_t tail_base;     // compact: first token of the causal partial block
  const int32_t* sel;    // expanded: the row's selection; compact: its block ids
};

__device__ __forceinline__ int64_t floor_div4(int64_t x) { return x >= 0 ? x / 4 : -((-x + 3) / 4); }

__device__ __forceinline__ RowSel row_sel(const QsaSelectionParams& s, int32_t r) {
  RowSel rs;
  const int32_t req = s.req_ids[r];
  const bool ok = req >= 0 && req < s.num_req;
  rs.len = ok ? s.seq_lens[req] : 0;
  rs.table = ok && s.block_table_width > 0 ? s.block_table + int64_t(req) * s.block_table_stride : nullptr;
  if (s.compact) {
    int32_t cnt = s.block_counts[r];
    cnt = cnt < 0 ? 0 : cnt > s.max_blocks ? s.max_blocks : cnt;
    const int64_t pos = s.positions[r];
    rs.tail_base = 4 * floor_div4(pos + 1);
    rs.count = cnt;
    rs.cols = 4 * cnt + int32_t(pos - rs.tail_base + 1);  // + 0..3 tail tokens
    rs.sel = s.block_ids + int64_t(r) * s.block_ids_stride;
  } else {
    rs.tail_base = 0;
    rs.count = 0;
    rs.cols = 4 * s.max_blocks + 3;
    rs.sel = s.selection + int64_t(r) * s.selection_stride;
  }
  return rs;
}

// Column c's token in two steps, so a kernel can issue the load early and use it later: the stored
// word it comes from (expanded: the entry; compact: the block id, nothing for the tail), then the
// logical token of that word. c < rs.cols.
__device__ __forceinline__ int32_t column_word(const QsaSelectionParams& s, const RowSel& rs, int32_t c) {
  const bool stored = !s.compact || c < 4 * rs.count;  // one predicated load, no branch
  const int32_t* word = rs.sel + (s.compact ? c >> 2 : c);
  return stored ? *word : 0;
}
__device__ __forceinline__ int64_t word_token(const QsaSelectionParams& s, const RowSel& rs, int32_t c, int32_t word) {
  if (!s.compact) return word;
  if (c < 4 * rs.count) return 4 * int64_t(word) + (c & 3);
  return rs.tail_base + (c - 4 * rs.count);
}

// Logical token of column c (c < rs.cols); any int64 (invalid ones included).
__device__ __forceinline__ int64_t column_token(const QsaSelectionParams& s, const RowSel& rs, int32_t c) {
  return word_token(s, rs, c, column_word(s, rs, c));
}

// The validity rule's checks before the block table: t is a live token of a request with a table.
__device__ __forceinline__ bool token_live(const RowSel& rs, int64_t t) {
  return t >= 0 && t < rs.len && rs.table != nullptr;
}

// The block-table entry of live token t (an int32: t < len), or -1 when its logical page is past the
// table; the caller range-checks the entry (page_in_range).
__device__ __forceinline__ int32_t table_entry(const QsaSelectionParams& s, const RowSel& rs, int32_t t) {
  const int32_t lp = t / s.page_size;
  return lp < s.block_table_width ? __ldg(rs.table + lp) : -1;
}

// The validity rule's last check: a block-table entry names a physical page of the cache.
__device__ __forceinline__ bool page_in_range(const QsaSelectionParams& s, int32_t pg) {
  return pg >= 0 && int64_t(pg) < s.num_pages;
}

// The slot of live token t in its page.
__device__ __forceinline__ int32_t token_slot(const QsaSelectionParams& s, int32_t t) {
  return t - (t / s.page_size) * s.page_size;
}

// The validity rule: token t -> (physical page, slot), or false. Reads only the block-table entry
// of a token already known to be live.
__device__ __forceinline__ bool resolve_token(const QsaSelectionParams& s, const RowSel& rs, int64_t t,
                                              int32_t* page, int32_t* slot) {
  if (!token_live(rs, t)) return false;
  const int32_t tt = int32_t(t);
  const int32_t pg = table_entry(s, rs, tt);
  if (!page_in_range(s, pg)) return false;
  *page = pg;
  *slot = token_slot(s, tt);
  return true;
}

}  // namespace selkv::qsa
