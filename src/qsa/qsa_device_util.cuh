// Device helpers the C8 attention kernels share: the 2-byte element types' packing (fp16 / bf16
// <-> fp32), warp reductions and the simple kernel's global -> shared slice copies. Nothing newer
// than SM70 is required: the copies are asynchronous (cp.async) from SM80 and plain below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "sm90/device_ops.cuh"  // cp.async copies and groups (emitted only from SM80)

namespace selkv::qsa {

template <typename T>
struct Elem;

template <>
struct Elem<__half> {
  static constexpr uint32_t kExp = 0x7C00u;  // exponent bits: all set = Inf or NaN
  static __device__ __forceinline__ float2 unpack(uint32_t w) {
    __half2 h;
    memcpy(&h, &w, 4);
    return __half22float2(h);
  }
  static __device__ __forceinline__ uint16_t bits(float a) { return __half_as_ushort(__float2half_rn(a)); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const __half2 h = __halves2half2(__float2half_rn(a), __float2half_rn(b));
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
  }
};

template <>
struct Elem<__nv_bfloat16> {
  static constexpr uint32_t kExp = 0x7F80u;
  // bf16 -> fp32 is exact (the upper half of the float); the pack rounds to nearest even.
  static __device__ __forceinline__ float2 unpack(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  }
  static __device__ __forceinline__ uint16_t bits(float a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const __nv_bfloat16 x = __float2bfloat16_rn(a), y = __float2bfloat16_rn(b);
    uint16_t lo, hi;
    memcpy(&lo, &x, 2);
    memcpy(&hi, &y, 2);
    return uint32_t(lo) | (uint32_t(hi) << 16);
  }
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  return x;
}

// 16 bytes from global to shared memory, zeros when !valid (src is never read then). From SM80
// sm90/device_ops.cuh's cp.async copy: it lands at copies_wait, overlapping whatever the thread does
// meanwhile; below SM80 a load and a store (read-only data: the compiler may issue a batch's loads
// before its stores).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  selkv::sm90::cp_async_16(uint32_t(__cvta_generic_to_shared(dst)), src, valid);
#else
  *static_cast<uint4*>(dst) = valid ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

// Closes this thread's batch of copies (a cp.async group; nothing below SM80).
__device__ __forceinline__ void copies_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  selkv::sm90::cp_async_commit();
#endif
}

// This thread's batches except the newest kPending have landed (visible to the warp after a
// __syncwarp).
template <int kPending>
__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  selkv::sm90::cp_async_wait_group<kPending>();
#endif
}

// Whole K / V rows by the bulk-copy engine (SM90): a row is one cp.async.bulk of contiguous bytes
// into shared memory, completing on an mbarrier. A warp's 16-byte cp.async copies land in shared
// rows whose padding offsets them from 128-byte lines, which splits the lines' L2 requests (half
// again as many sectors as bytes); the bulk engine reads whole lines whatever the destination.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kBulkRows = true;
#else
inline constexpr bool kBulkRows = false;
#endif

__device__ __forceinline__ void row_bar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(uint32_t(__cvta_generic_to_shared(bar))) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One thread: the barrier's next phase completes when `bytes` have landed.
__device__ __forceinline__ void row_bar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(uint32_t(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
#endif
}

// Orders this thread's earlier shared-memory accesses before bulk copies it issues next.
__device__ __forceinline__ void row_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void copy_row(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   uint32_t(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(bytes), "r"(uint32_t(__cvta_generic_to_shared(bar)))
               : "memory");
#endif
}

// Waits for the barrier's phase `parity` to complete.
__device__ __forceinline__ void row_bar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(uint32_t(__cvta_generic_to_shared(bar))), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }

}  // namespace selkv::qsa
