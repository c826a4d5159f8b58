// SM90 sparse prefill v3 (block ping-pong), D_qk = 576.
#include "prefill/sm90/sparse_prefill_v3_kernel.cuh"

namespace selkv::prefill::sm90::v3 {
template cudaError_t launch_sparse_prefill_sm90_v3<576, false>(const PrefillKernelParams&, cudaStream_t);
template cudaError_t launch_sparse_prefill_sm90_v3<576, true>(const PrefillKernelParams&, cudaStream_t);
}  // namespace selkv::prefill::sm90::v3
