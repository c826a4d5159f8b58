// Block-wide exclusive prefix sum over one value per thread (warp shuffles + one shared array of
// warp totals). Two __syncthreads; the caller provides kThreads / 32 ints of shared memory.
#pragma once

#include <cstdint>

namespace selkv::cache {

template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += n;
  }
  return v;
}

// Returns the exclusive prefix of v over threads [0, threadIdx.x); *total gets the block sum.
// Safe to call repeatedly with the same `warp_sums` buffer (the trailing barrier protects it).
template <int kThreads, typename T>
__device__ __forceinline__ T block_exclusive_sum(T v, T* warp_sums, T* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const T incl = warp_inclusive_sum(v);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  T before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {  // kWarps <= 32 broadcast reads: cheaper than a 2nd scan
    const T s = warp_sums[w];
    before += (w < warp) ? s : T(0);
    sum += s;
  }
  __syncthreads();
  *total = sum;
  return before + incl - v;
}

}  // namespace selkv::cache
