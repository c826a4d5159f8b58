// C8 exact simple kernel (selkv/qsa.h): one CTA per (row, kv head), nothing newer than SM70, so
// the same source serves V100-class GPUs and is the small-batch / fallback path on Hopper. Its
// body has two forms: tensor cores (qsa_simple_mma.cuh) wherever WMMA has the element type (fp16
// from SM70, bf16 from SM80), and SIMT fp32 (qsa_simple_simt.cuh) for bf16 below SM80. The fix-up
// pass after the page-4 kernel is the SIMT form on every GPU: few of its CTAs do work, and it keeps
// that form exercised on Hopper.
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

inline constexpr int kSimpleThreads = kMmaThreads;
inline constexpr int kFixupWarps = 8;
inline constexpr int kFixupThreads = kFixupWarps * 32;

// Four tensor-core CTAs an SM (<= 128 registers a thread; their shared memory allows four): the
// chunk loads are latency-bound, so resident warps are what hides them. The SIMT form keeps every
// register it wants.
template <typename T>
inline constexpr int kSimpleMinBlocks = kWmmaHas<T> ? 4 : 1;

template <typename T, int D, int G>
__global__ void __launch_bounds__(kSimpleThreads, kSimpleMinBlocks<T>) qsa_simple_kernel(const QsaSimpleParams p) {
  if constexpr (kWmmaHas<T>)
    mma_attend<T, D, G>(p);
  else
    simt_attend<T, D, G, kMmaWarps, false>(p);
}

// Its min-blocks hint 1 keeps ptxas from capping registers for occupancy (D 128 / G 4 spilled
// without it).
template <typename T, int D, int G>
__global__ void __launch_bounds__(kFixupThreads, 1) qsa_fixup_kernel(const QsaSimpleParams p) {
  simt_attend<T, D, G, kFixupWarps, true>(p);
}

}  // namespace selkv::qsa
