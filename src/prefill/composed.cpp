// Composed prefill paths (include/selkv/composed.h): C4 -> C7 and C3 -> C7 in one call.
//
// Both calls carve a caller workspace, fill the sub-ops' Params from the caller's, run every
// check (composed, C4/C3, C7) and the SM90 requirement before the first launch, then enqueue the
// two kernels on the same stream (stream order is the only dependency).
#include <cstdint>
#include <limits>
#include <string>

#include "cache/cache_checks.h"
#include "common/arch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/overlap.h"
#include "selkv/composed.h"
#include "selkv/dequant.h"

namespace selkv {
namespace {

constexpr int64_t kAlign = 256;
// Shapes past this many index entries are rejected (sizes below stay far from int64 overflow).
constexpr int64_t kMaxEntries = int64_t(1) << 50;

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// A sub-op's failure, reported under the composed op's name (the inner message names the
// sub-op and its argument): "selkv::dequant_sparse_mla_prefill: selkv::sparse_mla_prefill: q: ...".
Status wrap(const char* op, const Status& inner) {
  if (inner.ok()) return inner;
  return Status(inner.code(), detail::concat(op, ": ", inner.message()));
}

// attn fields the composed calls own: kv must be left unset by the caller.
Status check_attn_kv_unset(const char* kOp, const SparsePrefillParams& a, KvFormat format) {
  SELKV_CHECK_ARG(a.kv == nullptr, "attn.kv",
                  "must be null: the call points it at the bf16 rows it writes into the workspace");
  SELKV_CHECK_ARG(a.kv_row_stride == 0 && a.num_kv == 0, "attn.kv_row_stride/attn.num_kv",
                  "must be 0: the call sets them (got ", a.kv_row_stride, ", ", a.num_kv, ")");
  SELKV_CHECK_ARG(a.d_qk == fmt::dequant_dim(format), "attn.d_qk", "must be ",
                  fmt::dequant_dim(format), " for format ",
                  fmt::format_name(format), ", got ", a.d_qk);
  return Status::Ok();
}

// The caller's workspace [0, need) against the C7 tensors the caller owns (q, attn_sink, indices,
// topk_length, out, max_logits, lse): the sub-ops' own checks see only their part of the workspace.
Status check_workspace_disjoint(const char* kOp, const detail::Extent& ws, const SparsePrefillParams& a) {
  using detail::Dim;
  using detail::extent_of;
  const int64_t T = a.num_tokens, H = a.num_heads;
  if (T == 0) return Status::Ok();  // nothing runs
  const bool reads_indices = a.topk > 0;
  return detail::check_disjoint_from(
      kOp, "workspace", ws,
      {{"attn.q", extent_of(a.q, 2, {Dim{T, a.q_token_stride}, Dim{H, a.q_head_stride}, Dim{a.d_qk, 1}})},
       {"attn.attn_sink", extent_of(a.attn_sink, 4, {Dim{H, 1}})},
       {"attn.indices", reads_indices ? extent_of(a.indices, 4, {Dim{T, a.indices_token_stride}, Dim{a.topk, 1}})
                                      : detail::Extent{}},
       {"attn.topk_length", reads_indices ? extent_of(a.topk_length, 4, {Dim{T, 1}}) : detail::Extent{}},
       {"attn.out", extent_of(a.out, 2, {Dim{T, a.out_token_stride}, Dim{H, a.out_head_stride}, Dim{512, 1}})},
       {"attn.max_logits", extent_of(a.max_logits, 4, {Dim{T, a.max_logits_token_stride}, Dim{H, 1}})},
       {"attn.lse", extent_of(a.lse, 4, {Dim{T, a.lse_token_stride}, Dim{H, 1}})}});
}

// ---- (a) ------------------------------------------------------------------------------------------
struct DequantPlan {
  DequantSelectedParams c4;
  SparsePrefillParams c7;
};

int64_t dequant_rows_bytes(int64_t rows, KvFormat f) { return align_up(rows * fmt::dequant_dim(f) * 2); }

// Validates and fills both sub-op Params (nothing launched).
Status plan_dequant(const DequantPrefillParams& p, DequantPlan* plan) {
  constexpr const char* kOp = "selkv::dequant_sparse_mla_prefill";
  const SparsePrefillParams& a = p.attn;
  const KvFormat f = p.cache.format;
  SELKV_CHECK_ARG(composed_prefill_format(f), "cache.format", "must be ds_mla_fp8 or nope_fp8, got ",
                  fmt::format_name(f), " (", int(f), ")");
  SELKV_RETURN_IF_ERROR(check_attn_kv_unset(kOp, a, f));
  SELKV_CHECK_ARG(a.num_tokens >= 0, "attn.num_tokens", "must be >= 0, got ", a.num_tokens);
  SELKV_CHECK_ARG(a.topk >= 0 && a.topk % 64 == 0, "attn.topk",
                  "must be a non-negative multiple of 64, got ", a.topk);
  SELKV_CHECK_ARG(a.num_tokens <= kMaxEntries / (int64_t(a.topk) + 1), "attn.num_tokens",
                  "num_tokens * topk is too large (", a.num_tokens, " * ", a.topk, ")");
  SELKV_CHECK_ARG(p.cache.page_size >= 1, "cache.page_size", "must be >= 1, got ", p.cache.page_size);
  SELKV_CHECK_ARG(p.cache.num_blocks >= 0 && p.cache.num_blocks <= (int64_t(1) << 31) / p.cache.page_size,
                  "cache.num_blocks", "num_blocks * page_size must be in [0, 2^31], got ",
                  p.cache.num_blocks, " * ", p.cache.page_size);
  const int64_t P = p.cache.num_slots();
  const int64_t N = a.num_tokens * int64_t(a.topk);
  const int64_t rows = dequant_selected_workspace_rows(a.num_tokens, a.topk, P);
  const int64_t rows_bytes = dequant_rows_bytes(rows, f);
  const int64_t need = rows_bytes + align_up(N * 4);
  if (p.workspace_bytes < uint64_t(need)) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": workspace_bytes: need ", need, " bytes (", rows,
                                 " bf16 rows of ", fmt::dequant_dim(f), " + ", N,
                                 " int32 remapped indices), got ", p.workspace_bytes));
  }
  if (need > 0) {
    SELKV_CHECK_ARG(p.workspace != nullptr, "workspace", "must not be null");
    SELKV_CHECK_ARG(aligned(p.workspace, 16), "workspace", "must be 16-byte aligned");
  }
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  int32_t* remapped = N > 0 ? reinterpret_cast<int32_t*>(ws + rows_bytes) : nullptr;

  DequantSelectedParams& c4 = plan->c4;
  c4 = DequantSelectedParams{};
  c4.cache = p.cache;
  c4.indices = a.indices;
  c4.indices_row_stride = a.indices_token_stride;
  c4.topk_length = a.topk_length;
  c4.num_tokens = a.num_tokens;
  c4.topk = a.topk;
  c4.workspace = rows > 0 ? ws : nullptr;
  c4.workspace_rows = rows;
  c4.workspace_row_stride = fmt::dequant_dim(f);
  c4.out_indices = remapped;
  c4.out_indices_row_stride = a.topk;
  SELKV_RETURN_IF_ERROR(wrap(kOp, check_dequant_selected(c4)));

  SparsePrefillParams& c7 = plan->c7;
  c7 = a;
  c7.kv = rows > 0 ? ws : nullptr;
  c7.kv_row_stride = fmt::dequant_dim(f);
  c7.num_kv = rows;
  c7.indices = remapped;
  c7.indices_token_stride = a.topk;
  // topk_length stays: C4 writes -1 past it, C7 does not even read there.
  SELKV_RETURN_IF_ERROR(wrap(kOp, check_sparse_mla_prefill(c7)));
  return check_workspace_disjoint(kOp, detail::byte_range(p.workspace, need), a);
}

// ---- (b) ------------------------------------------------------------------------------------------
struct GatherPlan {
  GatherKvParams c3;
  SparsePrefillParams c7;
  bool gather = false;
};

Status plan_gather(const GatherPrefillParams& p, GatherPlan* plan) {
  constexpr const char* kOp = "selkv::gather_sparse_mla_prefill";
  const SparsePrefillParams& a = p.attn;
  const KvFormat f = p.gather.format;
  SELKV_CHECK_ARG(composed_prefill_format(f), "gather.format", "must be ds_mla_fp8 or nope_fp8, got ",
                  fmt::format_name(f), " (", int(f), ")");
  SELKV_RETURN_IF_ERROR(check_attn_kv_unset(kOp, a, f));
  SELKV_CHECK_ARG(p.gather.out == nullptr && p.gather.out_row_stride == 0 && p.gather.out_rows == 0,
                  "gather.out/out_row_stride/out_rows",
                  "must be null / 0: the call gathers into the workspace");
  SELKV_CHECK_ARG(p.num_kv_rows >= 0 && p.num_kv_rows <= kMaxEntries, "num_kv_rows",
                  "must be in [0, 2^50], got ", p.num_kv_rows);
  const int D = fmt::dequant_dim(f);
  const int64_t need = align_up(p.num_kv_rows * D * 2);
  if (p.workspace_bytes < uint64_t(need)) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": workspace_bytes: need ", need, " bytes (", p.num_kv_rows,
                                 " bf16 rows of ", D, "), got ", p.workspace_bytes));
  }
  if (need > 0) {
    SELKV_CHECK_ARG(p.workspace != nullptr, "workspace", "must not be null");
    SELKV_CHECK_ARG(aligned(p.workspace, 16), "workspace", "must be 16-byte aligned");
  }
  void* ws = need > 0 ? p.workspace : nullptr;

  GatherKvParams& c3 = plan->c3;
  c3 = p.gather;
  c3.out = ws;
  c3.out_row_stride = D;
  c3.out_rows = p.num_kv_rows;
  cache::Work work = cache::Work::kNone;
  SELKV_RETURN_IF_ERROR(wrap(kOp, cache::check_gather_kv(c3, &work)));
  plan->gather = work == cache::Work::kLaunch;

  SparsePrefillParams& c7 = plan->c7;
  c7 = a;
  c7.kv = ws;
  c7.kv_row_stride = D;
  c7.num_kv = p.num_kv_rows;
  SELKV_RETURN_IF_ERROR(wrap(kOp, check_sparse_mla_prefill(c7)));
  return check_workspace_disjoint(kOp, detail::byte_range(ws, need), a);
}

}  // namespace

size_t dequant_prefill_workspace_size(int64_t num_tokens, int32_t topk, int64_t num_slots,
                                      KvFormat format) {
  if (!composed_prefill_format(format) || num_tokens < 0 || topk < 0 ||
      num_tokens > kMaxEntries / (int64_t(topk) + 1))
    return std::numeric_limits<size_t>::max();  // no call accepts these shapes
  const int64_t N = num_tokens * int64_t(topk);
  const int64_t rows = dequant_selected_workspace_rows(num_tokens, topk, num_slots);
  return size_t(dequant_rows_bytes(rows, format) + align_up(N * 4));
}

size_t gather_prefill_workspace_size(int64_t num_kv_rows, KvFormat format) {
  if (!composed_prefill_format(format) || num_kv_rows < 0 || num_kv_rows > kMaxEntries)
    return std::numeric_limits<size_t>::max();
  return size_t(align_up(num_kv_rows * fmt::dequant_dim(format) * 2));
}

Status check_dequant_sparse_mla_prefill(const DequantPrefillParams& p) {
  DequantPlan plan;
  return plan_dequant(p, &plan);
}

Status check_gather_sparse_mla_prefill(const GatherPrefillParams& p) {
  GatherPlan plan;
  return plan_gather(p, &plan);
}

Status dequant_sparse_mla_prefill(const DequantPrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::dequant_sparse_mla_prefill";
  DequantPlan plan;
  SELKV_RETURN_IF_ERROR(plan_dequant(p, &plan));
  if (p.attn.num_tokens == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));
  SELKV_RETURN_IF_ERROR(wrap(kOp, dequant_selected_kv(plan.c4, stream)));
  return wrap(kOp, sparse_mla_prefill(plan.c7, stream));
}

Status gather_sparse_mla_prefill(const GatherPrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::gather_sparse_mla_prefill";
  GatherPlan plan;
  SELKV_RETURN_IF_ERROR(plan_gather(p, &plan));
  if (p.attn.num_tokens == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));
  if (plan.gather) SELKV_RETURN_IF_ERROR(wrap(kOp, gather_kv_bf16(plan.c3, stream)));
  return wrap(kOp, sparse_mla_prefill(plan.c7, stream));
}

}  // namespace selkv
