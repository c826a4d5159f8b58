// C9 launcher: validate, pick the (dtype, shard bucket) instantiation, size the grid from the
// row count (grid-stride beyond kMaxMergeCtas, so the result never depends on the grid).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "merge/merge_attn_states.cuh"
#include "merge/merge_checks.h"
#include "selkv/merge.h"

namespace selkv {
namespace {

constexpr const char* kOp = "selkv::merge_attn_states";
constexpr int64_t kMaxMergeCtas = int64_t(1) << 20;

// Columns per lane per step by shard bucket: about 8 vectors (128 B) in flight per lane at 3
// CTAs of 256 threads per SM (16 vectors at 2 CTAs for N > 8); the CTA counts are the most
// ptxas fits without spilling.
int chunks_for(int n) { return n <= 2 ? 4 : n <= 4 ? 2 : 1; }

template <typename T>
void launch_bucket(const merge::MergeKernelParams& k, dim3 grid, cudaStream_t stream) {
  constexpr int kT = merge::kMergeThreads;
  if (k.n <= 2) {
    merge::merge_attn_states_kernel<T, 2, 4, 3><<<grid, kT, 0, stream>>>(k);
  } else if (k.n <= 4) {
    merge::merge_attn_states_kernel<T, 4, 2, 3><<<grid, kT, 0, stream>>>(k);
  } else if (k.n <= 8) {
    merge::merge_attn_states_kernel<T, 8, 1, 3><<<grid, kT, 0, stream>>>(k);
  } else {
    merge::merge_attn_states_kernel<T, kMaxMergeShards, 1, 2><<<grid, kT, 0, stream>>>(k);
  }
}

}  // namespace

Status check_merge_attn_states(const MergeAttnStatesParams& p) {
  bool no_op = false;
  return merge::check_merge_params(kOp, p, /*device=*/true, &no_op);
}

int64_t merge_attn_states_bytes(const MergeAttnStatesParams& p) {
  const int64_t rows = p.num_tokens * int64_t(p.num_heads);
  const int64_t row_bytes = int64_t(p.head_dim) * merge::merge_elem_bytes(p.dtype);
  const int64_t lse_out = p.lse != nullptr ? 4 : 0;
  return rows * (int64_t(p.num_shards) * (row_bytes + 4) + row_bytes + lse_out);
}

Status merge_attn_states(const MergeAttnStatesParams& p, cudaStream_t stream) {
  bool no_op = false;
  SELKV_RETURN_IF_ERROR(merge::check_merge_params(kOp, p, /*device=*/true, &no_op));
  if (no_op) return Status::Ok();

  const int es = merge::merge_elem_bytes(p.dtype);
  merge::MergeKernelParams k{};
  for (int i = 0; i < p.num_shards; ++i) {
    k.outs[i] = static_cast<const uint8_t*>(p.outs[i]);
    k.lses[i] = p.lses[i];
  }
  k.n = p.num_shards;
  k.rows = uint32_t(p.num_tokens * p.num_heads);
  k.heads = FastDivmod(uint32_t(p.num_heads));
  k.vecs = int32_t(int64_t(p.head_dim) * es / 16);
  const int kc = chunks_for(p.num_shards);
  const int lanes_wanted = (k.vecs + kc - 1) / kc;
  int bits = 0;
  while ((1 << bits) < lanes_wanted && bits < 5) ++bits;
  k.lane_bits = bits;
  k.in_t = p.outs_token_stride * es;
  k.in_h = p.outs_head_stride * es;
  k.lin_t = p.lses_token_stride;
  k.lin_h = p.lses_head_stride;
  k.out = static_cast<uint8_t*>(p.out);
  k.out_t = p.out_token_stride * es;
  k.out_h = p.out_head_stride * es;
  k.lse = p.lse;
  k.lse_t = p.lse_token_stride;
  k.lse_h = p.lse_head_stride;
  k.pos_inf_is_empty = p.pos_inf_is_empty;

  const int64_t groups_per_cta = merge::kMergeThreads >> bits;
  int64_t ctas = (int64_t(k.rows) + groups_per_cta - 1) / groups_per_cta;
  if (ctas > kMaxMergeCtas) ctas = kMaxMergeCtas;
  const dim3 grid(static_cast<unsigned>(ctas));
  switch (p.dtype) {
    case MergeDtype::kBf16: launch_bucket<__nv_bfloat16>(k, grid, stream); break;
    case MergeDtype::kFp16: launch_bucket<__half>(k, grid, stream); break;
    case MergeDtype::kFp32: launch_bucket<float>(k, grid, stream); break;
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
