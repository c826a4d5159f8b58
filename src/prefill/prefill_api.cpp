// C7 host API: validation (fails closed, names the argument) and dispatch to the SM90 kernel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/arch.h"
#include "common/check.h"
#include "common/overlap.h"
#include "common/sm_scale.h"
#include "common/resident_ctas.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "prefill/prefill_params.h"
#include "prefill/sm90/launch.h"
#include "selkv/prefill.h"

namespace selkv {
namespace {
bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
}  // namespace

void set_contiguous_strides(SparsePrefillParams* p) {
  p->q_head_stride = p->d_qk;
  p->q_token_stride = int64_t(p->num_heads) * p->d_qk;
  p->kv_row_stride = p->d_qk;
  p->indices_token_stride = p->topk;
  p->out_head_stride = 512;
  p->out_token_stride = int64_t(p->num_heads) * 512;
  p->max_logits_token_stride = p->num_heads;
  p->lse_token_stride = p->num_heads;
}

Status check_sparse_mla_prefill(const SparsePrefillParams& p) {
  constexpr const char* kOp = "selkv::sparse_mla_prefill";
  SELKV_CHECK_ARG(p.d_qk == 576 || p.d_qk == 512, "d_qk", "must be 576 or 512, got ", p.d_qk);
  SELKV_CHECK_ARG(p.num_heads == 64 || p.num_heads == 128, "num_heads", "must be 64 or 128, got ",
                  p.num_heads);
  SELKV_CHECK_ARG(p.topk >= 0 && p.topk % 64 == 0, "topk",
                  "must be a non-negative multiple of 64, got ", p.topk);
  // The kernels step through a row two 64-entry blocks ahead in int32 offsets.
  SELKV_CHECK_ARG(p.topk <= (int32_t(1) << 30), "topk", "must be <= 2^30, got ", p.topk);
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.num_tokens <= (int64_t(1) << 30), "num_tokens",
                  "must be <= 2^30 (one CTA per token and 64-head group), got ", p.num_tokens);
  SELKV_CHECK_ARG(p.num_kv >= 0, "num_kv", "must be >= 0, got ", p.num_kv);
  SELKV_RETURN_IF_ERROR(detail::check_sm_scale(kOp, p.sm_scale));
  if (p.num_tokens == 0) return Status::Ok();
  // q
  SELKV_CHECK_ARG(p.q != nullptr, "q", "must not be null");
  SELKV_CHECK_ARG(aligned(p.q, 16), "q", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.q_head_stride >= p.d_qk && p.q_head_stride % 8 == 0, "q_head_stride",
                  "must be >= d_qk and a multiple of 8 elements, got ", p.q_head_stride);
  SELKV_CHECK_ARG(p.q_token_stride % 8 == 0 && (p.num_tokens == 1 ||
                  p.q_token_stride >= int64_t(p.num_heads) * p.q_head_stride),
                  "q_token_stride", "must be >= H * q_head_stride and a multiple of 8 elements, got ",
                  p.q_token_stride);
  // kv (never read when no index can be valid)
  if (p.num_kv > 0 && p.topk > 0) {
    SELKV_CHECK_ARG(p.kv != nullptr, "kv", "must not be null");
    SELKV_CHECK_ARG(aligned(p.kv, 16), "kv", "must be 16-byte aligned");
    SELKV_CHECK_ARG(p.kv_row_stride >= p.d_qk && p.kv_row_stride % 8 == 0, "kv_row_stride",
                    "must be >= d_qk and a multiple of 8 elements, got ", p.kv_row_stride);
    SELKV_CHECK_ARG(p.num_kv <= std::numeric_limits<int64_t>::max() / 2 / p.kv_row_stride,
                    "num_kv", "num_kv * kv_row_stride overflows");
  }
  // indices
  if (p.topk > 0) {
    SELKV_CHECK_ARG(p.indices != nullptr, "indices", "must not be null");
    SELKV_CHECK_ARG(aligned(p.indices, 4), "indices", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.indices_token_stride >= p.topk, "indices_token_stride",
                    "must be >= topk (", p.topk, "), got ", p.indices_token_stride);
    if (p.topk_length != nullptr) {
      SELKV_CHECK_ARG(aligned(p.topk_length, 4), "topk_length", "must be 4-byte aligned");
    }
  }
  SELKV_CHECK_ARG(aligned(p.attn_sink, 4), "attn_sink", "must be 4-byte aligned");
  // outputs
  SELKV_CHECK_ARG(p.out != nullptr, "out", "must not be null");
  SELKV_CHECK_ARG(aligned(p.out, 16), "out", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.out_head_stride >= 512 && p.out_head_stride % 8 == 0, "out_head_stride",
                  "must be >= 512 and a multiple of 8 elements, got ", p.out_head_stride);
  SELKV_CHECK_ARG(p.out_token_stride % 8 == 0 && (p.num_tokens == 1 ||
                  p.out_token_stride >= int64_t(p.num_heads) * p.out_head_stride),
                  "out_token_stride", "must be >= H * out_head_stride and a multiple of 8, got ",
                  p.out_token_stride);
  if (p.max_logits != nullptr) {
    SELKV_CHECK_ARG(aligned(p.max_logits, 4), "max_logits", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.num_tokens == 1 || p.max_logits_token_stride >= p.num_heads,
                    "max_logits_token_stride", "must be >= H, got ", p.max_logits_token_stride);
  }
  if (p.lse != nullptr) {
    SELKV_CHECK_ARG(aligned(p.lse, 4), "lse", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.num_tokens == 1 || p.lse_token_stride >= p.num_heads, "lse_token_stride",
                    "must be >= H, got ", p.lse_token_stride);
  }
  // Overlaps (DESIGN §2): the three outputs are disjoint from each other and from every input.
  using detail::Dim;
  using detail::extent_of;
  const int64_t T = p.num_tokens, H = p.num_heads;
  const bool reads_kv = p.num_kv > 0 && p.topk > 0;
  const detail::Extent in[5] = {
      extent_of(p.q, 2, {Dim{T, p.q_token_stride}, Dim{H, p.q_head_stride}, Dim{p.d_qk, 1}}),
      reads_kv ? extent_of(p.kv, 2, {Dim{p.num_kv, p.kv_row_stride}, Dim{p.d_qk, 1}}) : detail::Extent{},
      p.topk > 0 ? extent_of(p.indices, 4, {Dim{T, p.indices_token_stride}, Dim{p.topk, 1}}) : detail::Extent{},
      p.topk > 0 ? extent_of(p.topk_length, 4, {Dim{T, 1}}) : detail::Extent{},
      extent_of(p.attn_sink, 4, {Dim{H, 1}})};
  const char* in_names[5] = {"q", "kv", "indices", "topk_length", "attn_sink"};
  const detail::Extent out[3] = {
      extent_of(p.out, 2, {Dim{T, p.out_token_stride}, Dim{H, p.out_head_stride}, Dim{512, 1}}),
      extent_of(p.max_logits, 4, {Dim{T, p.max_logits_token_stride}, Dim{H, 1}}),
      extent_of(p.lse, 4, {Dim{T, p.lse_token_stride}, Dim{H, 1}})};
  const char* out_names[3] = {"out", "max_logits", "lse"};
  for (int o = 0; o < 3; ++o) {
    for (int o2 = o + 1; o2 < 3; ++o2)
      SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, out_names[o], out[o], out_names[o2], out[o2]));
    for (int i = 0; i < 5; ++i)
      SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, out_names[o], out[o], in_names[i], in[i]));
  }
  return Status::Ok();
}

Status sparse_mla_prefill(const SparsePrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::sparse_mla_prefill";
  SELKV_RETURN_IF_ERROR(check_sparse_mla_prefill(p));
  if (p.num_tokens == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));

  prefill::PrefillKernelParams k;
  k.q = static_cast<const uint16_t*>(p.q);
  k.q_token_stride = p.q_token_stride;
  k.q_head_stride = p.q_head_stride;
  k.num_tokens = p.num_tokens;
  k.num_heads = p.num_heads;
  k.head_groups = p.num_heads / prefill::kHeadsPerCta;
  k.kv = static_cast<const uint16_t*>(p.kv);
  k.kv_row_stride = p.kv_row_stride;
  k.num_kv = (p.kv != nullptr) ? p.num_kv : 0;  // null kv (allowed when topk == 0): nothing valid
  k.indices = p.indices;
  k.indices_token_stride = p.indices_token_stride;
  k.topk = p.topk;
  k.topk_length = p.topk_length;
  k.sm_scale = p.sm_scale;
  k.sm_scale_log2 = detail::sm_scale_log2(p.sm_scale);
  k.attn_sink = p.attn_sink;
  k.out = static_cast<uint16_t*>(p.out);
  k.out_token_stride = p.out_token_stride;
  k.out_head_stride = p.out_head_stride;
  k.max_logits = p.max_logits;
  k.max_logits_token_stride = p.max_logits_token_stride;
  k.lse = p.lse;
  k.lse_token_stride = p.lse_token_stride;
  k.num_tiles = p.num_tokens * k.head_groups;

  // Persistent: one CTA per SM (the kernel's shared-memory plan allows one), each looping over
  // tiles; the SM count is cached per device, so the launch stays free of per-call queries.
  int sms = 0;
  SELKV_RETURN_IF_ERROR(detail::device_sm_count(kOp, &sms));
  const int64_t grid = std::min<int64_t>(k.num_tiles, sms > 0 ? sms : 1);
  const cudaError_t err = detail::dispatch_value<576, 512>(
      p.d_qk, [&](auto d) { return prefill::sm90::launch_sparse_prefill_sm90<decltype(d)::value>(k, grid, stream); });
  return detail::cuda_status(err, kOp, "kernel launch");
}

}  // namespace selkv
