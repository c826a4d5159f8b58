// C8 plan kernel (selkv/qsa.h qsa_plan; layout src/qsa/qsa_layout.h): one CTA per row builds the
// row's virtual page-4 table, byte for byte what selkv::ref::qsa_plan writes. Each thread turns
// selection groups (4 columns; compact: a block, then the causal partial block) into one entry
// (physical page, 4-aligned slot, token mask) through the validity rule, the CTA flags the row
// irregular if a group is not 4 distinct tokens of one block, and a bitonic sort in shared memory
// orders the entries. The sort key is unique per group (it ends in the group index), so the
// unstable sort gives the reference's stable order: (page, base) ascending with ties in selection
// order, then the causal tail entries in selection order.
#pragma once

#include <cstdint>

#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_layout.h"
#include "qsa/qsa_select.cuh"

namespace selkv::qsa {

inline constexpr int kPlanThreads = 256;
inline constexpr int kPlanMaxGroups = 1024;  // >= capacity(kQsaMaxBlocks) = 513, a power of two

// key = [63] tail | [62:32] page | [31:10] slot base / 4 | [9:0] group; tail keys hold only the
// group. Pages are < 2^31, slot bases < 2^24 (page_size <= 2^24), groups <= 512.
inline constexpr unsigned long long kNoEntry = ~0ull;

__global__ void __launch_bounds__(kPlanThreads) qsa_plan_kernel(const QsaSelectionParams s, int32_t* md) {
  __shared__ unsigned long long keys[kPlanMaxGroups];
  __shared__ int32_t ent_page[kPlanMaxGroups / 2 + 1];
  __shared__ int32_t ent_word[kPlanMaxGroups / 2 + 1];
  __shared__ int32_t count_sh;
  const int32_t r = int32_t(blockIdx.x);
  const int tid = int(threadIdx.x);
  const int64_t R = s.num_rows, K = s.max_blocks, C = capacity(K);

  if (r == 0) {  // header, and the zero padding of the counts
    if (tid < kHeaderWords) {
      const int32_t hdr[kHeaderWords] = {kMagic, int32_t(R), int32_t(K), int32_t(C), 0, 0, 0, 0};
      md[tid] = hdr[tid];
    }
    const int64_t pad0 = counts_offset() + R, pad1 = entries_offset(R);
    if (pad0 + tid < pad1) md[pad0 + tid] = 0;
  }

  const RowSel rs = row_sel(s, r);
  const int32_t groups = (rs.cols + 3) / 4;
  // A full row has 2^k + 1 groups (the blocks, then the causal partial one): sort the first 2^k and
  // insert the last key, instead of sorting 2^(k+1) keys half of which are padding.
  const bool insert_last = groups > 2 && groups - 1 <= 2 * kPlanThreads && ((groups - 1) & (groups - 2)) == 0;
  int32_t n = 1;
  while (n < groups - (insert_last ? 1 : 0)) n <<= 1;
  const int64_t tail_block = floor_div4(int64_t(s.positions[r]) + 1);
  if (tid == 0) count_sh = 0;

  int irregular = 0;
  for (int32_t g = tid; g < n + (insert_last ? 1 : 0); g += kPlanThreads) {
    unsigned long long key = kNoEntry;
    if (g < groups) {
      int32_t mask = 0, page = 0, base = 0;
      int64_t block = -1;
      const int32_t cn = rs.cols - 4 * g < 4 ? rs.cols - 4 * g : 4;
      for (int i = 0; i < cn; ++i) {
        const int64_t t = column_token(s, rs, 4 * g + i);
        int32_t pg, sl;
        if (!resolve_token(s, rs, t, &pg, &sl)) continue;
        const int64_t b = t / 4;  // valid tokens are >= 0
        const int32_t bit = 1 << int32_t(t & 3);
        if (mask != 0 && (b != block || (mask & bit) != 0)) irregular = 1;  // two blocks, or a repeat
        block = b;
        page = pg;
        base = sl & ~3;
        mask |= bit;
      }
      if (mask != 0) {
        key = block == tail_block ? (1ull << 63) | (unsigned long long)g
                                  : ((unsigned long long)page << 32) | ((unsigned long long)(base >> 2) << 10) |
                                        (unsigned long long)g;
        ent_page[g] = page;
        ent_word[g] = pack_word(base, mask);
      }
    }
    keys[g] = key;
  }
  irregular = __syncthreads_or(irregular);

  // Bitonic sort of keys[0, n), ascending.
  for (int32_t k = 2; k <= n; k <<= 1) {
    for (int32_t j = k >> 1; j > 0; j >>= 1) {
      for (int32_t i = tid; i < n; i += kPlanThreads) {
        const int32_t ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = keys[i], b = keys[ixj];
          if ((a > b) == ((i & k) == 0)) {
            keys[i] = b;
            keys[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  int32_t total = n;
  if (insert_last) {  // keys[0, n) sorted; keys[n] goes after the p keys smaller than it
    static_assert(kPlanMaxGroups / 2 == 2 * kPlanThreads, "two sorted keys per thread");
    const unsigned long long last = keys[n];
    const int32_t i0 = tid, i1 = tid + kPlanThreads;
    const unsigned long long k0 = i0 < n ? keys[i0] : kNoEntry, k1 = i1 < n ? keys[i1] : kNoEntry;
    const int32_t p = __syncthreads_count(i0 < n && k0 < last) + __syncthreads_count(i1 < n && k1 < last);
    if (i0 < n && k0 > last) keys[i0 + 1] = k0;  // keys are unique but for kNoEntry
    if (i1 < n && k1 > last) keys[i1 + 1] = k1;
    if (tid == 0) keys[p] = last;
    __syncthreads();
    total = n + 1;
  }
  for (int32_t i = tid; i < total; i += kPlanThreads)
    if (keys[i] != kNoEntry && (i + 1 == total || keys[i + 1] == kNoEntry)) count_sh = i + 1;
  __syncthreads();
  const int32_t count = irregular ? 0 : count_sh;

  if (tid == 0) md[counts_offset() + r] = irregular ? kIrregular : count;
  int2* ents = reinterpret_cast<int2*>(md + entry_offset(R, K, r, 0));
  for (int32_t i = tid; i < C; i += kPlanThreads) {
    int2 e = make_int2(0, 0);  // entries past the count are zero, as in the reference
    if (i < count) {
      const int32_t g = int32_t(keys[i] & 1023u);
      e = make_int2(ent_page[g], ent_word[g]);
    }
    ents[i] = e;
  }
}

}  // namespace selkv::qsa
