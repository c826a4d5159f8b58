// Device primitives of the SM90 kernels that need no CUTLASS (the QSA page-4 kernel is built
// without it too); sm90/common.cuh adds the rest.
//
//   bf16x2_bits          two floats -> packed bf16x2 (RNE, exactly the oracle's rounding)
//   f16x2_bits           two floats -> packed fp16x2 (RNE)
//   exp2_ftz             2^x on MUFU.EX2, denormal results flushed to 0 (the softmax exponent)
//   cp_async_16          16-byte cp.async.cg global -> shared, zero-filled (no global read) when
//                        !valid
//   cp_async_8           8-byte cp.async.ca global -> shared
//   cp_async_commit / cp_async_wait_group<N> / cp_async_wait_all  this thread's cp.async groups
//   cp_async_arrive      an mbarrier arrival once this thread's earlier cp.async copies land
//   smem_addr            a shared-memory pointer as a 32-bit shared address
//   mbar_init / mbar_arrive / mbar_wait   mbarrier phases (shared::cta); fence_mbarrier_init
//                        makes initialized barriers visible to the async proxy; <true>: .relaxed
//                        (a signal of issue order with no memory ordering)
//   fence_proxy_async    generic-proxy shared-memory accesses before async-proxy ones (wgmma reads)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace selkv::sm90 {

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

__device__ __forceinline__ void cp_async_8(uint32_t smem_addr, const void* gptr) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr), "l"(gptr) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// This thread's cp.async groups except the newest N have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// One arrival on the barrier once this thread's earlier cp.async copies have landed (counts
// against the barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

template <bool kRelaxed = false>
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  if constexpr (kRelaxed) asm volatile("mbarrier.arrive.relaxed.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
  else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits for the barrier's phase `parity` to complete.
template <bool kRelaxed = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  // The two forms differ in the semantics qualifier only (asm needs a literal: a local macro).
#define SELKV_MBAR_TRY_WAIT(SEM)                                                  \
  asm volatile(                                                                   \
      "{\n.reg .pred p;\nmbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\n" \
      "selp.u32 %0, 1, 0, p;\n}\n"                                                 \
      : "=r"(done)                                                                \
      : "r"(bar), "r"(parity)                                                     \
      : "memory")
  uint32_t done = 0;
  do {
    if constexpr (kRelaxed) SELKV_MBAR_TRY_WAIT(".relaxed.cta");
    else SELKV_MBAR_TRY_WAIT("");
  } while (done == 0);
#undef SELKV_MBAR_TRY_WAIT
}

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace selkv::sm90
