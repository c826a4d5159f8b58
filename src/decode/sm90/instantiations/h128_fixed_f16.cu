#include "decode/sm90/sparse_decode_kernel.cuh"

namespace selkv::decode::sm90 {
template cudaError_t launch_sparse_decode_sm90<128, false, true, false>(const DecodeKernelParams&, cudaStream_t);
template cudaError_t max_resident_sparse_decode_sm90<128>(int, int*);
}  // namespace selkv::decode::sm90
