// Walking one part of the split-KV schedule (docs/decode-design.md §3): the same sequence of
// (row, block range) items in the producer and both consumer warpgroups.
#pragma once

#include <cstdint>

#include "decode/sm90/config.h"

namespace selkv::decode::sm90 {

// ---- work iteration (identical in producer and consumers) -----------------------------------
struct RowWork {
  int32_t row;        // s * batch + b (row_coord)
  int32_t blk_begin;  // 64-token blocks [blk_begin, blk_end) of this row
  int32_t blk_end;
  bool split;         // row shared with other parts -> write a partial
  int32_t slot;       // accumulator slot when split
};

template <class Schedule>
struct PartIter {
  Schedule sched;
  int32_t g, g0, g1, r, part;

  __device__ __forceinline__ explicit PartIter(const Schedule& s) : sched(s) {}

  // false when this part has no work (uniform over the CTA).
  __device__ __forceinline__ bool init(int32_t part_) {
    part = part_;
    if (part >= sched.np || sched.total <= 0) return false;
    g0 = sched.begin(part);
    g1 = sched.begin(part + 1);
    if (g0 >= g1) return false;
    g = g0;
    r = sched.row_of_part(part);
    return true;
  }

  __device__ __forceinline__ bool next(RowWork& w) {
    if (g >= g1) return false;
    const int32_t rb = sched.prefix(r), re = sched.prefix(r + 1);
    const int32_t end = re < g1 ? re : g1;
    w.row = r < sched.rows ? r : sched.rows - 1;  // in range even for a corrupt dynamic plan
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
