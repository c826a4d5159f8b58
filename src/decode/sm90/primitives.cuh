// Thread-level device primitives of the SM90 decode: predicated 16-byte record loads and the
// cluster (shared::cluster) bulk copy of the H = 128 crossover. (The FP8 dequant is
// dev::dequant_e4m3x4, formats/device_codec.cuh, shared with the cache kernels.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cute/tensor.hpp>

#include "sm90/common.cuh"

namespace selkv::decode::sm90 {

// ---- small device helpers -------------------------------------------------------------------
using selkv::sm90::bf16x2_bits;  // src/sm90/common.cuh (shared with the C7 prefill)
using selkv::sm90::f16x2_bits;

// ---- cluster helpers (H = 128: a 2-CTA cluster shares the dequantized KV tile) --------------
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) { return cute::cast_smem_ptr_to_uint(ptr); }

// Warp scope: four 8x8 b16 matrices to shared memory (stmatrix .x4). Register m of every lane
// holds row lane / 4, columns 2 (lane % 4) and + 1 of matrix m (a wgmma accumulator fragment's
// layout); lanes 8m .. 8m + 7 give the 16-byte row addresses of matrix m.
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m0), "r"(m1),
               "r"(m2), "r"(m3)
               : "memory");
}

// 16 bytes from shared memory (a generic load would need the smem pointer, not its address).
__device__ __forceinline__ uint4 lds_128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Address of the same shared-memory offset in CTA `rank` of the cluster (shared::cluster window).
__device__ __forceinline__ uint32_t map_smem_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// Bulk copy of `bytes` (multiple of 16) from this CTA's smem to a peer CTA's smem (shared::cluster
// addresses), completing `bytes` transaction bytes on the peer's mbarrier. Async proxy: the
// source's generic-proxy writes must be fenced (fence.proxy.async) by their writers before.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t remote_dst, uint32_t local_src, uint32_t bytes,
                                                  uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(remote_dst),
      "r"(local_src), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// 16-byte load of the global record bytes at `gptr` when `valid`, else zeros with no memory
// access (an invalid index is never dereferenced). Deliberately a *generic* ld (LD.E.128, not
// LDG.E.128.CONSTANT): ptxas cannot prove it does not alias the producer's shared stores and
// st.async, so it keeps each load where the software pipeline puts it, right after the chunk whose
// registers it reuses. With ld.global.nc ptxas regroups the 11 loads of a round (all at the end
// of the previous round's conversion, or all before it), which costs either the loads' lead time
// or two rounds of records in registers (spills at the producer's 120 registers). Volatile asm
// with a memory clobber fixes the order in the PTX as well. Same bytes, same arithmetic.
// FlashMLA's L1 evict-last + L2 256B hint on these loads was slower here: not used
// (docs/perf-log.md: decode record load hints).
__device__ __forceinline__ uint4 ld_16_pred(const void* gptr, int32_t valid) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(gptr), "r"(valid)
      : "memory");
  return v;
}

// 8-byte load of the global bytes at `gptr` when `valid`, else zeros with no memory access (a
// model1_fp8 token's 8 UE8M0 scale bytes; generic ld for the reason given at ld_16_pred).
__device__ __forceinline__ uint2 ld_8_pred(const void* gptr, int32_t valid) {
  uint2 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %3, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@p ld.v2.u32 {%0, %1}, [%2];\n\t}\n"
      : "=r"(v.x), "=r"(v.y)
      : "l"(gptr), "r"(valid)
      : "memory");
  return v;
}

// 4-byte read-only load, predicated: -1 when `valid` is 0 (nothing is loaded). One register is
// both the default and the load target, so a caller that keeps the value in a loop-carried
// variable gets no register copy of the in-flight load (a copy waits for the load to land;
// docs/perf-log.md: decode index ring).
__device__ __forceinline__ int32_t ld_s32_pred_or_neg1(const int32_t* gptr, int32_t valid) {
  int32_t v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %2, 0;\n\t"
      "mov.b32 %0, -1;\n\t"
      "@p ld.global.nc.b32 %0, [%1];\n\t}\n"
      : "=r"(v)
      : "l"(gptr), "r"(valid));
  return v;
}

// The same with 0 for an unloaded value (the packed path's validity words: no token valid).
__device__ __forceinline__ int32_t ld_s32_pred_or_zero(const int32_t* gptr, int32_t valid) {
  int32_t v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %2, 0;\n\t"
      "mov.b32 %0, 0;\n\t"
      "@p ld.global.nc.b32 %0, [%1];\n\t}\n"
      : "=r"(v)
      : "l"(gptr), "r"(valid));
  return v;
}

// L2 prefetch of every 128-byte line holding a byte of [lo, hi), the lines dealt round-robin to
// `nthreads` threads (`tid` of them). The first line may start up to 127 bytes before lo.
__device__ __forceinline__ void prefetch_l2_span(uintptr_t lo, uintptr_t hi, uint32_t tid, uint32_t nthreads) {
#pragma unroll 1
  for (uintptr_t a = (lo & ~uintptr_t(127)) + 128u * tid; a < hi; a += 128u * nthreads)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

}  // namespace selkv::decode::sm90
