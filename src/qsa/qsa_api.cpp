// C8 GPU entry points (include/selkv/qsa.h): the argument checks (shared with the oracle,
// qsa_checks.cpp), the routing between the kernels, and the launches.
//
// Routing. The page-4 kernel (SM90, reads the plan of qsa_plan) is for large batches: rows >=
// kQsaPage4MinRows, a plan passed in p.metadata, neither p.force_simple nor SELKV_QSA_PAGE4=0.
// It is not built yet (kPage4Built), so every call runs the exact simple kernel, which walks the
// selection itself and needs no plan. When the page-4 kernel lands it must still serve the rows
// the plan flags irregular (counts = -1) exactly, e.g. by a simple-kernel pass over those rows.
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/sm_scale.h"
#include "qsa/qsa_checks.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_plan.h"
#include "qsa/qsa_simple.h"
#include "selkv/qsa.h"

namespace selkv {
namespace {

constexpr bool kPage4Built = false;  // the SM90 page-4 kernel (a later task)

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

bool qsa_page4_wanted(const QsaSparsePrefillParams& p) {
  return !p.force_simple && !page4_disabled_by_env() && p.num_rows >= kQsaPage4MinRows && p.metadata != nullptr;
}

QsaKernel qsa_route(const QsaSparsePrefillParams& p) {
  return kPage4Built && qsa_page4_wanted(p) ? QsaKernel::kPage4 : QsaKernel::kSimple;
}

Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::qsa_sparse_prefill";
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(qsa::check_params(kOp, p, qsa::Use::kAttention, /*device=*/true, &work));
  if (work == qsa::Work::kNone) return Status::Ok();
  // qsa_route(p) == kPage4 cannot happen until the page-4 kernel exists; its launch goes here.
  qsa::QsaSimpleParams k{};
  k.sel = selection_params(p);
  k.num_kv_heads = p.num_kv_heads;
  k.group = p.num_q_heads / p.num_kv_heads;
  k.q = p.q;
  k.q_row_stride = p.q_row_stride;
  k.q_head_stride = p.q_head_stride;
  k.k = p.k_cache.data;
  k.k_page_stride = p.k_cache.page_stride;
  k.k_slot_stride = p.k_cache.slot_stride;
  k.k_head_stride = p.k_cache.head_stride;
  k.v = p.v_cache.data;
  k.v_page_stride = p.v_cache.page_stride;
  k.v_slot_stride = p.v_cache.slot_stride;
  k.v_head_stride = p.v_cache.head_stride;
  k.scale_log2 = detail::sm_scale_log2(p.scale);
  k.out = p.out;
  k.out_row_stride = p.out_row_stride;
  k.out_head_stride = p.out_head_stride;
  k.lse = p.lse;
  k.lse_row_stride = p.lse_row_stride;
  k.lse_head_stride = p.lse_head_stride;
  SELKV_CUDA_RETURN(qsa::launch_qsa_simple(k, p.dtype == QsaDtype::kBf16, p.head_dim, stream), kOp);
  return Status::Ok();
}

Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::qsa_plan";
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(
      qsa::check_params(kOp, p, qsa::Use::kPlan, /*device=*/true, &work, metadata, metadata_bytes));
  if (work == qsa::Work::kNone) return Status::Ok();
  SELKV_CUDA_RETURN(qsa::launch_qsa_plan(selection_params(p), static_cast<int32_t*>(metadata), stream), kOp);
  return Status::Ok();
}

}  // namespace selkv
