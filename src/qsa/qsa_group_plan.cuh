// C8 page-4 group plan kernel (layout src/qsa/qsa_group_layout.h; CPU reference
// selkv::ref::qsa_group_plan): one CTA per group of rows_per_group consecutive rows lists the
// group's distinct 4-token blocks and each block's row-membership words, so the page-4 attention
// CTA streams a finished list instead of merging its rows' lists itself (an in-kernel merge is one
// warp's serial work on the attention's critical path; docs/perf-log.md: QSA group plan).
//
// Per request of the group (valid ids in order of first appearance), the request's logical blocks
// are covered by windows of up to W x 32 blocks (W = gp_win_words: the call's longest possible
// context, up to kGpMaxWinWords, so a 128K-token context is one window). In a window every thread takes
// (row, selection group) items: the group's valid tokens (the validity rule of selkv/qsa.h) give a
// block and a token mask, set as one bit of the row's bitmap (atomicOr: a bit already set is a
// block selected twice, which makes the row bad), a mask other than all 4 tokens goes to a list.
// Then a CTA-wide exclusive scan of the bitmap words' block counts (the union over the rows) places
// every block; the blocks, spread over all threads, get their page and membership words, and the
// list's entries clear the tokens a row does not use. Rows found bad (an irregular expanded group, a block twice) must contribute
// nothing: when a request needs more than one window a first pass over its windows only finds
// them; with one window the bits of rows found bad are dropped before that window is emitted.
// A window whose partial-block list overflows is retried at half the size (a 32-block window of
// 32 rows holds at most 1024 entries: the list's capacity).
#pragma once

#include <cstdint>

#include "common/fast_divmod.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_select.cuh"

namespace selkv::qsa {

inline constexpr int kGpThreads = 256;
inline constexpr int kGpMaxWinWords = 1024;  // bitmap words a row has at most: windows of up to 32768 blocks
inline constexpr int kGpExcCap = 1024;       // partial-block entries of one window
inline constexpr int kGpMaxRows = kGroupMaxRows;

// Bitmap words of a window: enough for the call's longest possible context (block_table_width x P
// tokens), so a request is scanned once, up to kGpMaxWinWords (longer ones take several windows
// and a first pass for bad rows). Shape only: no data decides the launch.
__host__ __device__ inline int32_t gp_win_words(const QsaSelectionParams& s) {
  const int64_t blocks = (int64_t(s.block_table_width) * s.page_size + 3) / 4;
  const int64_t words = (blocks + 31) / 32;
  return int32_t(words < 1 ? 1 : words > kGpMaxWinWords ? kGpMaxWinWords : words);
}

// The fixed part of a CTA's shared memory; the window's arrays follow it (gp_smem_bytes):
// bits[kGpMaxRows][W + 1] (+ 1: the rows' word w in distinct banks), word_union[W], word_first[W]
// (the output index of word w's first block).
struct GroupPlanSmem {
  uint32_t exc[kGpExcCap];                     // (block offset << 9) | (row << 4) | token mask
  RowSel rs[kGpMaxRows];
  int32_t req[kGpMaxRows];
  int32_t warp_sums[kGpThreads / 32];
  int32_t exc_count;
  uint32_t bad;
  unsigned long long next_block;  // the smallest selected block past the window being scanned
  int32_t count;  // blocks emitted so far
};
static_assert(sizeof(GroupPlanSmem) % 8 == 0, "the window's arrays follow it aligned");

__host__ __device__ inline size_t gp_smem_bytes(int32_t win_words) {
  return sizeof(GroupPlanSmem) + 4 * (size_t(kGpMaxRows) * size_t(win_words + 1) + 2 * size_t(win_words));
}
// Items (row, selection group) one thread resolves together: their loads are in flight at once
// (one item at a time is a chain of dependent loads).
inline constexpr int kGpBatch = 4;

// Selection group gi (4 columns) of a row, loads only: expanded, its 4 columns (-1 past the row's
// columns); compact, the block id (word 0) of a counted block. Raw words, so nothing waits on a
// load until every load of the batch is issued.
__device__ __forceinline__ void gp_load(const QsaSelectionParams& s, const RowSel& rs, int32_t gi, bool use,
                                        int32_t (&w)[4]) {
  const int32_t c0 = 4 * gi;
  if (!s.compact) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = use && c0 + i < rs.cols ? __ldg(rs.sel + c0 + i) : -1;
  } else {
    w[0] = use && c0 < 4 * rs.count ? __ldg(rs.sel + gi) : -1;
    w[1] = w[2] = w[3] = -1;
  }
}

// The tokens of those words.
__device__ __forceinline__ void gp_tokens(const QsaSelectionParams& s, const RowSel& rs, int32_t gi,
                                          const int32_t (&w)[4], int64_t (&t)[4]) {
  const int32_t c0 = 4 * gi;
  if (!s.compact) {
#pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = w[i];
  } else if (c0 < 4 * rs.count) {
#pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = 4 * int64_t(w[0]) + i;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = c0 + i < rs.cols ? rs.tail_base + (c0 + i - 4 * rs.count) : -1;
  }
}

// The block-table entry of the item's first live token (token_live), or -1 when none is live or its
// logical page is past the table: issued for every item of a batch before any is used. The 4
// tokens of a regular item share one block and so one page (P is a multiple of 4): one lookup and
// one division an item.
__device__ __forceinline__ int32_t gp_first_page(const QsaSelectionParams& s, const RowSel& rs, const int64_t (&t)[4],
                                                 int64_t* block) {
  int64_t first = -1;
#pragma unroll
  for (int i = 3; i >= 0; --i)
    if (token_live(rs, t[i])) first = t[i];
  *block = first >= 0 ? first / 4 : -1;
  return first < 0 ? -1 : table_entry(s, rs, int32_t(first));
}

// Those tokens' valid ones (the rule of resolve_token): their logical block and mask (0: none), and
// whether they fail to be distinct tokens of one block. block0 / page0: gp_first_page's.
__device__ __forceinline__ void gp_item(const QsaSelectionParams& s, const RowSel& rs, const int64_t (&t)[4],
                                        int64_t block0, int32_t page0, int64_t* block, int* mask, bool* irregular) {
  *mask = 0;
  *irregular = false;
  *block = -1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (!token_live(rs, t[i])) continue;
    const int64_t b = t[i] / 4;  // live tokens are >= 0
    const int32_t pg = b == block0 ? page0 : table_entry(s, rs, int32_t(t[i]));  // an irregular item: its own lookup
    if (!page_in_range(s, pg)) continue;
    const int bit = 1 << int(t[i] & 3);
    if (*mask != 0 && (b != *block || (*mask & bit) != 0)) *irregular = true;
    *block = b;
    *mask |= bit;
  }
}

// A regular item: the 4 tokens of one block in order, 4 b .. 4 b + 3 (every counted block of the
// compact form, and what an expanded selection holds but for its tail and garbage).
__device__ __forceinline__ bool gp_regular(const int64_t (&t)[4]) {
  return t[0] >= 0 && (t[0] & 3) == 0 && t[1] == t[0] + 1 && t[2] == t[0] + 2 && t[3] == t[0] + 3;
}

// gp_item for a regular item, its result without the per-token walk: tokens below the request's
// live length (token_live; they are ascending) with the block's page (page0, gp_first_page's
// lookup of token t0) in range.
__device__ __forceinline__ void gp_regular_item(const QsaSelectionParams& s, const RowSel& rs, int64_t t0,
                                                int32_t page0, int64_t* block, int* mask) {
  const int64_t lim = rs.table != nullptr ? rs.len : 0;
  const int64_t live = lim - t0 < 0 ? 0 : lim - t0 > 4 ? 4 : lim - t0;
  *mask = live > 0 && page_in_range(s, page0) ? (1 << live) - 1 : 0;
  *block = *mask != 0 ? t0 / 4 : -1;
}

// Any item but an expanded regular one: its tokens, then gp_regular_item or gp_item. Out of line
// (inlined in every slot of the item batch it multiplies the kernel's code for items the expanded
// form rarely has), its arguments by value so the caller's registers stay out of memory; `rule`
// carries the fields of the selection params the validity rule reads.
struct GpRule {
  int32_t page_size, block_table_width;
  int64_t num_pages;
  bool compact;
};
struct GpItem {
  int64_t block;
  int mask;
  bool irregular;
};
__device__ __noinline__ GpItem gp_general_item(const GpRule rule, const RowSel rs, int32_t gi, int4 words, int64_t block0,
                                               int32_t page0) {
  QsaSelectionParams s{};
  s.compact = rule.compact;
  s.page_size = rule.page_size;
  s.block_table_width = rule.block_table_width;
  s.num_pages = rule.num_pages;
  const int32_t w[4] = {words.x, words.y, words.z, words.w};
  int64_t t[4];
  gp_tokens(s, rs, gi, w, t);
  GpItem it{-1, 0, false};
  if (gp_regular(t)) gp_regular_item(s, rs, t[0], page0, &it.block, &it.mask);
  else gp_item(s, rs, t, block0, page0, &it.block, &it.mask, &it.irregular);
  return it;
}

// Position of the n-th (from 0) set bit of m (n < popcount(m)).
__device__ __forceinline__ int nth_set_bit(uint32_t m, int n) {
  int pos = 0;
#pragma unroll
  for (int half = 16; half > 0; half >>= 1) {
    const int below = __popc(m & ((1u << half) - 1u));
    if (n >= below) {
      n -= below;
      m >>= half;
      pos += half;
    }
  }
  return pos;
}

// kCompact: s.compact (the selection form), a template argument so each form's item walk carries
// none of the other's code. page_div: FastDivmod(s.page_size), built by the launcher.
template <bool kCompact>
__global__ void __launch_bounds__(kGpThreads, 2) qsa_group_plan_kernel(const QsaSelectionParams s, int32_t rows_per_group,
                                                                     int32_t win_words, bool hand_over,
                                                                     const FastDivmod page_div, int32_t* gp) {
  extern __shared__ __align__(16) uint8_t gp_smem_raw[];
  GroupPlanSmem& sm = *reinterpret_cast<GroupPlanSmem*>(gp_smem_raw);
  const int W = win_words, bits_stride = win_words + 1;
  uint32_t* const bits = reinterpret_cast<uint32_t*>(gp_smem_raw + sizeof(GroupPlanSmem));  // [row][bits_stride]
  uint32_t* const word_union = bits + kGpMaxRows * bits_stride;
  int32_t* const word_first = reinterpret_cast<int32_t*>(word_union + W);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const GpRule rule{s.page_size, s.block_table_width, s.num_pages, kCompact};
  const int64_t R = s.num_rows, K = s.max_blocks, C = group_capacity(K);
  const int64_t g = blockIdx.x;
  const int64_t row0 = g * rows_per_group;
  const int rows = int(R - row0 < rows_per_group ? R - row0 : rows_per_group);
  const int64_t groups = (R + rows_per_group - 1) / rows_per_group;
  if (g == 0 && tid < kGroupHeaderWords) {
    const int32_t hdr[kGroupHeaderWords] = {kGroupMagic, int32_t(R), int32_t(K), rows_per_group, int32_t(groups), 0, 0, 0};
    gp[tid] = hdr[tid];
  }
  if (tid < rows) {
    sm.rs[tid] = row_sel(s, int32_t(row0 + tid));
    const int32_t q = s.req_ids[row0 + tid];
    sm.req[tid] = q >= 0 && q < s.num_req ? q : -1;
  }
  if (tid == 0) {
    sm.bad = 0;
    sm.count = 0;
  }
  __syncthreads();

  const int64_t first = row0 * C;
  int2* out_pb = reinterpret_cast<int2*>(gp + group_blocks_offset(R)) + first;
  uint4* out_tw = reinterpret_cast<uint4*>(gp + group_tokw_offset(R, K)) + first;

  int32_t uses = 0;  // (row, block) uses of the blocks this thread emitted (hand_over's sharing)

  // Scans window [w0, w0 + nb) of request q's blocks (rq: the RowSel of a row of q; its len and
  // table are q's, the same for every row of q): sets the bits of the rows of q (and, when `emit`,
  // lists partial blocks; rows already bad are skipped then), and finds the next selected block
  // past the window (*next; empty stretches of the request are never scanned). Returns false when
  // the list overflowed. Uniform across the CTA.
  auto scan = [&](int32_t q, const RowSel& rq, int64_t w0, int32_t nb, bool emit, int64_t* next) -> bool {
    const int words = (nb + 31) / 32;
    for (int i = tid; i < kGpMaxRows * words; i += kGpThreads) bits[(i / words) * bits_stride + i % words] = 0u;
    if (tid == 0) {
      sm.exc_count = 0;
      sm.next_block = ~0ull;
    }
    uint32_t rows_q = 0u;  // the rows of q this scan walks
    for (int j = 0; j < rows; ++j) rows_q |= uint32_t(sm.req[j] == q) << j;
    if (emit) rows_q &= ~sm.bad;
    __syncthreads();
    const int32_t qlen = rq.len > 0 && rq.table != nullptr ? rq.len : 0;  // tokens below it are live
    // Items (row j, selection group gi): the batches walk gi < K (idx = tid + kGpThreads k, (j, gi)
    // advancing by kGpThreads without a division); the last group (gi = K: the expanded causal
    // tail, a compact row's unused room) of row tid is the first batch's extra slot, so a batch
    // count of rows x (K + 1) just past a multiple of the batch size costs no extra round.
    const int32_t items = rows * int32_t(K);
    const int32_t step_j = kGpThreads / int32_t(K), step_g = kGpThreads % int32_t(K);
    int32_t nj = tid / int32_t(K), ngi = tid % int32_t(K);
    for (int32_t base = tid; base < items; base += kGpThreads * kGpBatch) {
      constexpr int kSlots = kGpBatch + 1;
      int32_t raw[kSlots][4];
      int jr[kSlots], gr[kSlots];
#pragma unroll
      for (int u = 0; u < kSlots; ++u) {  // the batch's selection loads, all in flight
        const int32_t idx = base + u * kGpThreads;
        const bool extra = u == kGpBatch;
        const bool live_item = extra ? base == tid && tid < rows : idx < items;
        const int j = extra ? (tid < rows ? tid : 0) : idx < items ? nj : 0;
        const int gi = extra ? int(K) : ngi;
        bool use = live_item && ((rows_q >> j) & 1u) != 0u;
        if constexpr (kCompact) use = use && 4 * gi < sm.rs[j].cols;
        jr[u] = use ? j : -1;
        gr[u] = gi;
        if constexpr (kCompact) {
          gp_load(s, sm.rs[j], gi, use, raw[u]);
        } else {
          const int32_t* sel = s.selection + (row0 + j) * s.selection_stride + 4 * gi;
          const int32_t cols = 4 * int32_t(K) + 3 - 4 * gi;  // this group's columns in the row
#pragma unroll
          for (int i = 0; i < 4; ++i) raw[u][i] = use && i < cols ? __ldg(sel + i) : -1;
        }
        if (!extra) {
          ngi += step_g;
          nj += step_j;
          if (ngi >= int32_t(K)) {
            ngi -= int32_t(K);
            ++nj;
          }
        }
      }
      int32_t pg0[kSlots];
      int64_t blk0[kSlots];
#pragma unroll
      for (int u = 0; u < kSlots; ++u) {  // then their block-table loads, all in flight
        if constexpr (kCompact) {
          const int j = jr[u] < 0 ? 0 : jr[u];
          int64_t tok[4];
          gp_tokens(s, sm.rs[j], gr[u], raw[u], tok);
          pg0[u] = jr[u] < 0 ? -1 : gp_first_page(s, sm.rs[j], tok, &blk0[u]);
        } else {
          // An expanded group of 4 negative words (the -1 padding past a row's selection, most of a
          // short selection's columns) holds no token: nothing more to do for it. Tokens are the
          // stored int32 words: the first live one (column order) gives the page, one lookup.
          if ((raw[u][0] & raw[u][1] & raw[u][2] & raw[u][3]) < 0) jr[u] = -1;
          int32_t first = -1;
#pragma unroll
          for (int i = 3; i >= 0; --i)
            if (raw[u][i] >= 0 && raw[u][i] < qlen) first = raw[u][i];
          const int32_t lp = first >= 0 ? int32_t(page_div.div(uint32_t(first))) : 0;
          blk0[u] = first >> 2;
          pg0[u] = jr[u] >= 0 && first >= 0 && lp < s.block_table_width ? __ldg(rq.table + lp) : -1;
        }
      }
#pragma unroll
      for (int u = 0; u < kSlots; ++u) {
        const int j = jr[u];
        if (j < 0) continue;
        int64_t b;
        int mask;
        bool irregular = false;
        const int32_t(&w)[4] = raw[u];
        if (!kCompact && w[0] >= 0 && (w[0] & 3) == 0 && w[1] == w[0] + 1 && w[2] == w[0] + 2 && w[3] == w[0] + 3) {
          // A regular item (the 4 tokens of one block in order): those below qlen, the block's page
          // (pg0: token w[0]'s, when it is live) in range.
          const int32_t live = qlen - w[0] < 0 ? 0 : qlen - w[0] > 4 ? 4 : qlen - w[0];
          mask = live > 0 && page_in_range(s, pg0[u]) ? (1 << live) - 1 : 0;
          b = w[0] >> 2;
        } else {
          const RowSel rs = kCompact ? sm.rs[j] : RowSel{rq.len, rq.table, 0, 0, 0, nullptr};
          const GpItem it = gp_general_item(rule, rs, gr[u], make_int4(w[0], w[1], w[2], w[3]), blk0[u], pg0[u]);
          b = it.block;
          mask = it.mask;
          irregular = it.irregular;
        }
        if (irregular) atomicOr(&sm.bad, 1u << j);
        if (mask != 0 && b >= w0 + nb) atomicMin(&sm.next_block, static_cast<unsigned long long>(b));
        if (mask == 0 || b < w0 || b >= w0 + nb) continue;
        const uint32_t off = uint32_t(b - w0), bit = 1u << (off & 31u);
        const uint32_t old = atomicOr(&bits[j * bits_stride + (off >> 5)], bit);
        if ((old & bit) != 0u) atomicOr(&sm.bad, 1u << j);  // the block a second time
        if (emit && mask != 15) {
          const int32_t i = atomicAdd(&sm.exc_count, 1);
          if (i < kGpExcCap) sm.exc[i] = (off << 9) | (uint32_t(j) << 4) | uint32_t(mask);
        }
      }
    }
    __syncthreads();
    const bool fits = sm.exc_count <= kGpExcCap;
    *next = sm.next_block == ~0ull ? INT64_MAX : static_cast<int64_t>(sm.next_block);
    __syncthreads();  // every thread has read the count and the next block before a rescan resets them
    return fits;
  };

  // Emits the blocks of the window just scanned, rows in `bad` excluded: each word's block count and
  // output index (a CTA-wide exclusive scan, kGpThreads words at a time), then the blocks spread
  // over every thread (a block's table lookup is a dependent load: one thread walking a word's 32
  // blocks would chain them), then the partial-block list.
  auto emit_window = [&](const int32_t* tab, int64_t w0, int32_t nb) {
    const int words = (nb + 31) / 32;
    const uint32_t bad = sm.bad;
    const int32_t count0 = sm.count;  // read before the scan's first update (behind a barrier)
    for (int c0 = 0; c0 < words; c0 += kGpThreads) {
      const int w = c0 + tid;
      uint32_t u = 0u;
      if (w < words) {
        for (int j = 0; j < rows; ++j)
          if (((bad >> j) & 1u) == 0u) u |= bits[j * bits_stride + w];
        word_union[w] = u;
      }
      const int cnt = __popc(u);
      int incl = cnt;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(~0u, incl, d);
        if (lane >= d) incl += y;
      }
      if (lane == 31) sm.warp_sums[warp] = incl;
      __syncthreads();
      int before = sm.count;
      for (int v = 0; v < warp; ++v) before += sm.warp_sums[v];
      if (w < words) word_first[w] = before + incl - cnt;
      __syncthreads();  // every thread has read sm.count and the warp sums
      if (tid == kGpThreads - 1) sm.count = before + incl;  // the last thread's inclusive total
      __syncthreads();
    }
    const int32_t n_win = sm.count - count0;
    for (int32_t i0 = tid; i0 < n_win; i0 += kGpThreads * kGpBatch) {
      int32_t lp[kGpBatch], slot[kGpBatch];
      uint32_t mem[kGpBatch];
#pragma unroll
      for (int u = 0; u < kGpBatch; ++u) {  // the batch's blocks, then their table loads all in flight
        const int32_t k = count0 + i0 + u * kGpThreads;
        lp[u] = -1;
        if (i0 + u * kGpThreads >= n_win) continue;
        int lo = 0, hi = words;  // the first word whose first index is past k; k is in the one before
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (word_first[mid] <= k) lo = mid + 1;
          else hi = mid;
        }
        const int w = lo - 1;  // non-empty: an empty word's first index is its successor's
        const int bit = nth_set_bit(word_union[w], k - word_first[w]);
        uint32_t m = 0u;
        for (int j = 0; j < rows; ++j)
          if (((bad >> j) & 1u) == 0u) m |= ((bits[j * bits_stride + w] >> bit) & 1u) << j;
        mem[u] = m;
        uses += __popc(m);  // a row of a partial block keeps at least one token: its use stands
        const int64_t t = 4 * (w0 + 32 * w + bit);  // the block's first token (its page: valid, a row uses it)
        lp[u] = int32_t(page_div.div(uint32_t(t)));  // t < the request's length: an int32
        slot[u] = int32_t(t) - lp[u] * s.page_size;
      }
      int32_t pg[kGpBatch];
#pragma unroll
      for (int u = 0; u < kGpBatch; ++u) pg[u] = lp[u] >= 0 ? __ldg(tab + lp[u]) : 0;
#pragma unroll
      for (int u = 0; u < kGpBatch; ++u) {
        if (lp[u] < 0) continue;
        const int32_t k = count0 + i0 + u * kGpThreads;
        out_pb[k] = make_int2(pg[u], slot[u]);
        out_tw[k] = make_uint4(mem[u], mem[u], mem[u], mem[u]);
      }
    }
    __syncthreads();  // the block words written (visible to the CTA) before the partial masks
    const int32_t n_exc = sm.exc_count;
    for (int32_t i = tid; i < n_exc; i += kGpThreads) {
      const uint32_t x = sm.exc[i];
      const int j = int((x >> 4) & 31u);
      if (((bad >> j) & 1u) != 0u) continue;
      const uint32_t off = x >> 9, w = off >> 5, bit = off & 31u;
      const int k = word_first[w] + __popc(word_union[w] & ((1u << bit) - 1u));
      uint32_t* tw = reinterpret_cast<uint32_t*>(out_tw + k);
      for (int ti = 0; ti < 4; ++ti)
        if (((x >> ti) & 1u) == 0u) atomicAnd(tw + ti, ~(1u << j));
    }
    __syncthreads();  // the list is read before the next window's scan resets it
  };

  // Requests in order of first appearance among the group's rows.
  for (int jq = 0; jq < rows; ++jq) {
    const int32_t q = sm.req[jq];
    if (q < 0) continue;
    bool seen = false;
    for (int j = 0; j < jq; ++j) seen = seen || sm.req[j] == q;
    if (seen) continue;
    const RowSel rq = sm.rs[jq];
    const int64_t live = s.seq_lens[q] < int64_t(s.block_table_width) * s.page_size
                             ? int64_t(s.seq_lens[q]) : int64_t(s.block_table_width) * s.page_size;
    const int64_t nblocks = live > 0 ? (live + 3) / 4 : 0;
    const int32_t kWin = 32 * W;
    int64_t next;
    if (nblocks > kWin)  // bad rows first, over every window that holds a selected block
      for (int64_t w0 = 0; w0 < nblocks; w0 = next)
        scan(q, rq, w0, int32_t(nblocks - w0 < kWin ? nblocks - w0 : kWin), false, &next);
    int32_t win = kWin;
    for (int64_t w0 = 0; w0 < nblocks;) {
      const int32_t nb = int32_t(nblocks - w0 < win ? nblocks - w0 : win);
      if (!scan(q, rq, w0, nb, true, &next)) {  // the partial-block list overflowed: half the window
        win = nb / 2 > 32 ? nb / 2 : 32;
        continue;
      }
      emit_window(rq.table, w0, nb);  // (a window with blocks has a table: scan found them through it)
      w0 = next;
      win = kWin;
    }
  }
  // hand_over: the group's sharing, its blocks' row uses (each block's rows, partial or whole)
  // against its block count; under kGroupSharingNum / kGroupSharingDen the group lists nothing and
  // every row goes to the fix-up.
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) uses += __shfl_xor_sync(~0u, uses, d);
  if (lane == 0) sm.warp_sums[warp] = uses;
  __syncthreads();
  uses = 0;
  for (int v = 0; v < kGpThreads / 32; ++v) uses += sm.warp_sums[v];
  const bool shared_enough =
      !hand_over || sm.count == 0 || int64_t(uses) * kGroupSharingDen >= int64_t(kGroupSharingNum) * sm.count;
  const int32_t count = shared_enough ? sm.count : 0;
  const uint32_t bad = shared_enough ? sm.bad : rows >= 32 ? ~0u : (1u << rows) - 1u;
  if (tid == 0) {
    int32_t* ge = gp + group_table_offset() + 4 * g;
    ge[0] = int32_t(first);
    ge[1] = count;
    ge[2] = int32_t(bad);
    ge[3] = 0;
  }
  // Every other word zero (the group's room past its blocks; CTA 0 also the group table past the
  // last group and the padding before the token words): the plan is the same bytes whatever the
  // buffer held, the CPU reference's.
  for (int64_t k = count + tid; k < int64_t(rows) * C; k += kGpThreads) {
    out_pb[k] = make_int2(0, 0);
    out_tw[k] = make_uint4(0u, 0u, 0u, 0u);
  }
  if (g == 0) {
    for (int64_t i = group_table_offset() + 4 * groups + tid; i < group_blocks_offset(R); i += kGpThreads) gp[i] = 0;
    for (int64_t i = group_blocks_offset(R) + 2 * R * C + tid; i < group_tokw_offset(R, K); i += kGpThreads) gp[i] = 0;
  }
}

}  // namespace selkv::qsa
