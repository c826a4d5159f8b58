// C8 exact simple kernel (selkv/qsa.h): one CTA per (row, kv head), nothing newer than SM70, so
// the same source serves V100-class GPUs and is the small-batch / fallback path on Hopper. Its
// body has tensor-core forms wherever WMMA has the element type (fp16 from SM70, bf16 from SM80):
// warp streams (qsa_simple_mma.cuh) for selections of kQsaSimpleWarpMinBlocks blocks and more,
// split heads (qsa_simple_mma_split.cuh) below; and SIMT fp32 (qsa_simple_simt.cuh) for bf16 below
// SM80. The fix-up pass after the page-4 kernel is the SIMT form on every GPU: few of its CTAs do
// work, and it keeps that form exercised on Hopper.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_simple_mma.cuh"
#include "qsa/qsa_simple_mma_split.cuh"
#include "qsa/qsa_simple_simt.cuh"

namespace selkv::qsa {

// Whether WMMA has element type T in this compilation pass (the host pass declares every kernel).
template <typename T>
inline constexpr bool kWmmaHas = true;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <>
inline constexpr bool kWmmaHas<__nv_bfloat16> = false;
#endif

inline constexpr int kFixupWarps = 8;
inline constexpr int kFixupThreads = kFixupWarps * 32;

// ---- warp streams (qsa_simple_mma.cuh) ----
// Warps a CTA: 4, or 12 for small grids (qsa_simple.cu picks). From SM80 a 4-warp CTA caps its
// registers so its shared memory's residency holds (3 CTAs an SM at D 256, 4 at D 128); a 12-warp
// CTA fills its SM alone. Below SM80 (larger WMMA fragments) and in the SIMT form every register
// the block size allows.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
inline constexpr bool kSimpleCapRegisters = false;
#else
inline constexpr bool kSimpleCapRegisters = true;
#endif
template <typename T, int D, int kWarps>
inline constexpr int kWarpMinBlocks = kWmmaHas<T> && kSimpleCapRegisters && kWarps == 4 ? (D == 256 ? 3 : 4) : 1;

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
    simt_attend<T, D, G, kWarps, false>(p);
  }
}

// ---- split heads (qsa_simple_mma_split.cuh) ----
// From SM80, 16 tensor-core warps an SM whatever the streams (<= 128 registers a thread; one
// stream's shared memory allows four CTAs of one stream). Below SM80 and in the SIMT form every
// register the block size allows (a 4-stream block still caps them at 128; the launcher never
// picks 4 streams on a GPU whose shared memory cannot hold them, V100 included).
template <typename T, int kStreams>
inline constexpr int kSplitMinBlocks = kWmmaHas<T> && kSimpleCapRegisters ? 4 / kStreams : 1;

// Dynamic shared memory of a kStreams launch (one stream: static, within 48 KiB).
template <int D, int kStreams>
inline constexpr size_t kSplitSmemBytes = kStreams == 1 ? 0 : sizeof(split_heads::MmaSmem<D, kStreams>);

template <typename T, int D, int G, int kStreams>
__global__ void __launch_bounds__(kStreams * split_heads::kMmaWarps * 32, kSplitMinBlocks<T, kStreams>)
    qsa_simple_split_kernel(const QsaSimpleParams p) {
  if constexpr (kWmmaHas<T>) {
    if constexpr (kStreams == 1) {
      __shared__ split_heads::MmaSmem<D, 1> sm;
      split_heads::mma_attend<T, D, G, 1>(p, sm);
    } else {
      extern __shared__ __align__(128) uint8_t qsa_simple_smem[];
      split_heads::mma_attend<T, D, G, kStreams>(p, *reinterpret_cast<split_heads::MmaSmem<D, kStreams>*>(qsa_simple_smem));
    }
  } else {
    simt_attend<T, D, G, kStreams * split_heads::kMmaWarps, false>(p);
  }
}

// Its min-blocks hint 1 keeps ptxas from capping registers for occupancy (D 128 / G 4 spilled
// without it).
template <typename T, int D, int G>
__global__ void __launch_bounds__(kFixupThreads, 1) qsa_fixup_kernel(const QsaSimpleParams p) {
  simt_attend<T, D, G, kFixupWarps, true>(p);
}

}  // namespace selkv::qsa
