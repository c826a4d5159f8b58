#include "decode/sm90/sparse_decode_kernel.cuh"

namespace selkv::decode::sm90 {
template cudaError_t launch_sparse_decode_sm90<128, false, true, false, KvFormat::kModel1Fp8>(const DecodeKernelParams&, cudaStream_t);
}  // namespace selkv::decode::sm90
