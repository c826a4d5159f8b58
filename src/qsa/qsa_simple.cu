// Launcher of the C8 exact simple kernel (qsa_simple.cuh): one CTA per (row, kv head), the
// (dtype, D, group) instantiation picked at run time. Self-contained (CUDA headers, the kernel and
// its plain params; no selkv runtime code), so CI can compile this translation unit for sm_70
// (ctest QsaSm70.SimpleKernelAssembles, cmake/qsa_sm70_check.cmake) while the library itself
// builds it for sm_90a.
#include "qsa/qsa_simple.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "qsa/qsa_simple.cuh"

namespace selkv::qsa {
namespace {

template <typename T, int D, int G, bool kFixup>
void launch_one(const QsaSimpleParams& p, dim3 grid, cudaStream_t stream) {
  if constexpr (kFixup)
    qsa_fixup_kernel<T, D, G><<<grid, dim3{unsigned(kFixupThreads)}, 0, stream>>>(p);
  else
    qsa_simple_kernel<T, D, G><<<grid, dim3{unsigned(kSimpleThreads)}, 0, stream>>>(p);
}

template <typename T, int D, bool kFixup>
cudaError_t launch_group(const QsaSimpleParams& p, int64_t ctas, cudaStream_t stream) {
  const dim3 grid{unsigned(ctas)};
  switch (p.group) {
    case 1: launch_one<T, D, 1, kFixup>(p, grid, stream); break;
    case 2: launch_one<T, D, 2, kFixup>(p, grid, stream); break;
    case 3: launch_one<T, D, 3, kFixup>(p, grid, stream); break;
    case 4: launch_one<T, D, 4, kFixup>(p, grid, stream); break;
    case 5: launch_one<T, D, 5, kFixup>(p, grid, stream); break;
    case 6: launch_one<T, D, 6, kFixup>(p, grid, stream); break;
    case 7: launch_one<T, D, 7, kFixup>(p, grid, stream); break;
    case 8: launch_one<T, D, 8, kFixup>(p, grid, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
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
