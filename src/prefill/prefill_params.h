// Internal (device-side) parameters of the C7 sparse MLA prefill. Arch-neutral.
#pragma once

#include <cstdint>

namespace selkv::prefill {

inline constexpr int kHeadsPerCta = 64;  // query heads per CTA (one wgmma M tile)

struct PrefillKernelParams {
  const uint16_t* q;  // bf16 [T, H, D_qk]
  int64_t q_token_stride, q_head_stride;
  int64_t num_tokens;
  int32_t num_heads;
  int32_t head_groups;  // H / 64
  int64_t num_tiles;    // T * head_groups: (token, 64-head group) work tiles, looped over by the grid

  const uint16_t* kv;  // bf16 [N, D_qk]
  int64_t kv_row_stride;
  int64_t num_kv;

  const int32_t* indices;
  int64_t indices_token_stride;
  int32_t topk;
  const int32_t* topk_length;  // [T] or null

  float sm_scale;
  float sm_scale_log2;  // sm_scale * log2(e)
  const float* attn_sink;  // [H] or null: out *= 1 / (1 + exp(attn_sink[h] - lse))

  uint16_t* out;  // bf16 [T, H, 512]
  int64_t out_token_stride, out_head_stride;
  float* max_logits;  // [T, H] or null
  int64_t max_logits_token_stride;
  float* lse;  // [T, H] or null
  int64_t lse_token_stride;

  // L2 cache policies: 2 (the library's only setting) Q and out evict-first, kv gathers
  // evict-last; 1 kv evict-normal; 0 all evict-normal. Values are identical in every mode. Still a
  // run-time field: folding it into the kernel would change the measured SASS (docs/perf-log.md:
  // experiment switches removed).
  int32_t l2_hints = 2;
};

}  // namespace selkv::prefill
