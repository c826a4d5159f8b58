// C8 exact simple kernel (selkv/qsa.h): one CTA per (row, kv head), nothing newer than SM70, so
// the same source serves V100-class GPUs and is the small-batch / fallback path on Hopper. Its
// body is the tensor-core warp-stream form (qsa_simple_mma.cuh) wherever the tensor cores have the
// element type (fp16 from SM70, bf16 from SM80), and SIMT fp32 (qsa_simple_simt.cuh) for bf16 below
// SM80. The fix-up pass after the page-4 kernel is the same kernel over the (row, kv head)s the
// page-4 kernel flags (whole groups of rows when the plan finds they share too little).
// qsa_simple_simt_kernel runs the SIMT form on any GPU (qsa_sparse_prefill_simt: the tests keep the
// form bf16 takes below SM80 exercised on Hopper).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_simple_mma.cuh"
#include "qsa/qsa_simple_simt.cuh"

namespace selkv::qsa {

// Whether WMMA has element type T in this compilation pass (the host pass declares every kernel).
template <typename T>
inline constexpr bool kWmmaHas = true;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <>
inline constexpr bool kWmmaHas<__nv_bfloat16> = false;
#endif

inline constexpr int kSimtWarps = 8;
inline constexpr int kSimtThreads = kSimtWarps * 32;

// Warps a CTA: 2, 4, or 12 for small grids (qsa_simple.cu picks). From SM80 the 2- and 4-warp CTAs
// cap their registers at 12 warps an SM at D 256 (168 a thread; the shared memory holds 3 4-warp
// CTAs) and 16 at D 128; a 12-warp CTA fills its SM alone. Below SM80 (larger WMMA fragments) and
// in the SIMT form every register the block size allows.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
inline constexpr bool kSimpleCapRegisters = false;
#else
inline constexpr bool kSimpleCapRegisters = true;
#endif
template <typename T, int D, int kWarps>
inline constexpr int kWarpMinBlocks = kWmmaHas<T> && kSimpleCapRegisters && kWarps <= 4 ? (D == 256 ? 12 : 16) / kWarps : 1;

// Dynamic shared memory of a launch (the tensor-core form's; the SIMT form's is static).
template <int D, int kWarps>
inline constexpr size_t kWarpSmemBytes = sizeof(warp_streams::MmaSmem<D, kWarps>);

template <typename T, int D, int G, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, kWarpMinBlocks<T, D, kWarps>)
    qsa_simple_kernel(const QsaSimpleParams p) {
  if constexpr (kWmmaHas<T>) {
    extern __shared__ __align__(128) uint8_t qsa_simple_smem[];
    warp_streams::mma_attend<T, D, G, kWarps>(p, *reinterpret_cast<warp_streams::MmaSmem<D, kWarps>*>(qsa_simple_smem));
  } else {
    simt_attend<T, D, G, kWarps>(p);
  }
}

// Its min-blocks hint 1 keeps ptxas from capping registers for occupancy (D 128 / G 4 spilled
// without it).
template <typename T, int D, int G>
__global__ void __launch_bounds__(kSimtThreads, 1) qsa_simple_simt_kernel(const QsaSimpleParams p) {
  simt_attend<T, D, G, kSimtWarps>(p);
}

}  // namespace selkv::qsa
