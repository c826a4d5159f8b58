// Host entry of the C8 plan kernel (qsa_plan.cu). The caller (qsa_api.cpp) has run every argument
// check; this only launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "qsa/qsa_kernel_params.h"

namespace selkv::qsa {

// Writes the whole plan buffer (qsa_metadata_size(num_rows, max_blocks) bytes, 16-byte aligned).
cudaError_t launch_qsa_plan(const QsaSelectionParams& s, int32_t* metadata, cudaStream_t stream);

}  // namespace selkv::qsa
