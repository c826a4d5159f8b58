// Launcher of the C8 page-4 group plan kernel (qsa_group_plan.cuh): one CTA per row group on the
// caller's stream; no host sync, graph capturable.
#include "qsa/qsa_group_plan.h"

#include "common/arch.h"
#include "qsa/qsa_group_plan.cuh"

namespace selkv::qsa {

namespace {

template <bool kCompact>
cudaError_t launch_plan(const QsaSelectionParams& s, int32_t rows_per_group, int32_t win_words, bool hand_over,
                        int32_t* group_plan, int64_t groups, cudaStream_t stream) {
  // The attribute is set once, for the largest window.
  const cudaError_t err =
      selkv::detail::set_max_dynamic_smem_once<&qsa_group_plan_kernel<kCompact>>(int(gp_smem_bytes(kGpMaxWinWords)));
  if (err != cudaSuccess) return err;
  qsa_group_plan_kernel<kCompact><<<dim3{unsigned(groups)}, dim3{unsigned(kGpThreads)}, gp_smem_bytes(win_words), stream>>>(
      s, rows_per_group, win_words, hand_over, FastDivmod(uint32_t(s.page_size)), group_plan);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_qsa_group_plan(const QsaSelectionParams& s, int32_t rows_per_group, bool hand_over,
                                  int32_t* group_plan, cudaStream_t stream) {
  if (s.num_rows <= 0 || rows_per_group < 1 || rows_per_group > kGpMaxRows) return cudaSuccess;
  const int64_t groups = (int64_t(s.num_rows) + rows_per_group - 1) / rows_per_group;
  // Shared memory for the call's window (gp_win_words: its longest possible context).
  const int32_t win_words = gp_win_words(s);
  return s.compact ? launch_plan<true>(s, rows_per_group, win_words, hand_over, group_plan, groups, stream)
                   : launch_plan<false>(s, rows_per_group, win_words, hand_over, group_plan, groups, stream);
}

}  // namespace selkv::qsa
