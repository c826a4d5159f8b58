// Walking one part of the split-KV schedule (docs/decode-design.md §3): the same sequence of
// (row, block range) items in the producer and both consumer warpgroups.
#pragma once

#include <cstdint>

#include "decode/sm90/config.h"

namespace selkv::decode::sm90 {

// ---- work iteration (identical in producer and consumers) -----------------------------------
struct RowWork {
  int32_t row;        // b * seq_q + s
  int32_t blk_begin;  // 64-token blocks [blk_begin, blk_end) of this row
  int32_t blk_end;
  bool split;         // row shared with other parts -> write a partial
  int32_t slot;       // accumulator slot when split
};

struct PartIter {
  const int32_t* prefix;
  int32_t g, g0, g1, r, part, max_blocks;

  // false when this part has no work (uniform over the CTA).
  __device__ __forceinline__ bool init(const int32_t* md, int32_t part_, int32_t max_blocks_) {
    const int32_t T = md[0], np = md[1], rows = md[2];
    part = part_;
    max_blocks = max_blocks_;
    if (part >= np || T <= 0 || rows <= 0) return false;
    prefix = md + kMdHeaderInts;
    g0 = part_begin(part, T, np);
    g1 = part_begin(part + 1, T, np);
    if (g0 >= g1) return false;
    g = g0;
    int32_t lo = 0, hi = rows - 1;  // last row with prefix[row] <= g0
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) >> 1;
      if (prefix[mid] <= g0) lo = mid; else hi = mid - 1;
    }
    r = lo;
    return true;
  }

  __device__ __forceinline__ bool next(RowWork& w) {
    if (g >= g1) return false;
    const int32_t rb = prefix[r], re = prefix[r + 1];
    const int32_t end = re < g1 ? re : g1;
    w.row = r;
    // Not clamped: the consumers only count blocks, and must count exactly the producer's
    // g1 - g0 blocks; the producer treats a block >= K / 64 (corrupt metadata) as fully invalid.
    w.blk_begin = g - rb;
    w.blk_end = end - rb;
    w.split = !(rb >= g0 && re <= g1);
    w.slot = 2 * part + (rb <= g0 ? 0 : 1);  // first row of the part -> 2p, its last row -> 2p+1
    g = end;
    ++r;
    return true;
  }
};

}  // namespace selkv::decode::sm90
