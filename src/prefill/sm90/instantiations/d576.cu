// SM90 sparse prefill, D_qk = 576.
#include "prefill/sm90/sparse_prefill_kernel.cuh"

namespace selkv::prefill::sm90 {
template cudaError_t launch_sparse_prefill_sm90<576>(const PrefillKernelParams&, int64_t, cudaStream_t);
}  // namespace selkv::prefill::sm90
