// C4 selected-row dequant kernel (include/selkv/dequant.h).
//
// One kernel, two compile-time modes:
//   kSelected: work item j in [0, N) is index entry (t, k) = (j / K, j % K); its validity
//              (DESIGN §2) decides whether workspace row j is written and what out_indices gets.
//   full pool: work item j in [0, P) is slot j; then a second grid-stride phase copies the
//              indices (invalid -> -1).
// Row work split (the C3 gather's proven pattern): a warp handles 4 rows per step. Lanes 0-3
// resolve the 4 rows (index load, validity, record offset, index write) and broadcast the record
// offsets by shuffle; then every lane issues all loads of the 4 records before converting: per
// row two 8-byte E4M3 loads (each 256 contiguous bytes across the warp) and one 16-byte
// broadcast load of the 4 scales; lane l also loads 16 B of row l/8's RoPE. Stores are 16-byte
// and contiguous across the warp. With 8 warps/CTA and several CTAs per SM, ~100+ KB of loads
// are in flight per SM, enough to cover DRAM latency at full bandwidth.
#pragma once

#include <cstdint>

#include "cache/fast_divmod.h"
#include "formats/device_codec.cuh"
#include "selkv/formats.h"

namespace selkv::cache {

struct DequantSelectedKernelParams {
  const uint8_t* cache = nullptr;
  int64_t num_slots = 0;  // P (<= 2^31)
  int64_t block_stride_bytes = 0;
  FastDivmod page;        // page_size
  const int32_t* indices = nullptr;
  int64_t idx_stride = 0;
  const int32_t* topk_length = nullptr;
  int64_t num_tokens = 0;  // T
  int32_t topk = 1;        // K
  FastDivmod kdiv;         // K
  uint8_t* ws = nullptr;
  int64_t ws_row_bytes = 0;
  int64_t rows = 0;        // min(N, P): work items of the row phase
  int64_t num_entries = 0; // N
  int32_t* out_idx = nullptr;
  int64_t out_stride = 0;
};

inline constexpr int kDequantThreads = 256;
inline constexpr int kDequantRowsPerWarp = 4;
inline constexpr int kDequantRowsPerStep = (kDequantThreads / 32) * kDequantRowsPerWarp;  // 32

// (t, k) of a flat entry e in [0, N).
__device__ __forceinline__ void entry_tk(const DequantSelectedKernelParams& p, int64_t e,
                                         int64_t* t, int32_t* k) {
  if (e <= int64_t(0x7fffffff)) {
    uint32_t q, r;
    p.kdiv.divmod(uint32_t(e), q, r);
    *t = q;
    *k = int32_t(r);
  } else {
    *t = e / p.topk;
    *k = int32_t(e - *t * p.topk);
  }
}

// Validity of entry (t, k) per DESIGN §2; the slot is only loaded inside the length window.
__device__ __forceinline__ int32_t entry_slot(const DequantSelectedKernelParams& p, int64_t t,
                                              int32_t k) {
  if (p.topk_length != nullptr) {
    const int32_t len = __ldg(p.topk_length + t);
    if (k >= len) return -1;  // len < 0 also lands here (k >= 0)
  }
  const int32_t s = p.indices[t * p.idx_stride + k];  // plain load: in-place calls alias out_idx
  return (s >= 0 && int64_t(s) < p.num_slots) ? s : -1;
}

__device__ __forceinline__ int64_t slot_record_offset(const DequantSelectedKernelParams& p,
                                                      int32_t slot, int record_bytes) {
  uint32_t blk, off;
  p.page.divmod(uint32_t(slot), blk, off);  // slot in [0, 2^31)
  return int64_t(blk) * p.block_stride_bytes + int64_t(off) * record_bytes;
}

template <bool kRope, bool kSelected>
__global__ void __launch_bounds__(kDequantThreads)
dequant_selected_kernel(const DequantSelectedKernelParams p) {
  constexpr int kRecordBytes = kRope ? fmt::kDsMlaRecordBytes : fmt::kNopeRecordBytes;
  const int lane = int(threadIdx.x) & 31;
  const int warp = int(threadIdx.x) >> 5;

  // ---- row phase ----
  for (int64_t step = blockIdx.x; step * kDequantRowsPerStep < p.rows; step += gridDim.x) {
    const int64_t j = step * kDequantRowsPerStep + warp * kDequantRowsPerWarp + lane;
    int64_t src = -1;  // record byte offset; -1: row not written
    if (lane < kDequantRowsPerWarp && j < p.rows) {
      if constexpr (kSelected) {
        int64_t t;
        int32_t k;
        entry_tk(p, j, &t, &k);
        const int32_t s = entry_slot(p, t, k);
        p.out_idx[t * p.out_stride + k] = s >= 0 ? int32_t(j) : -1;
        if (s >= 0) src = slot_record_offset(p, s, kRecordBytes);
      } else {
        src = slot_record_offset(p, int32_t(j), kRecordBytes);
      }
    }
    int64_t tsrc[kDequantRowsPerWarp];
    uint2 clo[kDequantRowsPerWarp], chi[kDequantRowsPerWarp];
    float4 sc[kDequantRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kDequantRowsPerWarp; ++r) {
      tsrc[r] = __shfl_sync(0xffffffffu, src, r);
      clo[r] = make_uint2(0, 0);
      chi[r] = make_uint2(0, 0);
      sc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (tsrc[r] >= 0) {
        const uint8_t* rec = p.cache + tsrc[r];
        clo[r] = dev::ld_stream_u2(rec + fmt::kNopeOffset + 8 * lane);
        chi[r] = dev::ld_stream_u2(rec + fmt::kNopeOffset + 256 + 8 * lane);
        sc[r] = __ldg(reinterpret_cast<const float4*>(rec + fmt::kScaleOffset));
      }
    }
    uint4 rope = make_uint4(0, 0, 0, 0);
    int64_t rope_src = -1;
    if constexpr (kRope) {
      rope_src = __shfl_sync(0xffffffffu, src, lane >> 3);
      if (rope_src >= 0) rope = dev::ld_stream_u4(p.cache + rope_src + fmt::kRopeOffset + 16 * (lane & 7));
    }
    const int64_t j0 = step * kDequantRowsPerStep + warp * kDequantRowsPerWarp;
#pragma unroll
    for (int r = 0; r < kDequantRowsPerWarp; ++r) {
      if (tsrc[r] < 0) continue;
      uint8_t* orow = p.ws + (j0 + r) * p.ws_row_bytes;
      const float s_lo = lane < 16 ? sc[r].x : sc[r].y;  // element 8*lane: tile lane/16
      const float s_hi = lane < 16 ? sc[r].z : sc[r].w;  // element 256+8*lane: tile 2+lane/16
      dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(clo[r], s_lo));
      dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(chi[r], s_hi));
    }
    if (kRope && rope_src >= 0) {
      dev::st_u4(p.ws + (j0 + (lane >> 3)) * p.ws_row_bytes + 2 * fmt::kNopeDim + 16 * (lane & 7), rope);
    }
  }

  // ---- index phase (full pool only): out = valid ? slot : -1, 4 entries in flight per thread ----
  if constexpr (!kSelected) {
    const int64_t nthreads = int64_t(gridDim.x) * kDequantThreads;
    const int64_t tid = int64_t(blockIdx.x) * kDequantThreads + threadIdx.x;
    for (int64_t e0 = tid; e0 < p.num_entries; e0 += 4 * nthreads) {
      int32_t s[4];
      int64_t t[4];
      int32_t k[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t e = e0 + u * nthreads;
        s[u] = -1;
        if (e < p.num_entries) {
          entry_tk(p, e, &t[u], &k[u]);
          s[u] = entry_slot(p, t[u], k[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (e0 + u * nthreads < p.num_entries) p.out_idx[t[u] * p.out_stride + k[u]] = s[u];
      }
    }
  }
}

}  // namespace selkv::cache
