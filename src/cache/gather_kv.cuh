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
#pragma once

#include <cstdint>

#include "cache/block_scan.cuh"
#include "cache/fast_divmod.h"
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
};

inline constexpr int kGatherThreads = 256;
inline constexpr int kGatherTokensPerWarp = 4;
inline constexpr int kGatherTokensPerStep = (kGatherThreads / 32) * kGatherTokensPerWarp;  // 32

// Output rows of request r that fall in [0, out_rows): i in [first, first + count).
__device__ __forceinline__ void gather_req_window(const GatherKernelParams& p, int r,
                                                  int64_t* first, int64_t* count) {
  const int64_t ws = __ldg(p.ws_starts + r);
  const int64_t len = __ldg(p.seq_lens + r);
  const int64_t lo = ws < 0 ? -ws : 0;
  const int64_t hi = len < p.out_rows - ws ? len : p.out_rows - ws;
  *first = lo;
  *count = hi > lo ? hi - lo : 0;
}

template <bool kRope>
__global__ void __launch_bounds__(kGatherThreads) gather_kv_kernel(const GatherKernelParams p) {
  constexpr int kRecordBytes = kRope ? fmt::kDsMlaRecordBytes : fmt::kNopeRecordBytes;
  extern __shared__ int64_t prefix[];  // [num_reqs + 1]
  __shared__ int64_t warp_sums[kGatherThreads / 32];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int n = p.num_reqs;

  // ---- exclusive prefix of effective lengths (each thread a contiguous run of requests) ----
  const int per = (n + kGatherThreads - 1) / kGatherThreads;
  const int r0 = min(tid * per, n), r1 = min(r0 + per, n);
  int64_t local = 0;
  for (int r = r0; r < r1; ++r) {
    int64_t first, count;
    gather_req_window(p, r, &first, &count);
    local += count;
  }
  int64_t total;
  int64_t acc = block_exclusive_sum<kGatherThreads>(local, warp_sums, &total);
  for (int r = r0; r < r1; ++r) {
    prefix[r] = acc;
    int64_t first, count;
    gather_req_window(p, r, &first, &count);
    acc += count;
  }
  if (tid == 0) prefix[n] = total;
  __syncthreads();

  // ---- flat tokens, 32 per CTA step ----
  for (int64_t step = blockIdx.x; step * kGatherTokensPerStep < total; step += gridDim.x) {
    const int64_t f = step * kGatherTokensPerStep + warp * kGatherTokensPerWarp + lane;
    int64_t src = -1;  // record byte offset; -1: zero row
    int64_t dst = -1;  // output row; -1: nothing to write
    if (lane < kGatherTokensPerWarp && f < total) {
      int lo = 0, hi = n;  // prefix[lo] <= f < prefix[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (prefix[mid] <= f) lo = mid; else hi = mid;
      }
      const int r = lo;
      const int64_t ws = __ldg(p.ws_starts + r);  // the two loads are independent
      const int64_t start = __ldg(p.seq_starts + r);
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
          if (bid >= 0 && bid < p.num_blocks) src = bid * p.block_stride_bytes + off * kRecordBytes;
        }
      }
    }

    // Broadcast the 4 tokens; issue every load before the first conversion.
    int64_t tsrc[kGatherTokensPerWarp], tdst[kGatherTokensPerWarp];
    uint2 clo[kGatherTokensPerWarp], chi[kGatherTokensPerWarp];
    float4 sc[kGatherTokensPerWarp];
#pragma unroll
    for (int j = 0; j < kGatherTokensPerWarp; ++j) {
      tsrc[j] = __shfl_sync(0xffffffffu, src, j);
      tdst[j] = __shfl_sync(0xffffffffu, dst, j);
      clo[j] = make_uint2(0, 0);
      chi[j] = make_uint2(0, 0);
      sc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (tsrc[j] >= 0) {
        const uint8_t* rec = p.cache + tsrc[j];
        clo[j] = dev::ld_stream_u2(rec + fmt::kNopeOffset + 8 * lane);
        chi[j] = dev::ld_stream_u2(rec + fmt::kNopeOffset + 256 + 8 * lane);
        sc[j] = __ldg(reinterpret_cast<const float4*>(rec + fmt::kScaleOffset));
      }
    }
    uint4 rope = make_uint4(0, 0, 0, 0);
    int64_t rope_dst = -1;
    if constexpr (kRope) {
      const int64_t rsrc = __shfl_sync(0xffffffffu, src, lane >> 3);
      rope_dst = __shfl_sync(0xffffffffu, dst, lane >> 3);
      if (rsrc >= 0) rope = dev::ld_stream_u4(p.cache + rsrc + fmt::kRopeOffset + 16 * (lane & 7));
    }

#pragma unroll
    for (int j = 0; j < kGatherTokensPerWarp; ++j) {
      if (tdst[j] < 0) continue;
      uint8_t* orow = p.out + tdst[j] * p.out_row_bytes;
      const float s_lo = lane < 16 ? sc[j].x : sc[j].y;  // element 8*lane: tile lane/16
      const float s_hi = lane < 16 ? sc[j].z : sc[j].w;  // element 256+8*lane: tile 2+lane/16
      dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(clo[j], s_lo));
      dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(chi[j], s_hi));
    }
    if (kRope && rope_dst >= 0) {
      dev::st_u4(p.out + rope_dst * p.out_row_bytes + 2 * fmt::kNopeDim + 16 * (lane & 7), rope);
    }
  }
}

}  // namespace selkv::cache
