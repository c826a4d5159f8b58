// Launcher of the C8 exact simple kernel (qsa_simple.cuh): one CTA per (row, kv head), the form
// from the selection's width and the (dtype, D, group, warps or streams) instantiation picked at run
// time, the warps or streams from the grid and the device's SM count and shared memory (shape only;
// cached attribute queries, legal during stream capture). CUDA headers, the kernel, its plain params and header-only host helpers, so CI
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

// The plain kernel's form and CTA size.
struct SimpleLaunch {
  bool warp_streams;  // qsa_simple_kernel (a warp a chunk stream), else qsa_simple_split_kernel
  int count;          // warp streams: warps a CTA; split heads: chunk streams of 4 warps a CTA
};

// Warp streams for selections of kQsaSimpleWarpMinBlocks blocks and more (when a 4-warp CTA's
// shared memory fits): 12 warps (one CTA an SM) for grids of up to 4 CTAs an SM, where a row's
// chunks spread over more warps shorten the CTA more than the extra waves cost, else 4 (3 CTAs an
// SM at D 256). Split heads below: enough chunk streams that the grid's streams fill the GPU's 4
// stream slots an SM (16 warps), as long as the shared memory fits.
template <int D>
cudaError_t pick_launch(const QsaSimpleParams& p, int64_t ctas, SimpleLaunch* l) {
  int sms = 0, optin = 0;
  if (!detail::device_sm_count("qsa_simple", &sms).ok() || !detail::device_smem_optin("qsa_simple", &optin).ok())
    return cudaErrorInvalidDevice;
  if (p.sel.max_blocks >= kQsaSimpleWarpMinBlocks && kWarpSmemBytes<D, 4> <= size_t(optin)) {
    l->warp_streams = true;
    l->count = ctas <= 4 * int64_t(sms) && kWarpSmemBytes<D, 12> <= size_t(optin) ? 12 : 4;
    return cudaSuccess;
  }
  l->warp_streams = false;
  l->count = 1;
  if (ctas <= 2 * int64_t(sms) && kSplitSmemBytes<D, 2> <= size_t(optin)) l->count = 2;
  if (ctas <= int64_t(sms) && kSplitSmemBytes<D, 4> <= size_t(optin)) l->count = 4;
  return cudaSuccess;
}

template <typename T, int D, int G, int kWarps>
cudaError_t launch_warps(const QsaSimpleParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = kWarpSmemBytes<D, kWarps>;
  const cudaError_t err = detail::set_max_dynamic_smem_once<qsa_simple_kernel<T, D, G, kWarps>>(int(smem));
  if (err != cudaSuccess) return err;
  qsa_simple_kernel<T, D, G, kWarps><<<grid, dim3{unsigned(kWarps * 32)}, smem, stream>>>(p);
  return cudaSuccess;
}

template <typename T, int D, int G, int kStreams>
cudaError_t launch_split(const QsaSimpleParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = kSplitSmemBytes<D, kStreams>;
  if constexpr (smem > 0) {
    const cudaError_t err = detail::set_max_dynamic_smem_once<qsa_simple_split_kernel<T, D, G, kStreams>>(int(smem));
    if (err != cudaSuccess) return err;
  }
  qsa_simple_split_kernel<T, D, G, kStreams>
      <<<grid, dim3{unsigned(kStreams * split_heads::kMmaWarps * 32)}, smem, stream>>>(p);
  return cudaSuccess;
}

template <typename T, int D, int G, bool kFixup>
cudaError_t launch_one(const QsaSimpleParams& p, dim3 grid, const SimpleLaunch& l, cudaStream_t stream) {
  if constexpr (kFixup) {
    qsa_fixup_kernel<T, D, G><<<grid, dim3{unsigned(kFixupThreads)}, 0, stream>>>(p);
    return cudaSuccess;
  } else {
    if (l.warp_streams)
      return l.count == 12 ? launch_warps<T, D, G, 12>(p, grid, stream) : launch_warps<T, D, G, 4>(p, grid, stream);
    switch (l.count) {
      case 4: return launch_split<T, D, G, 4>(p, grid, stream);
      case 2: return launch_split<T, D, G, 2>(p, grid, stream);
      default: return launch_split<T, D, G, 1>(p, grid, stream);
    }
  }
}

template <typename T, int D, bool kFixup>
cudaError_t launch_group(const QsaSimpleParams& p, int64_t ctas, cudaStream_t stream) {
  const dim3 grid{unsigned(ctas)};
  SimpleLaunch l{false, 1};
  if constexpr (!kFixup) {
    if (const cudaError_t err = pick_launch<D>(p, ctas, &l); err != cudaSuccess) return err;
  }
  cudaError_t err = cudaSuccess;
  switch (p.group) {
    case 1: err = launch_one<T, D, 1, kFixup>(p, grid, l, stream); break;
    case 2: err = launch_one<T, D, 2, kFixup>(p, grid, l, stream); break;
    case 3: err = launch_one<T, D, 3, kFixup>(p, grid, l, stream); break;
    case 4: err = launch_one<T, D, 4, kFixup>(p, grid, l, stream); break;
    case 5: err = launch_one<T, D, 5, kFixup>(p, grid, l, stream); break;
    case 6: err = launch_one<T, D, 6, kFixup>(p, grid, l, stream); break;
    case 7: err = launch_one<T, D, 7, kFixup>(p, grid, l, stream); break;
    case 8: err = launch_one<T, D, 8, kFixup>(p, grid, l, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <typename T, int D>
cudaError_t launch_dim(const QsaSimpleParams& p, int64_t ctas, cudaStream_t stream) {
  return p.only_nonfinite ? launch_group<T, D, true>(p, ctas, stream) : launch_group<T, D, false>(p, ctas, stream);
}

}  // namespace

cudaError_t launch_qsa_simple(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream) {
  const int64_t ctas = int64_t(p.sel.num_rows) * p.num_kv_heads;
  if (ctas <= 0) return cudaSuccess;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  if (head_dim == 256)
    return bf16 ? launch_dim<__nv_bfloat16, 256>(p, ctas, stream) : launch_dim<__half, 256>(p, ctas, stream);
  if (head_dim == 128)
    return bf16 ? launch_dim<__nv_bfloat16, 128>(p, ctas, stream) : launch_dim<__half, 128>(p, ctas, stream);
  return cudaErrorInvalidValue;
}

}  // namespace selkv::qsa
