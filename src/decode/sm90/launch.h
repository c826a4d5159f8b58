// Host-side entry points of the SM90 decode kernel instantiations (instantiations/*.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "decode/decode_params.h"

namespace selkv::decode::sm90 {

// kF16Partials: the split rows' partial format (decode_params.h f16_partials_by_default);
// kPacked: records from a packed KV buffer (C6) instead of the paged cache; kFormat: the cache's
// record format (model1_fp8: never packed; its kernels take the optional extra cache).
template <int kNumHeads, bool kDynamic, bool kF16Partials, bool kPacked, KvFormat kFormat = KvFormat::kDsMlaFp8>
cudaError_t launch_sparse_decode_sm90(const DecodeKernelParams& p, cudaStream_t stream);

extern template cudaError_t launch_sparse_decode_sm90<64, false, false, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, false, false, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, false, true, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, false, true, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, false, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, false, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, true, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, true, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, false, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, false, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, true, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, true, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, false, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, false, true>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, true, false>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, true, true>(const DecodeKernelParams&, cudaStream_t);

extern template cudaError_t launch_sparse_decode_sm90<64, false, false, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, false, true, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, false, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<64, true, true, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, false, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, false, true, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, false, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_sm90<128, true, true, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);

// Clusters (H = 128) / CTAs (H = 64) resident at once for a grid of `parts` parts.
template <int kNumHeads>
cudaError_t max_resident_sparse_decode_sm90(int parts, int* count);
extern template cudaError_t max_resident_sparse_decode_sm90<64>(int, int*);
extern template cudaError_t max_resident_sparse_decode_sm90<128>(int, int*);

}  // namespace selkv::decode::sm90
