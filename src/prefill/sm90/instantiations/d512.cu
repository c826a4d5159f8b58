// SM90 sparse prefill, D_qk = 512.
#include "prefill/sm90/sparse_prefill_kernel.cuh"

namespace selkv::prefill::sm90 {
template cudaError_t launch_sparse_prefill_sm90<512>(const PrefillKernelParams&, int64_t, cudaStream_t);
}  // namespace selkv::prefill::sm90
