// C4 selected-row dequant kernels (include/selkv/dequant.h).
//
// Two kernels, one per mode (the mode is picked on the host from the shapes):
//   selected (N < P): work item j in [0, N) is index entry (t, k) = (j / K, j % K); its validity
//     (DESIGN §2) decides whether workspace row j is written and what out_indices gets.
//     Rows come in batches of kR (4 or 8) consecutive entries, dealt to the warps round-robin
//     (batch b -> warp b % warps), so the grid always works on one contiguous window of the
//     workspace (a first version gave each warp 32 consecutive rows: 4096 scattered write
//     streams, 5% slower). A warp resolves 32 / kR of its batches at once, lane l one entry
//     (index load, validity, remapped index write, record offset), and issues the index loads
//     of its next such group before processing this one, so their latency is hidden. kPipe keeps
//     two batches in flight (the loads of batch i + 1 are issued before batch i is converted).
//   full pool (N >= P): a warp task is kR pool rows (slot = row) plus kR / 2 index units per lane
//     (a unit is kV = 4 entries as one 16-byte load and store when K and both row strides are
//     multiples of 4 and both pointers 16-byte aligned, else kV = 1). The index loads are issued
//     together with the record loads, so the index copy (out = valid ? slot : -1) streams
//     interleaved with the rows instead of in a second phase.
// Row batch (the C3 gather's proven pattern): per row every lane issues two 8-byte E4M3 loads
// (each 256 contiguous bytes across the warp) and two 4-byte scale loads (its two tiles); lane l
// also loads 16 B of RoPE of row 4i + l/8. Stores are 16-byte and contiguous across the warp
// (lane l writes elements [8l, 8l+8) and [256+8l, 256+8l+8), RoPE 8 lanes x 16 B per row).
// Grid: one resident wave (occupancy query), the tasks spread evenly over the warps
// (grid-stride, every warp gets the same number of tasks up to one).
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
  int64_t tasks = 0;       // selected: row batches; full pool: warp tasks (grid-stride over warps)
  int64_t idx_units = 0;   // full pool: N / kV index units
  int32_t cta_minor = 0;   // A/B: warp numbering w = warp * grid + block (else block * 8 + warp)
};


inline constexpr int kDequantThreads = 256;
inline constexpr int kDequantWarps = kDequantThreads / 32;
inline constexpr int kDequantRowsPerWarp = 4;   // v1 (A/B reference only)
inline constexpr int kDequantRowsPerStep = kDequantWarps * kDequantRowsPerWarp;  // v1

__device__ __forceinline__ int64_t dequant_warp_id(const DequantSelectedKernelParams& p) {
  const int warp = int(threadIdx.x) >> 5;
  return p.cta_minor ? int64_t(warp) * gridDim.x + blockIdx.x : int64_t(blockIdx.x) * kDequantWarps + warp;
}

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

// ---- row batches --------------------------------------------------------------------------------
// kR rows held by every lane of a warp; row r's record offset is lane (first + r)'s `src`.
template <int kR>
struct DequantBatch {
  uint2 lo[kR], hi[kR];
  float slo[kR], shi[kR];  // scales of this lane's two tiles
  uint4 rope[kR / 4];      // lane l: 16 B chunk l % 8 of row 4i + l / 8
};

// Record loads: L1 no-allocate (kEF = false) or evict-first streaming (ld.global.cs, kEF = true).
template <bool kEF>
__device__ __forceinline__ uint2 rec_ld_u2(const uint8_t* p) {
  if constexpr (kEF) return dev::ld_stream_u2(p);
  else return dev::ld_nc_na_u2(p);
}
template <bool kEF>
__device__ __forceinline__ uint4 rec_ld_u4(const uint8_t* p) {
  if constexpr (kEF) return dev::ld_stream_u4(p);
  else return dev::ld_nc_na_u4(p);
}

template <bool kRope, int kR, bool kEF>
__device__ __forceinline__ void batch_load(const DequantSelectedKernelParams& p, int64_t src,
                                           int first, int lane, DequantBatch<kR>& b) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t ts = __shfl_sync(0xffffffffu, src, first + r);
    b.lo[r] = make_uint2(0, 0);
    b.hi[r] = make_uint2(0, 0);
    b.slo[r] = 0.f;
    b.shi[r] = 0.f;
    if (ts >= 0) {
      const uint8_t* rec = p.cache + ts;
      b.lo[r] = rec_ld_u2<kEF>(rec + fmt::kNopeOffset + 8 * lane);
      b.hi[r] = rec_ld_u2<kEF>(rec + fmt::kNopeOffset + 256 + 8 * lane);
      // element 8*lane is in tile lane/16, element 256+8*lane in tile 2+lane/16
      const float* sc = reinterpret_cast<const float*>(rec + fmt::kScaleOffset) + (lane >> 4);
      b.slo[r] = __ldg(sc);
      b.shi[r] = __ldg(sc + 2);
    }
  }
  if constexpr (kRope) {
#pragma unroll
    for (int i = 0; i < kR / 4; ++i) {
      const int64_t rs = __shfl_sync(0xffffffffu, src, first + 4 * i + (lane >> 3));
      b.rope[i] = make_uint4(0, 0, 0, 0);
      if (rs >= 0) b.rope[i] = rec_ld_u4<kEF>(p.cache + rs + fmt::kRopeOffset + 16 * (lane & 7));
    }
  }
}

// Row r of the batch goes to workspace row row0 + r when bit r of `valid` is set.
template <bool kRope, int kR>
__device__ __forceinline__ void batch_store(const DequantSelectedKernelParams& p, int64_t row0,
                                            uint32_t valid, int lane, const DequantBatch<kR>& b) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (((valid >> r) & 1u) == 0) continue;
    uint8_t* orow = p.ws + (row0 + r) * p.ws_row_bytes;
    dev::st_u4(orow + 16 * lane, dev::dequant_e4m3x8(b.lo[r], b.slo[r]));
    dev::st_u4(orow + 512 + 16 * lane, dev::dequant_e4m3x8(b.hi[r], b.shi[r]));
  }
  if constexpr (kRope) {
#pragma unroll
    for (int i = 0; i < kR / 4; ++i) {
      const int r = 4 * i + (lane >> 3);
      if ((valid >> r) & 1u)
        dev::st_u4(p.ws + (row0 + r) * p.ws_row_bytes + 2 * fmt::kNopeDim + 16 * (lane & 7), b.rope[i]);
    }
  }
}

// ---- selected mode ------------------------------------------------------------------------------
// Entry e's slot when valid, else -1 (e < N).
__device__ __forceinline__ int32_t load_entry(const DequantSelectedKernelParams& p, int64_t e) {
  int64_t t;
  int32_t k;
  entry_tk(p, e, &t, &k);
  return entry_slot(p, t, k);
}

template <bool kRope, int kR, bool kPipe, bool kEF>
__global__ void __launch_bounds__(kDequantThreads)
dequant_selected_rows_kernel(const DequantSelectedKernelParams p) {
  static_assert(kR == 4 || kR == 8, "rows per batch");
  constexpr int kRecordBytes = kRope ? fmt::kDsMlaRecordBytes : fmt::kNopeRecordBytes;
  constexpr int kG = 32 / kR;  // batches a warp resolves at once: lane l -> batch l / kR, row l % kR
  const int lane = int(threadIdx.x) & 31;
  const int64_t nwarps = int64_t(gridDim.x) * kDequantWarps;
  const int64_t w = dequant_warp_id(p);
  // Batch i of the warp's group q is batch w + (q * kG + i) * nwarps (p.tasks batches of kR rows):
  // at any time the warps of the grid write one contiguous window of the workspace.
  const auto lane_row = [&](int64_t q) -> int64_t {
    const int64_t b = w + (q * kG + lane / kR) * nwarps;
    const int64_t j = b * kR + lane % kR;
    return (b < p.tasks && j < p.rows) ? j : -1;
  };

  int64_t jn = lane_row(0);
  int32_t s_next = jn >= 0 ? load_entry(p, jn) : -1;  // loaded one group ahead
  for (int64_t q = 0; w + q * kG * nwarps < p.tasks; ++q) {
    const int64_t j = jn;
    const int32_t s = s_next;
    jn = lane_row(q + 1);
    s_next = jn >= 0 ? load_entry(p, jn) : -1;
    int64_t src = -1;  // record byte offset; -1: row not written
    if (j >= 0) {
      int64_t t;
      int32_t k;
      entry_tk(p, j, &t, &k);
      p.out_idx[t * p.out_stride + k] = s >= 0 ? int32_t(j) : -1;
      if (s >= 0) src = slot_record_offset(p, s, kRecordBytes);
    }
    const uint32_t valid = __ballot_sync(0xffffffffu, src >= 0);
    if (valid == 0) continue;
    const int64_t b0 = w + q * kG * nwarps;  // row0 of batch i: (b0 + i * nwarps) * kR
    if constexpr (kPipe) {
      DequantBatch<kR> a, b;
      batch_load<kRope, kR, kEF>(p, src, 0, lane, a);
#pragma unroll
      for (int i = 0; i < kG; i += 2) {
        if (i + 1 < kG) batch_load<kRope, kR, kEF>(p, src, (i + 1) * kR, lane, b);
        batch_store<kRope, kR>(p, (b0 + i * nwarps) * kR, valid >> (i * kR), lane, a);
        if (i + 2 < kG) batch_load<kRope, kR, kEF>(p, src, (i + 2) * kR, lane, a);
        if (i + 1 < kG) batch_store<kRope, kR>(p, (b0 + (i + 1) * nwarps) * kR, valid >> ((i + 1) * kR), lane, b);
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < kG; ++i) {
        constexpr uint32_t kMask = (1u << kR) - 1u;
        if (((valid >> (i * kR)) & kMask) == 0) continue;  // warp-uniform
        DequantBatch<kR> a;
        batch_load<kRope, kR, kEF>(p, src, i * kR, lane, a);
        batch_store<kRope, kR>(p, (b0 + i * nwarps) * kR, valid >> (i * kR), lane, a);
      }
    }
  }
}

// ---- full-pool mode -----------------------------------------------------------------------------
template <int kV>
struct IndexVec {
  int32_t v[kV];
};

template <bool kRope, int kR, int kV, bool kEF>
__global__ void __launch_bounds__(kDequantThreads)
dequant_full_pool_kernel(const DequantSelectedKernelParams p) {
  static_assert(kR == 4 || kR == 8, "rows per batch");
  static_assert(kV == 1 || kV == 4, "index vector width");
  constexpr int kRecordBytes = kRope ? fmt::kDsMlaRecordBytes : fmt::kNopeRecordBytes;
  constexpr int kU = kR / 2;  // index units per lane per task (64 entries per row when kV = 4)
  const int lane = int(threadIdx.x) & 31;
  const int64_t nwarps = int64_t(gridDim.x) * kDequantWarps;
  for (int64_t task = dequant_warp_id(p); task < p.tasks; task += nwarps) {
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
    int64_t src = -1;
    if (lane < kR && row0 + lane < p.rows) src = slot_record_offset(p, int32_t(row0 + lane), kRecordBytes);
    const uint32_t valid = __ballot_sync(0xffffffffu, src >= 0);
    if (valid != 0) {
      DequantBatch<kR> a;
      batch_load<kRope, kR, kEF>(p, src, 0, lane, a);
      batch_store<kRope, kR>(p, row0, valid, lane, a);
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

// ---- v1 (previous kernel; temporary A/B reference, SELKV_C4_VARIANT=0) ----
template <bool kRope, bool kSelected>
__global__ void __launch_bounds__(kDequantThreads)
dequant_selected_kernel_v1(const DequantSelectedKernelParams p) {
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
