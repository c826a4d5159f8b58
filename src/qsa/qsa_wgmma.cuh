// Warpgroup MMA (wgmma, sm_90a) for the C8 page-4 kernel, without CuTe: shared-memory
// descriptors of 128-byte-swizzled tiles, the fences and groups, and the two shapes the kernel
// issues (S = Q K^T: m64n32k16 from shared memory; O += P V: m64n64k16 with P in registers).
//
// Tile layout both operands use: a [rows x D] tile of 16-bit elements is stored as D / 64 panels
// of 64 columns (128 bytes a row); a panel's rows are 128 bytes apart and its 16-byte chunk c of
// row r sits at chunk c ^ (r % 8) (the 128-byte swizzle; panels start 1024-byte aligned).
// Read K-major (Q, K: the MMA's K dimension is D) or MN-major (V: the K dimension is the token).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace selkv::qsa::wg {

// Byte offset of 16-byte chunk c (of D / 8) of row r in a swizzled tile of `rows` rows.
__host__ __device__ constexpr uint32_t sw128_offset(int rows, int r, int c) {
  return uint32_t((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

// Descriptor of a 128-byte-swizzled operand at smem_addr, as its two 32-bit words. K-major: sbo =
// 1024 (8 rows of 128 bytes), lbo unused. MN-major: sbo = 1024 (8 K rows), lbo = the panel stride
// (next 64 columns). The start address is the low word's low 14 bits (16-byte units), so an
// operand further on is one 32-bit add (shared memory is under 256 KB: no carry out of them).
struct Desc {
  uint32_t lo, hi;
};
__device__ __forceinline__ Desc desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return Desc{((smem_addr & 0x3FFFFu) >> 4) | (((lbo & 0x3FFFFu) >> 4) << 16), ((sbo & 0x3FFFFu) >> 4) | (1u << 30)};
}
__device__ __forceinline__ Desc desc_advance(Desc d, uint32_t bytes) { return Desc{d.lo + (bytes >> 4), d.hi}; }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from touching registers a wgmma in flight reads or writes: after a wait,
// the registers are live here (accumulators ready, A operands kept until their MMA retired).
template <int N>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// d (64 x 32, f32) = (accumulate ? d : 0) + A B^T: A and B K-major in shared memory.
template <typename T>
__device__ __forceinline__ void ss_m64n32k16(float* d, Desc a, Desc b, bool accumulate) {
#define SELKV_WG_SS_M64N32K16(TY)                                                                         \
  asm volatile(                                                                                           \
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %20, 0;\n"                                    \
      "mov.b64 da, {%16, %17};\nmov.b64 db, {%18, %19};\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                             \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, da, db, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(int32_t(accumulate)))
  if constexpr (std::is_same_v<T, __half>) {
    SELKV_WG_SS_M64N32K16("f16");
  } else {
    SELKV_WG_SS_M64N32K16("bf16");
  }
#undef SELKV_WG_SS_M64N32K16
}

// d (64 x 64, f32) += A B: A (64 x 16) in registers (the mma.sync m16n8k16 A fragment of each
// warp's 16 rows), B (16 x 64) MN-major in shared memory.
template <typename T>
__device__ __forceinline__ void rs_m64n64k16_mn(float* d, const uint32_t (&a)[4], Desc b) {
#define SELKV_WG_RS_M64N64K16(TY)                                                                          \
  asm volatile(                                                                                            \
      "{\n.reg .pred p;\n.reg .b64 db;\nsetp.eq.u32 p, 1, 1;\nmov.b64 db, {%36, %37};\n"                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                              \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                            \
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"                  \
      " {%32, %33, %34, %35}, db, p, 1, 1, 1;\n}\n"                                                      \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi))
  if constexpr (std::is_same_v<T, __half>) {
    SELKV_WG_RS_M64N64K16("f16");
  } else {
    SELKV_WG_RS_M64N64K16("bf16");
  }
#undef SELKV_WG_RS_M64N64K16
}

}  // namespace selkv::qsa::wg
