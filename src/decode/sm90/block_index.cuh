// Walking a part block by block (the producer's index pipeline) and the record address of a slot
// index (producer-side helpers also used by the PV warpgroup's record prefetch).
#pragma once

#include <cstdint>

#include "decode/decode_params.h"
#include "decode/sm90/config.h"
#include "decode/sm90/part_iter.cuh"

namespace selkv::decode::sm90 {

// Walks (row, block) of the part in block order; identical in every CTA of a cluster.
template <class Schedule>
struct BlockCursor {
  Schedule sched;
  int32_t g, g1, row, row_begin, row_end;

  __device__ __forceinline__ explicit BlockCursor(const PartIter<Schedule>& it)
      : sched(it.sched), g(it.g0), g1(it.g1), row(it.r) {
    row_begin = sched.prefix(row);
    row_end = sched.prefix(row + 1);
  }
  __device__ __forceinline__ void advance() {
    ++g;
    while (g < g1 && g >= row_end) {
      ++row;
      row_begin = row_end;
      row_end = sched.prefix(row + 1);
    }
  }
};

// Record of a valid slot index (0 <= idx < num_slots); nullptr for anything else (never formed
// from an invalid index).
__device__ __forceinline__ const uint8_t* record_address(const DecodeKernelParams& p, int32_t idx) {
  if (!(idx >= 0 && int64_t(idx) < p.num_slots)) return nullptr;
  uint32_t blk_id, in_page;
  p.page.divmod(uint32_t(idx), blk_id, in_page);
  return p.cache + int64_t(blk_id) * p.block_stride_bytes + int64_t(in_page) * fmt::kDsMlaRecordBytes;
}

}  // namespace selkv::decode::sm90
