// Host entry of the C8 page-4 group plan kernel (qsa_group_plan.cu; layout src/qsa/qsa_group_layout.h).
// The caller has run every argument check; this only launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "qsa/qsa_kernel_params.h"
#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::qsa {

// Writes the group plan for groups of rows_per_group (1..kGroupMaxRows) rows into `group_plan`
// (group_plan_words(num_rows, max_blocks) int32 words, 16-byte aligned), every word (unused 0).
// hand_over: groups whose rows share too little go to the fix-up pass whole (qsa_group_layout.h).
cudaError_t launch_qsa_group_plan(const QsaSelectionParams& s, int32_t rows_per_group, bool hand_over,
                                  int32_t* group_plan, cudaStream_t stream);

// qsa_plan with a chosen grouping: its argument checks (group_plan 16-byte aligned device memory of
// at least qsa_metadata_size bytes), rows_per_group in [1, kGroupMaxRows], then the kernel.
// qsa_plan is this for the page-4 route's grouping with hand_over; tests and benchmarks choose
// others (hand_over false: every group listed, the plan's mechanics).
Status qsa_group_plan(const QsaSparsePrefillParams& p, int rows_per_group, void* group_plan, size_t group_plan_bytes,
                      cudaStream_t stream, bool hand_over = false);

}  // namespace selkv::qsa
