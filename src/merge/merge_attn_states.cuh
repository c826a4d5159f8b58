// C9 merge_attn_states kernel (selkv/merge.h): memory-bound, one group of L lanes per (t, h) row.
//
// L = the power of two >= V / kChunks (V = the row's 16-byte vectors), at most 32, so a lane
// usually holds all its columns in one step and a warp holds 32 / L rows. Each lane reads the row's N lses (the same
// addresses across the group: one transaction), then, per step, the 16-byte vectors of kChunks
// of its columns from every shard before any math, so N * kChunks loads are in flight per lane
// (the op is bandwidth-bound; with few shards one lane takes several columns). Empty shards are
// read but their values never enter the sum (a select, not w * x: their out may hold NaN).
// Sums run in shard order in fp32: the result does not depend on the grid.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/fast_divmod.h"
#include "selkv/merge.h"

namespace selkv::merge {

inline constexpr int kMergeThreads = 256;

struct MergeKernelParams {
  const uint8_t* outs[kMaxMergeShards];
  const float* lses[kMaxMergeShards];
  int32_t n;
  uint32_t rows;            // T * H < 2^31
  FastDivmod heads;         // row -> (t, h)
  int32_t vecs;             // 16-byte vectors per row: D * elem / 16
  int32_t lane_bits;        // log2 L
  int64_t in_t, in_h;       // bytes
  int64_t lin_t, lin_h;     // elements (fp32)
  uint8_t* out;
  int64_t out_t, out_h;     // bytes
  float* lse;
  int64_t lse_t, lse_h;     // elements
  bool pos_inf_is_empty;
};

// 16 bytes of T <-> floats. The 16-bit types share one body over their pair type (P: the pair
// type and its two conversions).
template <typename T>
struct Vec;
template <class P>
struct PairVec {
  static constexpr int kElems = 8;
  __device__ static void to_float(const uint4& v, float* f) {
    const typename P::T2* h = reinterpret_cast<const typename P::T2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = P::to_float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
  __device__ static uint4 from_float(const float* f) {
    uint4 v;
    typename P::T2* h = reinterpret_cast<typename P::T2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = P::from_floats(f[2 * i], f[2 * i + 1]);
    return v;
  }
};
struct Bf16Pair {
  using T2 = __nv_bfloat162;
  __device__ static float2 to_float2(T2 h) { return __bfloat1622float2(h); }
  __device__ static T2 from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
struct HalfPair {
  using T2 = __half2;
  __device__ static float2 to_float2(T2 h) { return __half22float2(h); }
  __device__ static T2 from_floats(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Vec<__nv_bfloat16> : PairVec<Bf16Pair> {};
template <>
struct Vec<__half> : PairVec<HalfPair> {};
template <>
struct Vec<float> {
  static constexpr int kElems = 4;
  __device__ static void to_float(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 from_float(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  }
};

// kMaxN: shard-count bucket (n <= kMaxN); kChunks: columns per lane per step; kMinCtas: CTAs
// per SM the registers must allow (occupancy is what keeps enough bytes in flight).
template <typename T, int kMaxN, int kChunks, int kMinCtas>
__global__ void __launch_bounds__(kMergeThreads, kMinCtas) merge_attn_states_kernel(const MergeKernelParams p) {
  constexpr int E = Vec<T>::kElems;
  const int L = 1 << p.lane_bits;
  const int lane = threadIdx.x & (L - 1);
  const uint32_t groups_per_cta = kMergeThreads >> p.lane_bits;
  const uint32_t stride = gridDim.x * groups_per_cta;
  for (uint32_t row = blockIdx.x * groups_per_cta + (threadIdx.x >> p.lane_bits); row < p.rows;
       row += stride) {
    uint32_t t, h;
    p.heads.divmod(row, t, h);
    const int64_t lse_off = int64_t(t) * p.lin_t + int64_t(h) * p.lin_h;
    const int64_t in_off = int64_t(t) * p.in_t + int64_t(h) * p.in_h;

    float l[kMaxN];
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) l[i] = i < p.n ? __ldg(p.lses[i] + lse_off) : -INFINITY;

    // The first step's vectors are loaded before the weights need the lses, so both loads are in
    // flight together (in-order issue would otherwise wait for the lses first).
    uint4 v[kMaxN][kChunks];
    auto load_step = [&](int c0) {
#pragma unroll
      for (int i = 0; i < kMaxN; ++i) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int col = c0 + c * L;
          if (i < p.n && col < p.vecs)
            v[i][c] = __ldcs(reinterpret_cast<const uint4*>(p.outs[i] + in_off + int64_t(col) * 16));
        }
      }
    };
    load_step(lane);

    // Row state: NaN sticky; first +inf wins (unless +inf means empty); else the finite max.
    bool any_nan = false;
    int pos_inf = -1;
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      if (p.pos_inf_is_empty && l[i] == INFINITY) l[i] = -INFINITY;
      if (l[i] != l[i]) any_nan = true;
      else if (l[i] == INFINITY) { if (pos_inf < 0) pos_inf = i; }
      else m = fmaxf(m, l[i]);
    }
    // w[i] = 0 marks an empty shard only through `live`; a finite shard's w may underflow to 0
    // and still multiply (w * NaN stays NaN, as in the oracle).
    float w[kMaxN];
    uint32_t live = 0;  // bit i: shard i is not empty (a mask, not an array: fewer registers)
    float wsum = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      const bool li = l[i] != -INFINITY;
      live |= uint32_t(li) << i;
      w[i] = li ? expf(l[i] - m) : 0.f;
      wsum += w[i];
    }
    // 0 all-empty, 1 NaN, 2 +inf copy, 3 weighted sum.
    const int mode = any_nan ? 1 : pos_inf >= 0 ? 2 : m == -INFINITY ? 0 : 3;
    const float inv = 1.f / wsum;

    uint8_t* out_row = p.out + int64_t(t) * p.out_t + int64_t(h) * p.out_h;
    for (int c0 = lane; c0 < p.vecs; c0 += L * kChunks) {
      if (c0 != lane) load_step(c0);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int col = c0 + c * L;
        if (col >= p.vecs) break;
        float acc[E];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = mode == 1 ? NAN : 0.f;
        if (mode == 3) {
#pragma unroll
          for (int i = 0; i < kMaxN; ++i) {
            if ((live >> i) & 1u) {
              float x[E];
              Vec<T>::to_float(v[i][c], x);
#pragma unroll
              for (int e = 0; e < E; ++e) acc[e] = fmaf(w[i], x[e], acc[e]);
            }
          }
#pragma unroll
          for (int e = 0; e < E; ++e) acc[e] *= inv;
        } else if (mode == 2) {
#pragma unroll
          for (int i = 0; i < kMaxN; ++i)
            if (i == pos_inf) Vec<T>::to_float(v[i][c], acc);
        }
        *reinterpret_cast<uint4*>(out_row + int64_t(col) * 16) = Vec<T>::from_float(acc);
      }
    }
    if (p.lse != nullptr && lane == 0) {
      const float r = mode == 0 ? -INFINITY : mode == 1 ? NAN : mode == 2 ? INFINITY : m + logf(wsum);
      p.lse[int64_t(t) * p.lse_t + int64_t(h) * p.lse_h] = r;
    }
  }
}

}  // namespace selkv::merge
