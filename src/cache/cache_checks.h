// Argument validation for the cache ops C1-C3 (include/selkv/cache_ops.h). Pure C++, no CUDA
// call: every check runs before a launcher touches the device, so the CPU test suite
// (tests/cpp/test_cache_checks.cpp) covers each rejection. A failed check names the op and the
// argument: "selkv::write_kv_cache: latent_row_stride: must be a multiple of 8 ...".
#pragma once

#include <cstdint>

#include "selkv/cache_ops.h"

namespace selkv::cache {

// C3 keeps an int64 prefix sum of the per-request lengths in shared memory (8 bytes/request):
// 4096 requests = 32 KiB. Larger batches must be split by the caller.
inline constexpr int32_t kMaxGatherReqs = 4096;

// C2 walks a row in int32 offsets, up to one 2048-entry chunk (and a 256-thread stride) past
// topk: the bound keeps them below 2^31 (convert_indices.cu asserts it against the kernel's sizes).
inline constexpr int32_t kMaxConvertTopk = (int32_t(1) << 30);

// What a launcher must do after a successful check.
enum class Work { kNone, kLaunch };

Status check_write_kv_cache(const WriteKvCacheParams& p, Work* work);

// kNone with num_tokens > 0 means topk == 0: the launcher only zero-fills valid_counts.
Status check_convert_indices(const ConvertIndicesParams& p, Work* work);

Status check_gather_kv(const GatherKvParams& p, Work* work);

}  // namespace selkv::cache
