// Device helpers the C8 attention kernels share: the 2-byte element types' packing (fp16 / bf16
// <-> fp32) and warp reductions. Nothing newer than SM70.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

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

// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }

}  // namespace selkv::qsa
