// C8 page-4 kernel, f16, D = 256.
#include "qsa/qsa_page4.cuh"

namespace selkv::qsa {
template cudaError_t launch_qsa_page4<__half, 256>(const QsaPage4Params&, int, cudaStream_t);
}  // namespace selkv::qsa
