// Launcher of the C8 plan kernel (qsa_plan.cuh): one CTA per row on the caller's stream; no host
// sync, graph capturable.
#include "qsa/qsa_plan.h"

#include "qsa/qsa_plan.cuh"

namespace selkv::qsa {

cudaError_t launch_qsa_plan(const QsaSelectionParams& s, int32_t* metadata, cudaStream_t stream) {
  if (s.num_rows <= 0) return cudaSuccess;
  qsa_plan_kernel<<<dim3{unsigned(s.num_rows)}, dim3{unsigned(kPlanThreads)}, 0, stream>>>(s, metadata);
  return cudaGetLastError();
}

}  // namespace selkv::qsa
