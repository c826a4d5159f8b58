// selkv/prefill.h — C7: sparse MLA prefill over bf16 KV on SM90 (DESIGN §3 C7,
// docs/prefill-design.md). The bf16 consumer of C3 (gather_kv_bf16) and C4 (dequant_selected_kv).
//
//   q [T, H, D_qk] bf16, kv [N, D_qk] bf16, indices [T, K] int32 into kv, optional
//   topk_length [T], sm_scale
//   -> out [T, H, 512] bf16, max_logits [T, H] fp32, lse [T, H] fp32 (natural log).
//
// D_qk in {576, 512} (512: latent-only NoPE models); v = kv[:, :512]. H in {64, 128}. K a
// multiple of 64. T is flat: tokens of many requests, each with its own index row into the one
// kv buffer. Index entry (t, k) is valid iff 0 <= indices[t, k] < N and (with topk_length)
// k < topk_length[t]; invalid entries contribute nothing and are never dereferenced (with
// topk_length the tail is not even read). score = sm_scale * q . kv; max_logits = max valid
// score; lse = log sum exp(score). A row with no valid entry: out = 0, lse = max_logits = -inf.
// Each index entry is one softmax term (duplicates count twice). A NaN that reaches a row's
// softmax makes that row's out, lse and max_logits NaN. Optional attn_sink [H]: out *= 1 / (1 +
// exp(attn_sink[h] - lse)), fused in the epilogue.
//
// out, max_logits and lse must not share memory with each other or with q, kv, indices,
// topk_length or attn_sink (checked by extent from pointers, sizes and strides). T = 0 is a no-op. K <= 2^30.
//
// Asynchronous on `stream`: no host sync, no allocation, CUDA-graph capturable, deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "selkv/status.h"

namespace selkv {

struct SparsePrefillParams {
  // q: bf16 [T, H, D_qk]; last dim contiguous; pointer and strides 16-byte aligned.
  const void* q = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;  // in elements
  int64_t num_tokens = 0;  // T
  int32_t num_heads = 0;   // H in {64, 128}
  int32_t d_qk = 0;        // 576 or 512

  // kv: bf16 [num_kv, D_qk]; rows 16-byte aligned (kv_row_stride a multiple of 8).
  const void* kv = nullptr;
  int64_t kv_row_stride = 0;  // in elements, >= d_qk
  int64_t num_kv = 0;         // N

  // indices: int32 [T, K], last dim contiguous; K a multiple of 64.
  const int32_t* indices = nullptr;
  int64_t indices_token_stride = 0;  // in elements, >= K
  int32_t topk = 0;                  // K
  const int32_t* topk_length = nullptr;  // optional [T]

  float sm_scale = 0.f;  // finite, > 0, and sm_scale * log2(e) finite in fp32 (DESIGN §2)
  // Optional fp32 [H]: out *= 1 / (1 + exp(attn_sink[h] - lse)) in the epilogue (lse and
  // max_logits unchanged; a row with no valid entry keeps out 0).
  const float* attn_sink = nullptr;

  // out: bf16 [T, H, 512]; last dim contiguous; pointer and strides 16-byte aligned.
  void* out = nullptr;
  int64_t out_token_stride = 0, out_head_stride = 0;  // in elements
  // max_logits, lse: fp32 [T, H], head dim contiguous; either may be null (not written).
  float* max_logits = nullptr;
  int64_t max_logits_token_stride = 0;
  float* lse = nullptr;
  int64_t lse_token_stride = 0;
};

// Fills the strides of contiguous q [T, H, D_qk], out [T, H, 512], max_logits / lse [T, H],
// indices [T, K] and kv [N, D_qk] (helper for callers and tests).
void set_contiguous_strides(SparsePrefillParams* p);

// Argument validation only (no launch); sparse_mla_prefill runs the same checks.
Status check_sparse_mla_prefill(const SparsePrefillParams& p);

Status sparse_mla_prefill(const SparsePrefillParams& p, cudaStream_t stream);

}  // namespace selkv
