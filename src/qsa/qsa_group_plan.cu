// Launcher of the C8 page-4 group plan kernel (qsa_group_plan.cuh): one CTA per row group on the
// caller's stream; no host sync, graph capturable.
#include "qsa/qsa_group_plan.h"

#include "qsa/qsa_group_plan.cuh"

namespace selkv::qsa {

cudaError_t launch_qsa_group_plan(const QsaSelectionParams& s, int32_t rows_per_group, int32_t* group_plan,
                                  cudaStream_t stream) {
  if (s.num_rows <= 0 || rows_per_group < 1 || rows_per_group > kGpMaxRows) return cudaSuccess;
  const int64_t groups = (int64_t(s.num_rows) + rows_per_group - 1) / rows_per_group;
  qsa_group_plan_kernel<<<dim3{unsigned(groups)}, dim3{unsigned(kGpThreads)}, sizeof(GroupPlanSmem), stream>>>(
      s, rows_per_group, group_plan);
  return cudaGetLastError();
}

}  // namespace selkv::qsa
