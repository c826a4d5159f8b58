// C8 GPU entry points (include/selkv/qsa.h): the argument checks (shared with the oracle,
// qsa_checks.cpp), the routing between the kernels, and the launches.
//
// Routing. The page-4 kernel (SM90) takes large batches of wide selections: rows >=
// kQsaPage4MinRows, max_blocks >= kQsaPage4MinBlocks, a plan passed in p.metadata, neither
// p.force_simple nor SELKV_QSA_PAGE4=0; every other call runs the exact
// simple kernel, which walks the selection itself and needs no plan. The plan is the group plan
// (qsa_plan = qsa::qsa_group_plan for the route's grouping, src/qsa/qsa_group_layout.h). That
// route is the page-4 kernel, then a fix-up pass of the simple kernel over the (row, kv head)s the
// page-4 kernel flags (non-finite out): rows the group plan marks bad, a plan that does not match
// the call, and a non-finite V of another row's token.
#include <cstdlib>
#include <cstring>

#include "common/arch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/resident_ctas.h"  // device_sm_count
#include "common/sm_scale.h"
#include "qsa/qsa_checks.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_group_plan.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_page4.h"
#include "qsa/qsa_simple.h"
#include "selkv/qsa.h"

namespace selkv {
static_assert(qsa::kQsaWarpMaxChunks * qsa::kQsaWarpChunkCols >= qsa_expanded_cols(kQsaMaxBlocks) &&
                  (qsa::kQsaWarpMaxChunks - 1) * qsa::kQsaWarpChunkCols < qsa_expanded_cols(kQsaMaxBlocks),
              "the simple kernel's chunk bitmap covers the widest selection");
namespace {

qsa::QsaSelectionParams selection_params(const QsaSparsePrefillParams& p) {
  qsa::QsaSelectionParams s{};
  s.num_rows = int32_t(p.num_rows);
  s.max_blocks = p.max_blocks;
  s.compact = p.form == QsaSelectionForm::kCompact;
  s.selection = p.selection;
  s.selection_stride = p.selection_stride;
  s.block_ids = p.block_ids;
  s.block_ids_stride = p.block_ids_stride;
  s.block_counts = p.block_counts;
  s.req_ids = p.req_ids;
  s.positions = p.positions;
  s.seq_lens = p.seq_lens;
  s.block_table = p.block_table;
  s.block_table_stride = p.block_table_stride;
  s.num_req = p.num_req;
  s.block_table_width = p.block_table_width;
  s.page_size = p.page_size;
  s.num_pages = p.num_pages;
  return s;
}

bool page4_disabled_by_env() {
  const char* v = std::getenv("SELKV_QSA_PAGE4");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

bool qsa_page4_wanted(int64_t num_rows, int64_t max_blocks) {
  return !page4_disabled_by_env() && num_rows >= kQsaPage4MinRows && max_blocks >= kQsaPage4MinBlocks;
}

bool qsa_page4_wanted(const QsaSparsePrefillParams& p) {
  return !p.force_simple && p.metadata != nullptr && qsa_page4_wanted(p.num_rows, p.max_blocks);
}

QsaKernel qsa_route(const QsaSparsePrefillParams& p) {
  return qsa_page4_wanted(p) ? QsaKernel::kPage4 : QsaKernel::kSimple;
}

namespace qsa {
namespace {

QsaAttnIo attn_io(const QsaSparsePrefillParams& p) {
  QsaAttnIo io{};
  io.q = p.q;
  io.q_row_stride = p.q_row_stride;
  io.q_head_stride = p.q_head_stride;
  io.k = p.k_cache.data;
  io.k_page_stride = p.k_cache.page_stride;
  io.k_slot_stride = p.k_cache.slot_stride;
  io.k_head_stride = p.k_cache.head_stride;
  io.v = p.v_cache.data;
  io.v_page_stride = p.v_cache.page_stride;
  io.v_slot_stride = p.v_cache.slot_stride;
  io.v_head_stride = p.v_cache.head_stride;
  io.scale_log2 = detail::sm_scale_log2(p.scale);
  io.out = p.out;
  io.out_row_stride = p.out_row_stride;
  io.out_head_stride = p.out_head_stride;
  io.lse = p.lse;
  io.lse_row_stride = p.lse_row_stride;
  io.lse_head_stride = p.lse_head_stride;
  return io;
}

QsaSimpleParams simple_params(const QsaSparsePrefillParams& p) {
  QsaSimpleParams k{};
  k.sel = selection_params(p);
  k.num_kv_heads = p.num_kv_heads;
  k.group = p.num_q_heads / p.num_kv_heads;
  k.io = attn_io(p);
  return k;
}

cudaError_t launch_page4(const QsaPage4Params& k, int ctas, bool bf16, int head_dim, cudaStream_t stream) {
  if (head_dim == 256)
    return bf16 ? launch_qsa_page4<__nv_bfloat16, 256>(k, ctas, stream) : launch_qsa_page4<__half, 256>(k, ctas, stream);
  if (head_dim == 128)
    return bf16 ? launch_qsa_page4<__nv_bfloat16, 128>(k, ctas, stream) : launch_qsa_page4<__half, 128>(k, ctas, stream);
  return cudaErrorInvalidValue;
}

// The page-4 route's launches after every check (p valid, rows > 0, a plan, rows_per_cta in
// range, an SM90 device): the page-4 kernel, then the fix-up pass of the simple kernel.
Status run_page4(const char* kOp, const QsaSparsePrefillParams& p, int rows_per_cta, cudaStream_t stream) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const bool bf16 = p.dtype == QsaDtype::kBf16;
  QsaPage4Params k{};
  k.md = static_cast<const int32_t*>(p.metadata);
  k.num_rows = int32_t(p.num_rows);
  k.max_blocks = p.max_blocks;
  k.num_kv_heads = p.num_kv_heads;
  k.group = group;
  k.rows_per_cta = rows_per_cta == 0 ? qsa_page4_max_rows(group) : rows_per_cta;
  k.page_size = p.page_size;
  k.num_pages = p.num_pages;
  k.io = attn_io(p);
  k.split_ws = p.workspace;
  // One CTA an SM; without a workspace no more than the units (a CTA takes whole ones).
  int sms = 0;
  SELKV_RETURN_IF_ERROR(detail::device_sm_count(kOp, &sms));
  const int64_t units = (p.num_rows + k.rows_per_cta - 1) / k.rows_per_cta * p.num_kv_heads;
  int64_t ctas = sms < kQsaPage4MaxCtas ? sms : kQsaPage4MaxCtas;
  if (k.split_ws == nullptr && units < ctas) ctas = units;
  SELKV_CUDA_RETURN(launch_page4(k, int(ctas), bf16, p.head_dim, stream), kOp);
  QsaSimpleParams fix = simple_params(p);
  fix.only_nonfinite = true;
  SELKV_CUDA_RETURN(launch_qsa_simple(fix, bf16, p.head_dim, stream), kOp);
  return Status::Ok();
}

}  // namespace

Status qsa_sparse_prefill_page4(const QsaSparsePrefillParams& p, cudaStream_t stream, int rows_per_cta) {
  constexpr const char* kOp = "selkv::qsa_sparse_prefill (page-4)";
  Work work;
  SELKV_RETURN_IF_ERROR(check_params(kOp, p, Use::kAttention, /*device=*/true, &work));
  if (work == Work::kNone) return Status::Ok();
  // (check_params has checked metadata_bytes against qsa_metadata_size, the group plan's size.)
  const int group = p.num_q_heads / p.num_kv_heads, max_rows = qsa_page4_max_rows(group);
  SELKV_CHECK_ARG(p.metadata != nullptr, "metadata", "the page-4 kernel needs the plan of qsa_plan, got null");
  SELKV_CHECK_ARG(rows_per_cta >= 0 && rows_per_cta <= max_rows, "rows_per_cta", "must be 0 (default) or in [1, ",
                  max_rows, "] for num_q_heads / num_kv_heads = ", group, ", got ", rows_per_cta);
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));
  return run_page4(kOp, p, rows_per_cta, stream);
}

Status qsa_sparse_prefill_simt(const QsaSparsePrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::qsa_sparse_prefill (SIMT)";
  Work work;
  SELKV_RETURN_IF_ERROR(check_params(kOp, p, Use::kAttention, /*device=*/true, &work));
  if (work == Work::kNone) return Status::Ok();
  SELKV_CUDA_RETURN(launch_qsa_simple_simt(simple_params(p), p.dtype == QsaDtype::kBf16, p.head_dim, stream), kOp);
  return Status::Ok();
}

}  // namespace qsa

Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::qsa_sparse_prefill";
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(qsa::check_params(kOp, p, qsa::Use::kAttention, /*device=*/true, &work));
  if (work == qsa::Work::kNone) return Status::Ok();
  // The page-4 kernel is SM90 only; other GPUs keep the simple kernel. (The route implies a plan;
  // rows_per_cta is the default.)
  if (qsa_route(p) == QsaKernel::kPage4 && detail::require_sm90(kOp).ok()) return qsa::run_page4(kOp, p, 0, stream);
  SELKV_CUDA_RETURN(qsa::launch_qsa_simple(qsa::simple_params(p), p.dtype == QsaDtype::kBf16, p.head_dim, stream),
                    kOp);
  return Status::Ok();
}

namespace qsa {
namespace {

// The argument checks of qsa_plan (metadata_bytes against qsa_metadata_size, the group plan's
// size), then the group plan kernel; rows_per_group 0: the page-4 route's grouping
// (qsa_page4_max_rows of p's Hq / Hkv, known once the checks passed).
Status plan_groups(const char* kOp, const QsaSparsePrefillParams& p, int rows_per_group, bool hand_over, void* group_plan,
                   size_t group_plan_bytes, cudaStream_t stream) {
  Work work;
  SELKV_RETURN_IF_ERROR(check_params(kOp, p, Use::kPlan, /*device=*/true, &work, group_plan, group_plan_bytes));
  if (work == Work::kNone) return Status::Ok();
  if (rows_per_group == 0) rows_per_group = qsa_page4_max_rows(int(p.num_q_heads / p.num_kv_heads));
  SELKV_CUDA_RETURN(
      launch_qsa_group_plan(selection_params(p), rows_per_group, hand_over, static_cast<int32_t*>(group_plan), stream), kOp);
  return Status::Ok();
}

}  // namespace

Status qsa_group_plan(const QsaSparsePrefillParams& p, int rows_per_group, void* group_plan, size_t group_plan_bytes,
                      cudaStream_t stream, bool hand_over) {
  constexpr const char* kOp = "selkv::qsa_group_plan";
  SELKV_CHECK_ARG(rows_per_group >= 1 && rows_per_group <= kGroupMaxRows, "rows_per_group", "must be in [1, ",
                  kGroupMaxRows, "], got ", rows_per_group);
  return plan_groups(kOp, p, rows_per_group, hand_over, group_plan, group_plan_bytes, stream);
}

}  // namespace qsa

Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes, cudaStream_t stream) {
  return qsa::plan_groups("selkv::qsa_plan", p, 0, /*hand_over=*/true, metadata, metadata_bytes, stream);
}

}  // namespace selkv
