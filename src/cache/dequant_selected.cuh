// C4 selected-row dequant kernels (include/selkv/dequant.h). The mode is picked on the host from
// the shapes; one kernel per mode.
//
// Selected (N < P): work item j in [0, N) is index entry (t, k) = (j / K, j % K); its validity
// (DESIGN §2) decides whether workspace row j is written and what out_indices gets. A warp
// handles 4 rows per step, a CTA 32 consecutive rows, grid-stride over CTAs (grid up to 16 CTAs
// per SM, 4 resident: four waves). Lanes 0-3 resolve the 4 rows (index load, validity, remapped
// index write, record offset) and broadcast the offsets by shuffle; then every lane issues all
// loads of the 4 records before converting: per row two 8-byte E4M3 loads (each 256 contiguous
// bytes across the warp) and one 16-byte broadcast load of the 4 scales; lane l also loads 16 B
// of row l/8's RoPE. Stores are 16-byte and contiguous across the warp. More aggressive schedules
// (more record reads in flight) were slower on this random-read path: lower DRAM efficiency
// (docs/perf-log.md: C4 selected schedule).
//
// Full pool (N >= P): a warp task is 4 pool rows (slot = row, read sequentially) plus 2 index
// units per lane: a unit is 4 entries moved as one 16-byte load and store when K and both row
// strides are multiples of 4 and both pointers 16-byte aligned (else 1 entry). out = valid ?
// slot : -1. The index loads are issued together with the record loads, so the index copy
// streams interleaved with the rows instead of in a second phase. Tasks are dealt to the warps
// round-robin (the grid works on one contiguous window), one resident wave (occupancy query),
// every warp the same number of tasks up to one.
//
// model1_fp8 (448 codes, UE8M0 scales in the page tail): lanes 0-23 hold hi codes; a row's
// scales are one 8-byte broadcast load at the scale offset its resolving lane broadcasts next to
// the record offset.
#pragma once

#include <cstdint>

#include "common/fast_divmod.h"
#include "formats/device_codec.cuh"
#include "selkv/formats.h"

namespace selkv::cache {

struct DequantSelectedKernelParams {
  const uint8_t* cache = nullptr;
  int64_t num_slots = 0;  // P (<= 2^31)
  int64_t block_stride_bytes = 0;
  FastDivmod page;        // page_size
  int32_t page_size = 1;
  const int32_t* indices = nullptr;
  int64_t idx_stride = 0;
  const int32_t* topk_length = nullptr;
  int64_t num_tokens = 0;  // T
  int32_t topk = 1;        // K
  FastDivmod kdiv;         // K
  uint8_t* ws = nullptr;
  int64_t ws_row_bytes = 0;
  int64_t rows = 0;        // min(N, P): workspace rows written
  int64_t num_entries = 0; // N
  int32_t* out_idx = nullptr;
  int64_t out_stride = 0;
  int64_t tasks = 0;       // full pool: warp tasks (grid-stride over warps)
  int64_t idx_units = 0;   // full pool: N / kV index units
};

inline constexpr int kDequantThreads = 256;
inline constexpr int kDequantWarps = kDequantThreads / 32;
inline constexpr int kDequantRowsPerWarp = 4;                                     // selected
inline constexpr int kDequantRowsPerStep = kDequantWarps * kDequantRowsPerWarp;  // selected: 32
inline constexpr int kFullPoolRows = 4;   // full pool: rows per warp task
inline constexpr int kFullPoolUnits = 2;  // full pool: index units per lane per warp task

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

template <class Fmt>
__device__ __forceinline__ int64_t slot_record_offset(const DequantSelectedKernelParams& p, int32_t slot) {
  uint32_t blk, off;
  p.page.divmod(uint32_t(slot), blk, off);  // slot in [0, 2^31)
  return int64_t(blk) * p.block_stride_bytes + Fmt::record_offset(off);
}

// model1_fp8: byte offset of a slot's UE8M0 scales.
template <class Fmt>
__device__ __forceinline__ int64_t slot_scale_offset(const DequantSelectedKernelParams& p, int32_t slot) {
  uint32_t blk, off;
  p.page.divmod(uint32_t(slot), blk, off);
  return int64_t(blk) * p.block_stride_bytes + Fmt::scale_offset(off, p.page_size);
}

// ---- selected mode ------------------------------------------------------------------------------
template <class Fmt>
__global__ void __launch_bounds__(kDequantThreads)
dequant_selected_kernel(const DequantSelectedKernelParams p) {
  static_assert(dev::kWarpSplitFits<Fmt>, "record layout of the warp split");
  const int lane = int(threadIdx.x) & 31;
  const int warp = int(threadIdx.x) >> 5;

  for (int64_t step = blockIdx.x; step * kDequantRowsPerStep < p.rows; step += gridDim.x) {
    const int64_t j = step * kDequantRowsPerStep + warp * kDequantRowsPerWarp + lane;
    int64_t src = -1;  // record byte offset; -1: row not written
    int64_t ssrc = 0;  // model1_fp8: scale byte offset
    if (lane < kDequantRowsPerWarp && j < p.rows) {
      int64_t t;
      int32_t k;
      entry_tk(p, j, &t, &k);
      const int32_t s = entry_slot(p, t, k);
      p.out_idx[t * p.out_stride + k] = s >= 0 ? int32_t(j) : -1;
      if (s >= 0) {
        src = slot_record_offset<Fmt>(p, s);
        if constexpr (!Fmt::kScalesInRecord) ssrc = slot_scale_offset<Fmt>(p, s);
      }
    }
    int64_t tsrc[kDequantRowsPerWarp];
    uint2 clo[kDequantRowsPerWarp], chi[kDequantRowsPerWarp];
    float4 sc[kDequantRowsPerWarp];  // in-record fp32 scales; model1_fp8: (lo, hi) in .x, .y
#pragma unroll
    for (int r = 0; r < kDequantRowsPerWarp; ++r) {
      tsrc[r] = __shfl_sync(0xffffffffu, src, r);
      int64_t tss = 0;
      if constexpr (!Fmt::kScalesInRecord) tss = __shfl_sync(0xffffffffu, ssrc, r);
      clo[r] = make_uint2(0, 0);
      chi[r] = make_uint2(0, 0);
      sc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (tsrc[r] >= 0) {
        const uint8_t* rec = p.cache + tsrc[r];
        clo[r] = dev::ld_stream_u2(rec + Fmt::kNopeOffset + 8 * lane);
        if constexpr (Fmt::kScalesInRecord) {
          chi[r] = dev::ld_stream_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
          sc[r] = __ldg(reinterpret_cast<const float4*>(rec + Fmt::kScaleOffset));
        } else {
          if (lane < dev::kHiLanes<Fmt>) chi[r] = dev::ld_stream_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
          dev::ue8m0_lane_scales(p.cache + tss, lane, sc[r].x, sc[r].y);
        }
      }
    }
    uint4 rope = make_uint4(0, 0, 0, 0);
    int64_t rope_src = -1;
    if constexpr (Fmt::kHasRope) {
      rope_src = __shfl_sync(0xffffffffu, src, lane >> 3);
      if (rope_src >= 0) rope = dev::ld_stream_u4(p.cache + rope_src + Fmt::kRopeOffset + 16 * (lane & 7));
    }
    const int64_t j0 = step * kDequantRowsPerStep + warp * kDequantRowsPerWarp;
#pragma unroll
    for (int r = 0; r < kDequantRowsPerWarp; ++r) {
      if (tsrc[r] < 0) continue;
      uint8_t* orow = p.ws + (j0 + r) * p.ws_row_bytes;
      if constexpr (Fmt::kScalesInRecord) {
        const float s_lo = lane < 16 ? sc[r].x : sc[r].y;  // element 8*lane: tile lane/16
        const float s_hi = lane < 16 ? sc[r].z : sc[r].w;  // element 256+8*lane: tile 2+lane/16
        dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(clo[r], s_lo));
        dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(chi[r], s_hi));
      } else {
        dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(clo[r], sc[r].x));
        if (lane < dev::kHiLanes<Fmt>) dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(chi[r], sc[r].y));
      }
    }
    if (Fmt::kHasRope && rope_src >= 0) {
      dev::st_u4(p.ws + (j0 + (lane >> 3)) * p.ws_row_bytes + 2 * Fmt::kNopeDim + 16 * (lane & 7), rope);
    }
  }
}

// ---- row batches --------------------------------------------------------------------------------
// kR rows held by every lane of a warp; row r's record offset is lane (first + r)'s `src`.
template <int kR>
struct DequantBatch {
  uint2 lo[kR], hi[kR];
  float slo[kR], shi[kR];  // scales of this lane's two tiles
  uint4 rope[kR / 4];      // lane l: 16 B chunk l % 8 of row 4i + l / 8
};

// `ssrc`: scale byte offset (model1_fp8 only).
template <class Fmt, int kR>
__device__ __forceinline__ void batch_load(const DequantSelectedKernelParams& p, int64_t src, int64_t ssrc,
                                           int first, int lane, DequantBatch<kR>& b) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t ts = __shfl_sync(0xffffffffu, src, first + r);
    int64_t tss = 0;
    if constexpr (!Fmt::kScalesInRecord) tss = __shfl_sync(0xffffffffu, ssrc, first + r);
    b.lo[r] = make_uint2(0, 0);
    b.hi[r] = make_uint2(0, 0);
    b.slo[r] = 0.f;
    b.shi[r] = 0.f;
    if (ts >= 0) {
      const uint8_t* rec = p.cache + ts;
      b.lo[r] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 8 * lane);
      if constexpr (Fmt::kScalesInRecord) {
        b.hi[r] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
        // element 8*lane is in tile lane/16, element 256+8*lane in tile 2+lane/16
        const float* sc = reinterpret_cast<const float*>(rec + Fmt::kScaleOffset) + (lane >> 4);
        b.slo[r] = __ldg(sc);
        b.shi[r] = __ldg(sc + 2);
      } else {
        if (lane < dev::kHiLanes<Fmt>) b.hi[r] = dev::ld_nc_na_u2(rec + Fmt::kNopeOffset + 256 + 8 * lane);
        dev::ue8m0_lane_scales(p.cache + tss, lane, b.slo[r], b.shi[r]);
      }
    }
  }
  if constexpr (Fmt::kHasRope) {
#pragma unroll
    for (int i = 0; i < kR / 4; ++i) {
      const int64_t rs = __shfl_sync(0xffffffffu, src, first + 4 * i + (lane >> 3));
      b.rope[i] = make_uint4(0, 0, 0, 0);
      if (rs >= 0) b.rope[i] = dev::ld_nc_na_u4(p.cache + rs + Fmt::kRopeOffset + 16 * (lane & 7));
    }
  }
}

// Row r of the batch goes to workspace row row0 + r when bit r of `valid` is set.
template <class Fmt, int kR>
__device__ __forceinline__ void batch_store(const DequantSelectedKernelParams& p, int64_t row0,
                                            uint32_t valid, int lane, const DequantBatch<kR>& b) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (((valid >> r) & 1u) == 0) continue;
    uint8_t* orow = p.ws + (row0 + r) * p.ws_row_bytes;
    dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(b.lo[r], b.slo[r]));
    if (dev::kHiLanes<Fmt> == 32 || lane < dev::kHiLanes<Fmt>) {
      dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(b.hi[r], b.shi[r]));
    }
  }
  if constexpr (Fmt::kHasRope) {
#pragma unroll
    for (int i = 0; i < kR / 4; ++i) {
      const int r = 4 * i + (lane >> 3);
      if ((valid >> r) & 1u)
        dev::st_u4(p.ws + (row0 + r) * p.ws_row_bytes + 2 * Fmt::kNopeDim + 16 * (lane & 7), b.rope[i]);
    }
  }
}

// ---- full-pool mode -----------------------------------------------------------------------------
template <int kV>
struct IndexVec {
  int32_t v[kV];
};

template <class Fmt, int kV>
__global__ void __launch_bounds__(kDequantThreads)
dequant_full_pool_kernel(const DequantSelectedKernelParams p) {
  static_assert(dev::kWarpSplitFits<Fmt>, "record layout of the warp split");
  constexpr int kR = kFullPoolRows;
  static_assert(kV == 1 || kV == 4, "index vector width");
  constexpr int kU = kFullPoolUnits;  // index units per lane per task
  const int lane = int(threadIdx.x) & 31;
  const int64_t nwarps = int64_t(gridDim.x) * kDequantWarps;
  for (int64_t task = int64_t(blockIdx.x) * kDequantWarps + (int(threadIdx.x) >> 5); task < p.tasks;
       task += nwarps) {
    // Index units: all loads first (topk_length and the slots are independent loads).
    IndexVec<kV> iv[kU];
    int64_t t[kU];
    int32_t k[kU], len[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t unit = (task * kU + u) * 32 + lane;
      t[u] = -1;
      if (unit < p.idx_units) {
        entry_tk(p, unit * kV, &t[u], &k[u]);
        const int32_t* in = p.indices + t[u] * p.idx_stride + k[u];  // plain loads: in place allowed
        if constexpr (kV == 4) {
          const int4 q = *reinterpret_cast<const int4*>(in);
          iv[u].v[0] = q.x;
          iv[u].v[1] = q.y;
          iv[u].v[2] = q.z;
          iv[u].v[3] = q.w;
        } else {
          iv[u].v[0] = *in;
        }
        len[u] = p.topk_length != nullptr ? __ldg(p.topk_length + t[u]) : 0x7fffffff;
      }
    }
    // Rows [kR * task, kR * task + kR): lane r < kR resolves row kR * task + r.
    const int64_t row0 = task * kR;
    int64_t src = -1, ssrc = 0;
    if (lane < kR && row0 + lane < p.rows) {
      src = slot_record_offset<Fmt>(p, int32_t(row0 + lane));
      if constexpr (!Fmt::kScalesInRecord) ssrc = slot_scale_offset<Fmt>(p, int32_t(row0 + lane));
    }
    const uint32_t valid = __ballot_sync(0xffffffffu, src >= 0);
    if (valid != 0) {
      DequantBatch<kR> a;
      batch_load<Fmt, kR>(p, src, ssrc, 0, lane, a);
      batch_store<Fmt, kR>(p, row0, valid, lane, a);
    }
    // Index writes: valid ? slot : -1 (DESIGN §2: k < topk_length[t] and 0 <= slot < P).
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (t[u] < 0) continue;
      IndexVec<kV> o;
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        const int32_t s = iv[u].v[i];
        o.v[i] = (k[u] + i < len[u] && s >= 0 && int64_t(s) < p.num_slots) ? s : -1;
      }
      int32_t* out = p.out_idx + t[u] * p.out_stride + k[u];
      if constexpr (kV == 4) {
        *reinterpret_cast<int4*>(out) = make_int4(o.v[0], o.v[1], o.v[2], o.v[3]);
      } else {
        *out = o.v[0];
      }
    }
  }
}

}  // namespace selkv::cache
