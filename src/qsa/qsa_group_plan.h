// Host entry of the C8 page-4 group plan kernel (qsa_group_plan.cu; layout src/qsa/qsa_group_layout.h).
// The caller has run every argument check; this only launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "qsa/qsa_kernel_params.h"
#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::qsa {

// Writes the header, the group table and each group's blocks of the group plan for groups of
// rows_per_group (1..32) rows into `group_plan` (group_plan_words(num_rows, max_blocks) int32
// words, 16-byte aligned); blocks past a group's count are left as they were.
cudaError_t launch_qsa_group_plan(const QsaSelectionParams& s, int32_t rows_per_group, int32_t* group_plan,
                                  cudaStream_t stream);

// The argument checks of qsa_plan (p's selection inputs; group_plan 16-byte aligned device memory
// of at least group_plan_words(num_rows, max_blocks) words), rows_per_group in [1, 32], then the
// kernel. Internal until the page-4 route reads it (tests call it directly).
Status qsa_group_plan(const QsaSparsePrefillParams& p, int rows_per_group, void* group_plan, size_t group_plan_bytes,
                      cudaStream_t stream);

}  // namespace selkv::qsa
