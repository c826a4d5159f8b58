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
#include "common/fast_divmod.h"

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
  const int32_t* token_seq_lens = nullptr;  // optional per-row bound: positions >= it are -1
};

inline constexpr int kConvThreads = 256;
inline constexpr int kConvSub = kConvThreads * 4;  // entries per sub-chunk
inline constexpr int kConvChunk = 2 * kConvSub;    // entries per chunk

// kVec: rows, strides and topk allow int4 accesses (checked by the launcher).
// Position -> slot (-1 when invalid: request, position bound, block index or block id).
__device__ __forceinline__ int32_t conv_slot(const ConvertKernelParams& p, const int32_t* bt, bool req_ok,
                                             int32_t lim, int32_t pos) {
  int32_t slot = -1;
  if (req_ok && pos >= 0 && pos < lim) {
    uint32_t blk, off;
    p.page.divmod(uint32_t(pos), blk, off);
    if (blk < uint32_t(p.max_blocks)) {
      const int32_t bid = __ldg(bt + blk);
      if (bid >= 0 && bid < p.num_blocks) slot = int32_t(int64_t(bid) * p.page_size + off);
    }
  }
  return slot;
}

template <bool kVec>
__global__ void __launch_bounds__(kConvThreads) convert_indices_kernel(const ConvertKernelParams p) {
  __shared__ int32_t warp_sums[kConvThreads / 32];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int32_t r = __ldg(p.req_id + row);  // only rows < num_tokens are ever read
  const int32_t lim = p.token_seq_lens != nullptr ? __ldg(p.token_seq_lens + row) : INT32_MAX;
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
        const int32_t slot = conv_slot(p, bt, req_ok, lim, v[j][c]);
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

// ---- fast path: topk <= kConvChunk with int4 access (the engines' shapes) ---------------------
// Persistent CTAs walk rows row, row + gridDim.x, ... and load the next row's indices and request
// id before converting the current one (one memory latency per row hidden). Thread t owns entries
// [4t, 4t+4) and [1024+4t, 1024+4t+4), as above.
// Counts: warp sums, one barrier, thread 0 adds the 8 warp totals (double-buffered by row parity,
//   so the next row's warp sums never overwrite ones still being read).
// Compaction: warp scan of the packed (cnt0 | cnt1 << 16) counts by shuffles, warp totals through
//   shared memory (barrier 1), every valid slot written to its final place in a shared row buffer,
//   then (barrier 2) the whole row leaves as int4 stores, -1 past the valid count. In place is
//   safe: the row was read completely before barrier 1, and the global stores come after.
struct ConvRow {
  int4 x[2];
  int32_t r;
  int32_t lim;  // the row's position bound (INT32_MAX: none)
};

__device__ __forceinline__ void conv_load_row(const ConvertKernelParams& p, int64_t row, int tid, ConvRow& c) {
  c.r = __ldg(p.req_id + row);
  c.lim = p.token_seq_lens != nullptr ? __ldg(p.token_seq_lens + row) : INT32_MAX;
  const int32_t* in = p.in + row * p.in_stride;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int32_t e = j * kConvSub + 4 * tid;
    c.x[j] = make_int4(-1, -1, -1, -1);
    if (e < p.topk) c.x[j] = __ldcs(reinterpret_cast<const int4*>(in + e));
  }
}

template <bool kCount, bool kCompact>
__global__ void __launch_bounds__(kConvThreads) convert_rows_kernel(const ConvertKernelParams p,
                                                                    int64_t num_rows) {
  constexpr int kWarps = kConvThreads / 32;
  __shared__ int32_t warp_tot[2][kWarps];
  __shared__ __align__(16) int32_t buf[kCompact ? kConvChunk : 4];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  int64_t row = blockIdx.x;
  if (row >= num_rows) return;
  ConvRow cur;
  conv_load_row(p, row, tid, cur);
  for (int par = 0;; par ^= 1) {
    const int64_t next = row + gridDim.x;
    const bool more = next < num_rows;
    ConvRow nxt;
    if (more) conv_load_row(p, next, tid, nxt);

    const bool req_ok = cur.r >= 0 && cur.r < p.num_reqs;
    const int32_t* bt = p.block_table + (req_ok ? int64_t(cur.r) * p.bt_stride : 0);
    int32_t v[2][4];
    int32_t cnt[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int32_t x[4] = {cur.x[j].x, cur.x[j].y, cur.x[j].z, cur.x[j].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        v[j][c] = conv_slot(p, bt, req_ok, cur.lim, x[c]);
        cnt[j] += v[j][c] >= 0 ? 1 : 0;  // entries past topk were never loaded: -1
      }
    }
    int32_t* out = p.out + row * p.out_stride;
    if constexpr (!kCompact) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int32_t e = j * kConvSub + 4 * tid;
        if (e < p.topk) *reinterpret_cast<int4*>(out + e) = make_int4(v[j][0], v[j][1], v[j][2], v[j][3]);
      }
      if constexpr (kCount) {
        int32_t s = cnt[0] + cnt[1];
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
        if (lane == 0) warp_tot[par][warp] = s;
        __syncthreads();
        if (tid == 0) {
          int32_t total = 0;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) total += warp_tot[par][w];
          p.valid_counts[row] = total;
        }
      }
    } else {
      const int32_t packed = cnt[0] | (cnt[1] << 16);  // a half holds <= 1024 entries
      int32_t incl = packed;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int32_t n = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += n;
      }
      if (lane == 31) warp_tot[par][warp] = incl;
      __syncthreads();
      int32_t before = 0, all = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int32_t t = warp_tot[par][w];
        before += w < warp ? t : 0;
        all += t;
      }
      const int32_t ex = before + incl - packed;
      const int32_t total0 = all & 0xffff, total = total0 + (all >> 16);
      int32_t dst[2] = {ex & 0xffff, total0 + (ex >> 16)};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (v[j][c] >= 0) buf[dst[j]++] = v[j][c];
        }
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int32_t e = j * kConvSub + 4 * tid;
        if (e < p.topk) {
          int4 o = *reinterpret_cast<const int4*>(buf + e);
          if (e + 0 >= total) o.x = -1;
          if (e + 1 >= total) o.y = -1;
          if (e + 2 >= total) o.z = -1;
          if (e + 3 >= total) o.w = -1;
          *reinterpret_cast<int4*>(out + e) = o;
        }
      }
      if (kCount && tid == 0) p.valid_counts[row] = total;
    }
    if (!more) break;
    cur = nxt;
    row = next;
  }
}

}  // namespace selkv::cache
