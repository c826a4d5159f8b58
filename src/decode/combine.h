// Split-KV combine for the C5 decode (arch-neutral): merges the partial (out, lse) of split rows
// in a fixed order (deterministic) and applies attn_sink. Rows that were not split are skipped
// (the decode kernel wrote them directly).
#pragma once

#include <cuda_runtime_api.h>

#include "decode/decode_params.h"

namespace selkv::decode {

// One CTA column per entry of the plan's split-row table; `max_split_rows` bounds the entries
// (columns past the table's count exit at once). `f16_partials`: the format the decode kernel
// wrote (its kF16Partials).
cudaError_t launch_decode_combine(const DecodeKernelParams& p, int32_t max_split_rows, bool f16_partials,
                                  cudaStream_t stream);

}  // namespace selkv::decode
