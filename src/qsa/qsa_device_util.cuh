// Device helpers the C8 attention kernels share: the 2-byte element types' packing (fp16 / bf16
// <-> fp32), warp reductions and the simple kernel's global -> shared slice copies. Nothing newer
// than SM70 is required: the copies are asynchronous (cp.async) from SM80 and plain below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "qsa/qsa_kernel_params.h"
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

// The fix-up pass after the page-4 kernel (p.only_nonfinite; qsa_api.cpp): the page-4 kernel leaves
// a NaN in element 0 of the heads of a (row, kv head) it did not serve exactly. Whether this CTA's
// has one (CTA-wide; a CTA without one has nothing to do). Every thread calls it.
template <typename T, int G>
__device__ __forceinline__ bool fixup_flagged(const QsaSimpleParams& p, int32_t r, int32_t kvh) {
  bool flagged = false;
  if (threadIdx.x < unsigned(G)) {
    const uint16_t x = *reinterpret_cast<const uint16_t*>(static_cast<const T*>(p.io.out) + int64_t(r) * p.io.out_row_stride +
                                                          (int64_t(kvh) * G + threadIdx.x) * p.io.out_head_stride);
    flagged = (x & Elem<T>::kExp) == Elem<T>::kExp;
  }
  return __syncthreads_or(flagged) != 0;
}

// The first set bit at or after bit k of a bitmap of kWords 32-bit words (a live-chunk map), or
// 32 * kWords when none is.
template <int kWords>
__device__ __forceinline__ int32_t next_set_bit(const uint32_t (&bits)[kWords], int32_t k) {
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const int32_t lo = k - 32 * w;
    const uint32_t b = lo <= 0 ? bits[w] : lo >= 32 ? 0u : bits[w] & (0xFFFFFFFFu << lo);
    if (b != 0u) return 32 * w + __ffs(int(b)) - 1;
  }
  return 32 * kWords;
}

// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }

}  // namespace selkv::qsa
