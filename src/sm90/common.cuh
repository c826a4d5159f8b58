// Device primitives shared by the SM90 attention kernels (C5 decode, C7 prefill).
//
//   named_bar_sync / named_bar_arrive  a kernel's named barrier (an enum id >= 1) among kThreads
//   the CUTLASS-free ones of sm90/device_ops.cuh (packing, exp2_ftz, cp.async)
//   WGMMA accumulator fragment of m64nNk16 (f32), value i of thread (warp w, lane l) of the
//   warpgroup: row = 16 w + l / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "sm90/device_ops.cuh"

namespace selkv::sm90 {

// Named barrier `id` among the kThreads threads that use it (ids start at 1: 0 is __syncthreads).
// sync waits for all of them; arrive counts this thread in and goes on.
template <uint32_t kThreads, class Id>
__device__ __forceinline__ void named_bar_sync(Id id) {
  cutlass::arch::NamedBarrier::sync(kThreads, uint32_t(id));
}
template <uint32_t kThreads, class Id>
__device__ __forceinline__ void named_bar_arrive(Id id) {
  cutlass::arch::NamedBarrier::arrive(kThreads, uint32_t(id));
}

}  // namespace selkv::sm90
