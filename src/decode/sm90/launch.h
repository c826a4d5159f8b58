// Host-side entry points of the SM90 decode kernel instantiations (instantiations/*.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "decode/decode_params.h"

namespace selkv::decode::sm90 {

template <int kNumHeads, bool kDynamic>
cudaError_t launch_sparse_decode_sm90(const DecodeKernelParams& p, cudaStream_t stream);

extern template cudaError_t launch_sparse_decode_sm90<64, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true>(const DecodeKernelParams&, cudaStream_t);

template <int kNumHeads>
cudaError_t max_resident_sparse_decode_sm90(int* count);
extern template cudaError_t max_resident_sparse_decode_sm90<64>(int*);
extern template cudaError_t max_resident_sparse_decode_sm90<128>(int*);

}  // namespace selkv::decode::sm90
