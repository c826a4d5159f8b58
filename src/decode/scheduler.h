// Split-KV scheduler for the C5 decode (arch-neutral, graph-capturable, no host sync).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace selkv::decode {

// Writes the metadata (decode_params.h layout) for rows = batch * seq_q rows of `topk` indices;
// topk_length or extra_topk_length (device [batch]) selects dynamic block counts; topk2 = K2 of
// the extra cache (0: none); default_granularity: min_blocks_per_part is the library's default
// (dynamic plans may then take one-block parts, one_block_parts_pay). One CTA on `stream`.
cudaError_t launch_decode_scheduler(int32_t batch, int32_t seq_q, int32_t topk,
                                    const int32_t* topk_length, int32_t topk2,
                                    const int32_t* extra_topk_length, int32_t num_sm_parts,
                                    int32_t min_blocks_per_part, bool default_granularity,
                                    int32_t* metadata, cudaStream_t stream);

}  // namespace selkv::decode
