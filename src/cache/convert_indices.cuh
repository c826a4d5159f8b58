// C2 convert_req_indices_to_slots kernel: one 256-thread CTA per query row.
//
// A row is processed in chunks of 2048 entries; thread t owns entries [4t, 4t+4) and
// [1024+4t, 1024+4t+4) of the chunk, loaded as two int4 (both in flight before the block-table
// lookups). Compaction keeps the original order with ONE block scan per chunk: each thread
// packs its two 4-entry valid counts into the low/high 16 bits of one int (a sub-chunk holds at
// most 1024 entries, so the halves never carry into each other).
//
// In place (out_slots == req_local_indices, same stride) is safe: every entry of a chunk is read
// before the scan barrier and compacted writes land at or before the chunk's own entries.
#pragma once

#include <cstdint>

#include "cache/block_scan.cuh"
#include "cache/fast_divmod.h"

namespace selkv::cache {

struct ConvertKernelParams {
  const int32_t* in = nullptr;
  int64_t in_stride = 0;
  const int32_t* req_id = nullptr;
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0;
  int32_t num_reqs = 0;
  int32_t max_blocks = 0;
  int32_t topk = 0;
  int32_t page_size = 1;
  int64_t num_blocks = 0;
  FastDivmod page;
  int32_t* out = nullptr;
  int64_t out_stride = 0;
  int32_t* valid_counts = nullptr;
  bool compact = false;
};

inline constexpr int kConvThreads = 256;
inline constexpr int kConvSub = kConvThreads * 4;  // entries per sub-chunk
inline constexpr int kConvChunk = 2 * kConvSub;    // entries per chunk

// kVec: rows, strides and topk allow int4 accesses (checked by the launcher).
template <bool kVec>
__global__ void __launch_bounds__(kConvThreads) convert_indices_kernel(const ConvertKernelParams p) {
  __shared__ int32_t warp_sums[kConvThreads / 32];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int32_t r = __ldg(p.req_id + row);  // only rows < num_tokens are ever read
  const bool req_ok = r >= 0 && r < p.num_reqs;
  const int32_t* bt = p.block_table + (req_ok ? int64_t(r) * p.bt_stride : 0);
  const int32_t* in = p.in + row * p.in_stride;
  int32_t* out = p.out + row * p.out_stride;
  const bool need_count = p.compact || p.valid_counts != nullptr;

  int32_t running = 0;  // valid entries before the current chunk
  for (int32_t base = 0; base < p.topk; base += kConvChunk) {
    int32_t v[2][4];
    bool present[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int32_t e = base + j * kConvSub + 4 * tid;
      if (kVec) {
        const bool in_range = e < p.topk;  // topk % 4 == 0: all four or none
        int4 x = make_int4(-1, -1, -1, -1);
        if (in_range) x = __ldcs(reinterpret_cast<const int4*>(in + e));
        v[j][0] = x.x; v[j][1] = x.y; v[j][2] = x.z; v[j][3] = x.w;
#pragma unroll
        for (int c = 0; c < 4; ++c) present[j][c] = in_range;
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          present[j][c] = e + c < p.topk;
          v[j][c] = present[j][c] ? __ldcs(in + e + c) : -1;
        }
      }
    }
    // positions -> slots (-1 when invalid); the block-table loads are independent of each other.
    int32_t cnt[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int32_t pos = v[j][c];
        int32_t slot = -1;
        if (req_ok && pos >= 0) {
          uint32_t blk, off;
          p.page.divmod(uint32_t(pos), blk, off);
          if (blk < uint32_t(p.max_blocks)) {
            const int32_t bid = __ldg(bt + blk);
            if (bid >= 0 && bid < p.num_blocks) slot = int32_t(int64_t(bid) * p.page_size + off);
          }
        }
        v[j][c] = slot;
        cnt[j] += (present[j][c] && slot >= 0) ? 1 : 0;
      }
    }

    if (!p.compact) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int32_t e = base + j * kConvSub + 4 * tid;
        if (kVec) {
          if (present[j][0])
            *reinterpret_cast<int4*>(out + e) = make_int4(v[j][0], v[j][1], v[j][2], v[j][3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (present[j][c]) out[e + c] = v[j][c];
        }
      }
      if (need_count) {  // uniform branch
        int32_t total;
        block_exclusive_sum<kConvThreads>(cnt[0] + cnt[1], warp_sums, &total);
        running += total;
      }
    } else {
      int32_t total;
      const int32_t ex = block_exclusive_sum<kConvThreads>(cnt[0] | (cnt[1] << 16), warp_sums, &total);
      const int32_t total0 = total & 0xffff, total1 = total >> 16;
      int32_t dst[2] = {running + (ex & 0xffff), running + total0 + (ex >> 16)};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (present[j][c] && v[j][c] >= 0) out[dst[j]++] = v[j][c];
        }
      }
      running += total0 + total1;
    }
  }
  if (p.compact) {
    for (int32_t k = running + tid; k < p.topk; k += kConvThreads) out[k] = -1;
  }
  if (p.valid_counts != nullptr && tid == 0) p.valid_counts[row] = running;
}

}  // namespace selkv::cache
