// SM90 sparse prefill v3 (block ping-pong), D_qk = 512.
#include "prefill/sm90/sparse_prefill_v3_kernel.cuh"

namespace selkv::prefill::sm90::v3 {
template cudaError_t launch_sparse_prefill_sm90_v3<512, false>(const PrefillKernelParams&, cudaStream_t);
template cudaError_t launch_sparse_prefill_sm90_v3<512, true>(const PrefillKernelParams&, cudaStream_t);
}  // namespace selkv::prefill::sm90::v3
