// Launcher of the C8 exact simple kernel (qsa_simple.cuh): one CTA per (row, kv head), the (dtype,
// D, group, warps) instantiation picked at run time, the warps from the selection's width, the grid
// and the device's SM count and shared memory (shape only; cached attribute queries, legal during
// stream capture). CUDA headers, the kernel, its plain params and header-only host helpers, so CI
// can compile this translation unit for sm_70 (ctest QsaSm70.SimpleKernelAssembles,
// cmake/qsa_sm70_check.cmake) while the library itself builds it for sm_90a.
#include "qsa/qsa_simple.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/arch.h"           // set_max_dynamic_smem_once
#include "common/resident_ctas.h"  // device_sm_count, device_smem_optin
#include "qsa/qsa_simple.cuh"

namespace selkv::qsa {
namespace {

// Warps a CTA (each a chunk stream of the row): 12 (one CTA an SM) for grids of up to 4 CTAs an SM,
// where a row's chunks spread over more warps shorten the CTA more than the extra waves cost; else
// 4 for selections of kQsaSimpleWideMinBlocks blocks and more, 2 below; the largest of those whose
// shared memory the device holds. 0: none fits.
template <int D>
cudaError_t pick_warps(const QsaSimpleParams& p, int64_t ctas, int* warps) {
  int sms = 0, optin = 0;
  if (!detail::device_sm_count("qsa_simple", &sms).ok() || !detail::device_smem_optin("qsa_simple", &optin).ok())
    return cudaErrorInvalidDevice;
  const auto fits = [&](size_t bytes) { return bytes <= size_t(optin); };
  if (ctas <= 4 * int64_t(sms) && fits(kWarpSmemBytes<D, 12>))
    *warps = 12;
  else if (p.sel.max_blocks >= kQsaSimpleWideMinBlocks && fits(kWarpSmemBytes<D, 4>))
    *warps = 4;
  else
    *warps = fits(kWarpSmemBytes<D, 2>) ? 2 : 0;
  return *warps != 0 ? cudaSuccess : cudaErrorInvalidConfiguration;
}

template <typename T, int D, int G, int kWarps>
cudaError_t launch_warps(const QsaSimpleParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = kWarpSmemBytes<D, kWarps>;
  const cudaError_t err = detail::set_max_dynamic_smem_once<qsa_simple_kernel<T, D, G, kWarps>>(int(smem));
  if (err != cudaSuccess) return err;
  qsa_simple_kernel<T, D, G, kWarps><<<grid, dim3{unsigned(kWarps * 32)}, smem, stream>>>(p);
  return cudaSuccess;
}

// kSimt: qsa_simple_simt_kernel (launch_qsa_simple_simt), else the warp-stream kernel of `warps`.
template <typename T, int D, int G, bool kSimt>
cudaError_t launch_one(const QsaSimpleParams& p, dim3 grid, int warps, cudaStream_t stream) {
  if constexpr (kSimt) {
    qsa_simple_simt_kernel<T, D, G><<<grid, dim3{unsigned(kSimtThreads)}, 0, stream>>>(p);
    return cudaSuccess;
  } else {
    switch (warps) {
      case 12: return launch_warps<T, D, G, 12>(p, grid, stream);
      case 4: return launch_warps<T, D, G, 4>(p, grid, stream);
      default: return launch_warps<T, D, G, 2>(p, grid, stream);
    }
  }
}

template <typename T, int D, bool kSimt>
cudaError_t launch_group(const QsaSimpleParams& p, int64_t ctas, cudaStream_t stream) {
  const dim3 grid{unsigned(ctas)};
  int warps = 0;
  if constexpr (!kSimt) {
    if (const cudaError_t err = pick_warps<D>(p, ctas, &warps); err != cudaSuccess) return err;
  }
  cudaError_t err = cudaSuccess;
  switch (p.group) {
    case 1: err = launch_one<T, D, 1, kSimt>(p, grid, warps, stream); break;
    case 2: err = launch_one<T, D, 2, kSimt>(p, grid, warps, stream); break;
    case 3: err = launch_one<T, D, 3, kSimt>(p, grid, warps, stream); break;
    case 4: err = launch_one<T, D, 4, kSimt>(p, grid, warps, stream); break;
    case 5: err = launch_one<T, D, 5, kSimt>(p, grid, warps, stream); break;
    case 6: err = launch_one<T, D, 6, kSimt>(p, grid, warps, stream); break;
    case 7: err = launch_one<T, D, 7, kSimt>(p, grid, warps, stream); break;
    case 8: err = launch_one<T, D, 8, kSimt>(p, grid, warps, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <bool kSimt>
cudaError_t launch(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream) {
  const int64_t ctas = int64_t(p.sel.num_rows) * p.num_kv_heads;
  if (ctas <= 0) return cudaSuccess;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  if (head_dim == 256)
    return bf16 ? launch_group<__nv_bfloat16, 256, kSimt>(p, ctas, stream) : launch_group<__half, 256, kSimt>(p, ctas, stream);
  if (head_dim == 128)
    return bf16 ? launch_group<__nv_bfloat16, 128, kSimt>(p, ctas, stream) : launch_group<__half, 128, kSimt>(p, ctas, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_qsa_simple(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream) {
  return launch<false>(p, bf16, head_dim, stream);
}

cudaError_t launch_qsa_simple_simt(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream) {
  return launch<true>(p, bf16, head_dim, stream);
}

}  // namespace selkv::qsa
