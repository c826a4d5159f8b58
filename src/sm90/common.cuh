// Device primitives shared by the SM90 attention kernels (C5 decode, C7 prefill).
//
//   bf16x2_bits          two floats -> packed bf16x2 (RNE, exactly the oracle's rounding)
//   f16x2_bits           two floats -> packed fp16x2 (RNE)
//   named_bar_sync / named_bar_arrive  a kernel's named barrier (an enum id >= 1) among kThreads
//   exp2_ftz             2^x on MUFU.EX2, denormal results flushed to 0 (the softmax exponent)
//   cp_async_16          16-byte cp.async.cg global -> shared, zero-filled (no global read) when
//                        !valid
//   WGMMA accumulator fragment of m64nNk16 (f32), value i of thread (warp w, lane l) of the
//   warpgroup: row = 16 w + l / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cutlass/arch/barrier.h>

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

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // cvt.rn.bf16x2.f32: exact RNE, as the oracle
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t f16x2_bits(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);  // cvt.rn.f16x2.f32
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gptr, bool valid) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gptr),
               "r"(src_bytes)
               : "memory");
}

// 2^x on MUFU.EX2 with a denormal result flushed to +0 (what --use_fast_math makes of exp2f).
// Plain exp2f wraps the MUFU in a range test and two FMULs to produce denormal results; a softmax
// weight below 2^-126 of the row max never matters, and the hot loops run 32 of these per thread
// per 64-row block. exp2_ftz(-inf) = 0, as the online-softmax rescale needs.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace selkv::sm90
