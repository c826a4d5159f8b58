// selkv/merge.h — C9: merge partial attention results of N KV shards by their log-sum-exp
// (DESIGN §3 C9; context parallelism, split prefill / decode).
//
// Shard i gives out_i [T, H, D] and lse_i [T, H] (natural log, fp32). Per (t, h) row, over the
// shards whose lse is not -inf ("empty" shards contribute nothing, their out is never used):
//   m = max lse_i,  w_i = exp(lse_i - m),  out = sum_i w_i out_i / sum_i w_i,  lse = m + log(sum w)
// summed in shard order in fp32 (deterministic). Special rows, as the oracle (ref::lse_merge):
//   - a NaN lse in any shard: out and lse NaN (a NaN is never dropped);
//   - a +inf lse (pos_inf_is_empty = false, the default): the first such shard wins, out = its
//     out, lse = +inf;
//   - every shard empty: out = 0, lse = -inf (the identity of the merge).
// pos_inf_is_empty = true treats a +inf lse as -inf: FlashAttention / FlashMLA / vLLM write +inf
// for rows with no key, so their partials merge right with it (vLLM's merge_attn_states form is
// N = 2 with this flag and lse strides for its [H, T] layout).
// N = 1 copies out and lse, except that it normalizes empty rows to 0 / -inf.
//
// Layout: every input shard has the same strides (in elements, last dim dense); the shards are
// given as a fixed-capacity array of pointers passed by value to the kernel, so there is no
// device pointer table and the call stays CUDA-graph capturable. A stacked [N, T, H, D] tensor is
// N pointers base + i * shard_stride.
//
// GPU requirements: outs[i] and out 16-byte aligned, token and head strides of outs / out
// multiples of 16 bytes; lses and lse 4-byte aligned (any strides, so [H, T] works). out and lse
// must not share memory with each other or with any input; inputs may alias one another.
// T * H < 2^31. A call with T = 0 or H = 0 is a no-op (pointers may be null).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "selkv/status.h"

namespace selkv {

enum class MergeDtype : int32_t { kBf16 = 0, kFp16 = 1, kFp32 = 2 };

inline constexpr int kMaxMergeShards = 16;

struct MergeAttnStatesParams {
  int32_t num_shards = 0;                        // N in [1, kMaxMergeShards]
  int64_t num_tokens = 0;                        // T
  int32_t num_heads = 0;                         // H
  int32_t head_dim = 0;                          // D: a positive multiple of 8
  MergeDtype dtype = MergeDtype::kBf16;          // of every out_i and of out
  const void* outs[kMaxMergeShards] = {};        // [T, H, D] each, entries >= N unused
  int64_t outs_token_stride = 0;                 // in elements, shared by all shards
  int64_t outs_head_stride = 0;
  const float* lses[kMaxMergeShards] = {};       // [T, H] each
  int64_t lses_token_stride = 0;                 // in elements, shared by all shards
  int64_t lses_head_stride = 0;
  void* out = nullptr;                           // [T, H, D]
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  float* lse = nullptr;                          // [T, H] or null (out only)
  int64_t lse_token_stride = 0;
  int64_t lse_head_stride = 0;
  bool pos_inf_is_empty = false;                 // a +inf lse means "empty" (FlashAttention's rows)
};

// Argument validation only (no launch); merge_attn_states runs the same checks.
Status check_merge_attn_states(const MergeAttnStatesParams& p);

Status merge_attn_states(const MergeAttnStatesParams& p, cudaStream_t stream);

// Bytes one call reads and writes at least (what the benchmark counts).
int64_t merge_attn_states_bytes(const MergeAttnStatesParams& p);

}  // namespace selkv
