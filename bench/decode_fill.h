// Device-side normal(0, stddev) bf16 fills for the decode benchmark inputs (DESIGN §5 data:
// q ~ randn, KV latents ~ randn / 10). Counter-based (hash of seed and index), so a buffer's
// contents depend only on (seed, index), not on the launch shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "selkv/formats.h"

namespace selkv::bench {

// `count` bf16 values N(0, stddev), clamped to [-clamp, clamp] when clamp > 0.
void device_fill_normal_bf16(void* ptr, size_t count, float stddev, float clamp, uint64_t seed,
                             cudaStream_t stream);
// slot_mapping[i] = first + i (int64), for writing a contiguous range of cache slots.
void device_fill_iota_i64(int64_t* ptr, size_t count, int64_t first, cudaStream_t stream);
// Every slot of a paged cache written through selkv::write_kv_cache (pow2 scales) from latents and
// RoPE N(0, 0.1) clamped to +-1, in chunks of 2^18 tokens; returns after the
// stream has finished (the chunk buffers are freed).
void device_write_random_cache(void* cache, int64_t num_blocks, int32_t page, int64_t block_stride,
                               KvFormat format, uint64_t seed, cudaStream_t stream);

}  // namespace selkv::bench
