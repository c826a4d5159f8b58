// Warp-level tensor-core primitives of the C8 simple kernel from SM80: ldmatrix from shared rows whose
// 16-byte units are XOR-swizzled by the row (so a row starts on a 128-byte boundary, which keeps
// every global line of a cp.async row copy one L2 request, and 8 rows at one unit still fall in 8
// bank groups), and mma.sync m16n8k16 with fp32 accumulation for fp16 and bf16. Emitted only from
// SM80; the host pass and older GPUs see empty bodies they never call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace selkv::qsa::warp_mma {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
inline constexpr bool kHas = true;
#else
inline constexpr bool kHas = false;
#endif

// Byte offset of 16-byte unit u of row j in rows of kRowBytes (a multiple of 128): unit u ^ (j % 8).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled(int j, int u) {
  static_assert(kRowBytes % 128 == 0, "rows of whole 128-byte segments");
  return uint32_t(j * kRowBytes + ((u ^ (j & 7)) << 4));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// c += A (16x16, row-major fragments a0..a3) B (16x8, b0 b1), fp32 accumulators c0..c3.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

}  // namespace selkv::qsa::warp_mma
