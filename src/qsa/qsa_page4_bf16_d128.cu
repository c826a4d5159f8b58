// C8 page-4 kernel, bf16, D = 128.
#include "qsa/qsa_page4.cuh"

namespace selkv::qsa {
template cudaError_t launch_qsa_page4<__nv_bfloat16, 128>(const QsaPage4Params&, int, cudaStream_t);
}  // namespace selkv::qsa
