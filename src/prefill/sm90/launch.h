// Host-side entry points of the SM90 prefill kernel instantiations (instantiations/*.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "prefill/prefill_params.h"

namespace selkv::prefill::sm90 {

template <int kD>
cudaError_t launch_sparse_prefill_sm90(const PrefillKernelParams& p, cudaStream_t stream);

extern template cudaError_t launch_sparse_prefill_sm90<576>(const PrefillKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_prefill_sm90<512>(const PrefillKernelParams&, cudaStream_t);

}  // namespace selkv::prefill::sm90
