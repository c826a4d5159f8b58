// Host-side entry points of the SM90 prefill kernel instantiations (instantiations/*.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "prefill/prefill_params.h"

namespace selkv::prefill::sm90 {

// `grid` CTAs loop over p.num_tiles tiles (1 <= grid <= num_tiles; one CTA per SM is resident).
template <int kD>
cudaError_t launch_sparse_prefill_sm90(const PrefillKernelParams& p, int64_t grid, cudaStream_t stream);

extern template cudaError_t launch_sparse_prefill_sm90<576>(const PrefillKernelParams&, int64_t, cudaStream_t);
extern template cudaError_t launch_sparse_prefill_sm90<512>(const PrefillKernelParams&, int64_t, cudaStream_t);

}  // namespace selkv::prefill::sm90
