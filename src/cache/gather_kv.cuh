// C3 gather_kv_bf16 kernel: paged FP8 records -> dense bf16 rows, for requests with arbitrary
// (not page-aligned) starts, without a host sync.
//
// Flat-token mapping. Requests are concatenated into one flat token range using their
// *effective* lengths: only tokens whose output row lands in [0, out_rows) are counted (every
// other token would be skipped anyway, so trimming them up front changes nothing and bounds the
// work by num_reqs * out_rows whatever seq_lens hold). Each CTA builds the exclusive prefix of
// those lengths in shared memory (int64, num_reqs <= kMaxGatherReqs, checked by the launcher),
// then walks the flat range grid-stride; a token finds its request by binary search. The grid is
// sized from out_rows (an upper bound on the work when the output ranges are disjoint) and capped
// at one resident wave; the grid-stride loop makes the result independent of the grid size.
// Alternatives rejected: a host-side prefix (needs a sync), an out-row -> request search (needs
// sorted, disjoint ws_starts), a separate prefix kernel (one more launch and a workspace).
//
// Work split: a warp handles 4 tokens per step. Lanes 0-3 resolve the 4 tokens (search, block
// table) and broadcast (record offset, output row) by shuffle; then every lane issues all loads
// of the 4 records before converting: per token two 8-byte E4M3 loads (each covering 256
// contiguous bytes across the warp) and one 16-byte broadcast load of the 4 scales; lane l also
// loads 16 B of token l/8's RoPE. Stores are 16-byte and contiguous across the warp (lane l
// writes bf16 elements [8l, 8l+8) and [256+8l, 256+8l+8); RoPE 8 lanes x 16 B per token).
// A token whose block is missing gets zero codes and a zero scale: the same code path writes the
// zero row.
// model1_fp8 (448 codes): lanes 0-23 hold hi codes (elements 256 + 8l < 448); the scales are one
// 8-byte broadcast load of the token's UE8M0 bytes in its page's tail, whose offset the
// resolving lane computes and broadcasts next to the record's.
#pragma once

#include <cstdint>

#include "cache/block_scan.cuh"
#include "common/fast_divmod.h"
#include "formats/device_codec.cuh"
#include "selkv/formats.h"

namespace selkv::cache {

struct GatherKernelParams {
  const uint8_t* cache = nullptr;
  int64_t num_blocks = 0;
  int32_t page_size = 1;
  int64_t block_stride_bytes = 0;
  FastDivmod page;
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0;
  int32_t max_blocks = 0;
  const int32_t* seq_starts = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* ws_starts = nullptr;
  int32_t num_reqs = 0;
  uint8_t* out = nullptr;
  int64_t out_row_bytes = 0;
  int64_t out_rows = 0;
  int32_t chunk = 4;  // tokens per warp chunk: a multiple of 4 in [4, 32]
};

inline constexpr int kGatherThreads = 256;
inline constexpr int kGatherWarps = kGatherThreads / 32;
inline constexpr int kGatherBatch = 4;        // tokens whose loads a warp issues together
inline constexpr int kGatherMaxChunk = 32;    // tokens a warp resolves at once (one per lane)
inline constexpr int kGatherSmemReqs = 1024;  // up to this many requests, starts/ws live in smem

// Dynamic shared memory: int64 prefix [n + 1], then (n <= kGatherSmemReqs) int32 starts [n] and
// int32 ws [n].
__host__ __device__ inline size_t gather_smem_bytes(int n) {
  return size_t(n + 1) * sizeof(int64_t) + (n <= kGatherSmemReqs ? size_t(2 * n) * sizeof(int32_t) : 0);
}

// Output rows of request r that fall in [0, out_rows): i in [first, first + count).
__device__ __forceinline__ void gather_req_window(int64_t ws, int64_t len, int64_t out_rows,
                                                  int64_t* first, int64_t* count) {
  const int64_t lo = ws < 0 ? -ws : 0;
  const int64_t hi = len < out_rows - ws ? len : out_rows - ws;
  *first = lo;
  *count = hi > lo ? hi - lo : 0;
}

// One batch of kGatherBatch tokens held by every lane of a warp.
struct GatherBatch {
  uint2 lo[kGatherBatch], hi[kGatherBatch];
  float slo[kGatherBatch], shi[kGatherBatch];  // scales of this lane's two tiles
  uint4 rope;
};

// Token j of the batch is lane (first + j)'s resolved token.
// `ssrc`: the scale byte offset (model1_fp8 only; unused for the in-record formats).
template <class Fmt>
__device__ __forceinline__ void gather_load(const GatherKernelParams& p, int64_t src, int64_t ssrc, int first,
                                            int lane, GatherBatch& b) {
#pragma unroll
  for (int j = 0; j < kGatherBatch; ++j) {
    const int64_t ts = __shfl_sync(0xffffffffu, src, first + j);
    int64_t tss = 0;
    if constexpr (!Fmt::kScalesInRecord) tss = __shfl_sync(0xffffffffu, ssrc, first + j);
    b.lo[j] = make_uint2(0, 0);
    b.hi[j] = make_uint2(0, 0);
    b.slo[j] = 0.f;
    b.shi[j] = 0.f;
    if (ts >= 0) {
      const uint8_t* rec = p.cache + ts;
      b.lo[j] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 8 * lane);
      if constexpr (Fmt::kScalesInRecord) {
        b.hi[j] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
        // element 8*lane is in tile lane/16, element 256+8*lane in tile 2+lane/16
        const float* sc = reinterpret_cast<const float*>(rec + Fmt::kScaleOffset) + (lane >> 4);
        b.slo[j] = __ldg(sc);
        b.shi[j] = __ldg(sc + 2);
      } else {
        if (lane < dev::kHiLanes<Fmt>) b.hi[j] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
        dev::ue8m0_lane_scales(p.cache + tss, lane, b.slo[j], b.shi[j]);
      }
    }
  }
  b.rope = make_uint4(0, 0, 0, 0);
  if constexpr (Fmt::kHasRope) {
    const int64_t rsrc = __shfl_sync(0xffffffffu, src, first + (lane >> 3));
    if (rsrc >= 0) b.rope = dev::ld_nc_na_u4(p.cache + rsrc + Fmt::kRopeOffset + 16 * (lane & 7));
  }
}

// Output rows come from the resolving lanes again (shuffles are cheaper than holding them).
template <class Fmt>
__device__ __forceinline__ void gather_store(const GatherKernelParams& p, int64_t dst, int first,
                                             int lane, const GatherBatch& b) {
#pragma unroll
  for (int j = 0; j < kGatherBatch; ++j) {
    const int64_t td = __shfl_sync(0xffffffffu, dst, first + j);
    if (td < 0) continue;
    uint8_t* orow = p.out + td * p.out_row_bytes;
    dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(b.lo[j], b.slo[j]));
    if (dev::kHiLanes<Fmt> == 32 || lane < dev::kHiLanes<Fmt>) {
      dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(b.hi[j], b.shi[j]));
    }
  }
  const int64_t rope_dst = __shfl_sync(0xffffffffu, dst, first + (lane >> 3));
  if (Fmt::kHasRope && rope_dst >= 0) {
    dev::st_u4(p.out + rope_dst * p.out_row_bytes + 2 * Fmt::kNopeDim + 16 * (lane & 7), b.rope);
  }
}

template <class Fmt>
__global__ void __launch_bounds__(kGatherThreads) gather_kv_kernel(const GatherKernelParams p) {
  static_assert(dev::kWarpSplitFits<Fmt>, "record layout of the warp split");
  extern __shared__ int64_t prefix[];  // [num_reqs + 1], then starts / ws (see gather_smem_bytes)
  __shared__ int64_t warp_sums[kGatherWarps];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int n = p.num_reqs;
  const bool small = n <= kGatherSmemReqs;
  int32_t* s_start = reinterpret_cast<int32_t*>(prefix + n + 1);
  int32_t* s_ws = s_start + n;

  // ---- exclusive prefix of effective lengths; starts/ws are loaded in the same round trip ----
  if (n <= 32) {  // one warp, one barrier
    if (warp == 0) {
      int64_t count = 0;
      if (lane < n) {
        const int64_t ws = __ldg(p.ws_starts + lane);
        const int64_t len = __ldg(p.seq_lens + lane);
        const int32_t st = __ldg(p.seq_starts + lane);
        int64_t first;
        gather_req_window(ws, len, p.out_rows, &first, &count);
        s_start[lane] = st;
        s_ws[lane] = int32_t(ws);
      }
      int64_t incl = count;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      if (lane < n) prefix[lane] = incl - count;
      if (lane == 31) prefix[n] = incl;
    }
  } else {  // each thread a contiguous run of requests
    const int per = (n + kGatherThreads - 1) / kGatherThreads;
    const int r0 = min(tid * per, n), r1 = min(r0 + per, n);
    int64_t local = 0;
    for (int r = r0; r < r1; ++r) {
      const int64_t ws = __ldg(p.ws_starts + r);
      const int64_t len = __ldg(p.seq_lens + r);
      const int32_t st = __ldg(p.seq_starts + r);
      if (small) {
        s_start[r] = st;
        s_ws[r] = int32_t(ws);
      }
      int64_t first, count;
      gather_req_window(ws, len, p.out_rows, &first, &count);
      local += count;
    }
    int64_t total;
    int64_t acc = block_exclusive_sum<kGatherThreads>(local, warp_sums, &total);
    for (int r = r0; r < r1; ++r) {
      prefix[r] = acc;
      int64_t first, count;
      gather_req_window(__ldg(p.ws_starts + r), __ldg(p.seq_lens + r), p.out_rows, &first, &count);
      acc += count;
    }
    if (tid == 0) prefix[n] = total;
  }
  __syncthreads();
  const int64_t total = prefix[n];

  // ---- chunks of p.chunk flat tokens per warp (global warp g = warp * gridDim.x + blockIdx.x:
  //      a short range is spread over every CTA); lane i resolves chunk token i, then the warp
  //      walks the chunk kGatherBatch tokens at a time with the next batch's loads in flight ----
  const int chunk = p.chunk;
  const int64_t nw = int64_t(gridDim.x) * kGatherWarps;
  for (int64_t c = int64_t(warp) * gridDim.x + blockIdx.x; c * chunk < total; c += nw) {
    const int64_t f = c * chunk + lane;
    int64_t src = -1;  // record byte offset; -1: zero row
    int64_t ssrc = 0;  // model1_fp8: scale byte offset
    int64_t dst = -1;  // output row; -1: nothing to write
    if (lane < chunk && f < total) {
      int lo = 0, hi = n;  // prefix[lo] <= f < prefix[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (prefix[mid] <= f) lo = mid; else hi = mid;
      }
      const int r = lo;
      const int64_t ws = small ? int64_t(s_ws[r]) : int64_t(__ldg(p.ws_starts + r));
      const int64_t start = small ? int64_t(s_start[r]) : int64_t(__ldg(p.seq_starts + r));
      const int64_t i = (ws < 0 ? -ws : 0) + (f - prefix[r]);  // first row inside [0, out_rows)
      dst = ws + i;
      const int64_t pos = start + i;
      if (pos >= 0) {
        int64_t blk, off;
        if (pos <= int64_t(0x7fffffff)) {
          uint32_t q, m;
          p.page.divmod(uint32_t(pos), q, m);
          blk = q;
          off = m;
        } else {
          blk = pos / p.page_size;
          off = pos - blk * p.page_size;
        }
        if (blk < p.max_blocks) {
          const int64_t bid = __ldg(p.block_table + int64_t(r) * p.bt_stride + blk);
          if (bid >= 0 && bid < p.num_blocks) {
            src = bid * p.block_stride_bytes + Fmt::record_offset(off);
            if constexpr (!Fmt::kScalesInRecord) ssrc = bid * p.block_stride_bytes + Fmt::scale_offset(off, p.page_size);
          }
        }
      }
    }
    const int64_t left = total - c * chunk;
    const int valid = int(left < chunk ? left : chunk);
    GatherBatch cur;
    gather_load<Fmt>(p, src, ssrc, 0, lane, cur);
    int b = 0;
    for (; b + kGatherBatch < valid; b += kGatherBatch) {
      GatherBatch nxt;
      gather_load<Fmt>(p, src, ssrc, b + kGatherBatch, lane, nxt);
      gather_store<Fmt>(p, dst, b, lane, cur);
      cur = nxt;
    }
    gather_store<Fmt>(p, dst, b, lane, cur);
  }
}

}  // namespace selkv::cache
