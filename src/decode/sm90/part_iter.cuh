// Walking one part of the split-KV schedule (docs/decode-design.md §3): the same sequence of
// (row, block range) items in the producer and both consumer warpgroups.
#pragma once

#include <cstdint>
#include <type_traits>

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

// Dynamic top-k: the walk keeps a two-row window (row r = blocks [rb, re), row r + 1 = [re, re2))
// from the part's metadata entry and loads the end of row r + 2 when it steps to row r + 1, a
// whole row before it is needed: no row switch waits on a metadata load. Fixed top-k: the bounds
// are arithmetic (FixedSchedule) and the walk is the plain one: sharing the window made the fixed
// kernels larger and slower (docs/perf-log.md: decode part walk).
template <class Schedule>
struct PartIter {
  static constexpr bool kDynamic = std::is_same_v<Schedule, DynamicSchedule>;
  Schedule sched;
  int32_t g, g0, g1, r, part;
  int32_t rb, re, re2;  // dynamic: bounds of rows r and r + 1
  int32_t len0, len1;   // dynamic: top-k lengths of the part's first two rows (the producer's masks)

  __device__ __forceinline__ explicit PartIter(const Schedule& s) : sched(s) {}

  // false when this part has no work (uniform over the CTA). Dynamic: `entry` is part_'s entry as
  // loaded by load_part_entry (fixed: unused).
  __device__ __forceinline__ bool init(int32_t part_, [[maybe_unused]] const PartStart& entry) {
    part = part_;
    if constexpr (kDynamic) {
      const PartStart ps = sched.clamped(entry);
      if (part >= sched.np || sched.total <= 0) return false;
      g0 = ps.g0;
      g1 = ps.g1;
      r = ps.r;
      rb = ps.rb;
      re = ps.re;
      re2 = ps.re2;
      len0 = ps.len;
      len1 = ps.len2;
    } else {
      if (part >= sched.np || sched.total <= 0) return false;
      g0 = sched.begin(part);
      g1 = sched.begin(part + 1);
      r = sched.row_of_part(part);
    }
    if (g0 >= g1) return false;
    g = g0;
    return true;
  }

  __device__ __forceinline__ bool next(RowWork& w) {
    if (g >= g1) return false;
    if constexpr (!kDynamic) {
      rb = sched.prefix(r);
      re = sched.prefix(r + 1);
    }
    int32_t end = re < g1 ? re : g1;
    if constexpr (kDynamic) {
      if (end <= g) end = g + 1;  // corrupt row bounds: still one block of progress (no endless walk)
    }
    w.row = r < sched.rows ? r : sched.rows - 1;  // in range even for a corrupt dynamic plan
    // Not clamped: the consumers only count blocks, and must count exactly the producer's
    // g1 - g0 blocks; the producer treats a block >= K / 64 (corrupt metadata) as fully invalid.
    w.blk_begin = g - rb;
    w.blk_end = end - rb;
    w.split = !(rb >= g0 && re <= g1);
    w.slot = 2 * part + (rb <= g0 ? 0 : 1);  // first row of the part -> 2p, its last row -> 2p+1
    g = end;
    ++r;
    if constexpr (kDynamic) {
      rb = re;
      re = re2;
      re2 = sched.prefix(r + 2);  // r is now the next row: the end of the row after it
    }
    return true;
  }
};

}  // namespace selkv::decode::sm90
