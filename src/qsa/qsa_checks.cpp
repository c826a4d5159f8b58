// C8 argument rules and the plan size (include/selkv/qsa.h). Built into the pure-C++ library
// selkv_reference, so the GPU launchers and the oracle share one definition.
#include "qsa/qsa_checks.h"

#include <cstdint>
#include <utility>

#include "common/check.h"
#include "common/overlap.h"
#include "common/sm_scale.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_kernel_params.h"  // qsa_page4_split_bytes

namespace selkv {
namespace {

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

int64_t elem_bytes(QsaDtype) { return 2; }

}  // namespace

size_t qsa_workspace_size(int64_t head_dim) {
  return head_dim == 128 || head_dim == 256 ? size_t(qsa::qsa_page4_split_bytes(head_dim)) : 0;
}

size_t qsa_metadata_size(int64_t num_rows, int64_t max_blocks) {
  if (num_rows <= 0 || num_rows >= (int64_t(1) << 31) || max_blocks < 1 || max_blocks > kQsaMaxBlocks) return 0;
  return size_t(qsa::group_plan_words(num_rows, max_blocks)) * sizeof(int32_t);
}

namespace qsa {

Status check_params(const char* op, const QsaSparsePrefillParams& p, Use use, bool device, Work* work,
                    const void* metadata, size_t metadata_bytes) {
  const char* kOp = op;
  *work = Work::kNone;
  const bool attn = use == Use::kAttention;
  // ---- shape ----
  SELKV_CHECK_ARG(p.dtype == QsaDtype::kFp16 || p.dtype == QsaDtype::kBf16, "dtype",
                  "must be kFp16 or kBf16, got ", int(p.dtype));
  SELKV_CHECK_ARG(p.num_rows >= 0, "num_rows", "must be >= 0, got ", p.num_rows);
  SELKV_CHECK_ARG(p.num_q_heads >= 1, "num_q_heads", "must be >= 1, got ", p.num_q_heads);
  SELKV_CHECK_ARG(p.num_kv_heads >= 1, "num_kv_heads", "must be >= 1, got ", p.num_kv_heads);
  SELKV_CHECK_ARG(p.num_q_heads % p.num_kv_heads == 0, "num_kv_heads", "must divide num_q_heads (",
                  p.num_q_heads, "), got ", p.num_kv_heads);
  SELKV_CHECK_ARG(p.num_q_heads / p.num_kv_heads <= kQsaMaxGroup, "num_q_heads",
                  "num_q_heads / num_kv_heads must be in [1, ", kQsaMaxGroup, "], got ", p.num_q_heads, " / ",
                  p.num_kv_heads);
  SELKV_CHECK_ARG(p.head_dim == 128 || p.head_dim == 256, "head_dim", "must be 128 or 256, got ", p.head_dim);
  // Row indices are 32-bit on the device.
  SELKV_CHECK_ARG(p.num_rows < (int64_t(1) << 31) / p.num_q_heads, "num_rows",
                  "num_rows * num_q_heads must be < 2^31, got ", p.num_rows, " * ", p.num_q_heads);
  SELKV_CHECK_ARG(p.page_size >= kQsaBlockTokens && p.page_size % kQsaBlockTokens == 0 &&
                      p.page_size <= (int32_t(1) << 24),
                  "page_size", "must be a positive multiple of 4 up to 2^24, got ", p.page_size);
  SELKV_CHECK_ARG(p.num_pages >= 0, "num_pages", "must be >= 0, got ", p.num_pages);
  SELKV_CHECK_ARG(p.num_req >= 0, "num_req", "must be >= 0, got ", p.num_req);
  SELKV_CHECK_ARG(p.block_table_width >= 0, "block_table_width", "must be >= 0, got ", p.block_table_width);
  SELKV_CHECK_ARG(p.form == QsaSelectionForm::kExpanded || p.form == QsaSelectionForm::kCompact, "form",
                  "must be kExpanded or kCompact, got ", int(p.form));
  SELKV_CHECK_ARG(p.max_blocks >= 1 && p.max_blocks <= kQsaMaxBlocks, "max_blocks", "must be in [1, ",
                  kQsaMaxBlocks, "], got ", p.max_blocks);
  if (attn) SELKV_RETURN_IF_ERROR(detail::check_sm_scale(kOp, p.scale, "scale"));
  if (p.num_rows == 0) return Status::Ok();  // no rows: nothing is read or written

  // ---- pointers and strides ----
  const bool compact = p.form == QsaSelectionForm::kCompact;
  const int64_t sel_cols = compact ? p.max_blocks : qsa_expanded_cols(p.max_blocks);
  SELKV_CHECK_ARG(p.req_ids != nullptr, "req_ids", "must not be null");
  SELKV_CHECK_ARG(p.positions != nullptr, "positions", "must not be null");
  if (compact) {
    SELKV_CHECK_ARG(p.block_ids != nullptr, "block_ids", "must not be null (compact form)");
    SELKV_CHECK_ARG(p.block_counts != nullptr, "block_counts", "must not be null (compact form)");
    SELKV_CHECK_ARG(p.block_ids_stride >= 0, "block_ids_stride", "must be >= 0, got ", p.block_ids_stride);
  } else {
    SELKV_CHECK_ARG(p.selection != nullptr, "selection", "must not be null (expanded form)");
    SELKV_CHECK_ARG(p.selection_stride >= 0, "selection_stride", "must be >= 0, got ", p.selection_stride);
  }
  if (p.num_req > 0) SELKV_CHECK_ARG(p.seq_lens != nullptr, "seq_lens", "must not be null when num_req > 0");
  const bool has_table = p.num_req > 0 && p.block_table_width > 0;
  if (has_table) {
    SELKV_CHECK_ARG(p.block_table != nullptr, "block_table", "must not be null when num_req and width are > 0");
    SELKV_CHECK_ARG(p.block_table_stride >= 0, "block_table_stride", "must be >= 0, got ", p.block_table_stride);
  }
  if (attn) {
    SELKV_CHECK_ARG(p.q != nullptr, "q", "must not be null");
    SELKV_CHECK_ARG(p.out != nullptr, "out", "must not be null");
    SELKV_CHECK_ARG(p.q_row_stride >= 0 && p.q_head_stride >= 0, "q", "strides must be >= 0, got (",
                    p.q_row_stride, ", ", p.q_head_stride, ")");
    SELKV_CHECK_ARG(p.out_row_stride >= 0 && p.out_head_stride >= 0, "out", "strides must be >= 0, got (",
                    p.out_row_stride, ", ", p.out_head_stride, ")");
    SELKV_CHECK_ARG(p.lse_row_stride >= 0 && p.lse_head_stride >= 0, "lse", "strides must be >= 0, got (",
                    p.lse_row_stride, ", ", p.lse_head_stride, ")");
    const QsaCacheView* views[2] = {&p.k_cache, &p.v_cache};
    const char* names[2] = {"k_cache", "v_cache"};
    for (int i = 0; i < 2; ++i) {
      const QsaCacheView& c = *views[i];
      if (p.num_pages > 0) SELKV_CHECK_ARG(c.data != nullptr, names[i], "must not be null when num_pages > 0");
      SELKV_CHECK_ARG(c.page_stride >= 0 && c.slot_stride >= 0 && c.head_stride >= 0, names[i],
                      "strides must be >= 0, got (", c.page_stride, ", ", c.slot_stride, ", ", c.head_stride, ")");
    }
    if (p.metadata != nullptr) {
      const size_t need = qsa_metadata_size(p.num_rows, p.max_blocks);
      if (p.metadata_bytes < need)
        return Status(StatusCode::kWorkspaceTooSmall,
                      detail::concat(kOp, ": metadata_bytes: needs ", need, " bytes (qsa_metadata_size(",
                                     p.num_rows, ", ", p.max_blocks, ")), got ", p.metadata_bytes));
    }
    if (p.workspace != nullptr) {
      const size_t need = qsa_workspace_size(p.head_dim);
      if (p.workspace_bytes < need)
        return Status(StatusCode::kWorkspaceTooSmall,
                      detail::concat(kOp, ": workspace_bytes: needs ", need, " bytes (qsa_workspace_size(",
                                     p.head_dim, ")), got ", p.workspace_bytes));
    }
  } else {
    const size_t need = qsa_metadata_size(p.num_rows, p.max_blocks);
    if (metadata_bytes < need)
      return Status(StatusCode::kWorkspaceTooSmall,
                    detail::concat(kOp, ": metadata_bytes: needs ", need, " bytes (qsa_metadata_size(",
                                   p.num_rows, ", ", p.max_blocks, ")), got ", metadata_bytes));
    SELKV_CHECK_ARG(metadata != nullptr, "metadata", "must not be null");
  }

  // ---- device alignment ----
  if (device) {
    const int64_t vec = 16 / elem_bytes(p.dtype);
    if (attn) {
      SELKV_CHECK_ARG(aligned(p.q, 16), "q", "must be 16-byte aligned");
      SELKV_CHECK_ARG(aligned(p.out, 16), "out", "must be 16-byte aligned");
      SELKV_CHECK_ARG(aligned(p.k_cache.data, 16), "k_cache", "must be 16-byte aligned");
      SELKV_CHECK_ARG(aligned(p.v_cache.data, 16), "v_cache", "must be 16-byte aligned");
      SELKV_CHECK_ARG(aligned(p.lse, 4), "lse", "must be 4-byte aligned");
      SELKV_CHECK_ARG(p.q_row_stride % vec == 0 && p.q_head_stride % vec == 0, "q",
                      "strides must be multiples of 16 bytes (", vec, " elements), got (", p.q_row_stride, ", ",
                      p.q_head_stride, ")");
      SELKV_CHECK_ARG(p.out_row_stride % vec == 0 && p.out_head_stride % vec == 0, "out",
                      "strides must be multiples of 16 bytes (", vec, " elements), got (", p.out_row_stride, ", ",
                      p.out_head_stride, ")");
      const QsaCacheView* views[2] = {&p.k_cache, &p.v_cache};
      const char* names[2] = {"k_cache", "v_cache"};
      for (int i = 0; i < 2; ++i) {
        const QsaCacheView& c = *views[i];
        SELKV_CHECK_ARG(c.page_stride % vec == 0 && c.slot_stride % vec == 0 && c.head_stride % vec == 0, names[i],
                        "strides must be multiples of 16 bytes (", vec, " elements), got (", c.page_stride, ", ",
                        c.slot_stride, ", ", c.head_stride, ")");
      }
      SELKV_CHECK_ARG(aligned(p.metadata, 16), "metadata", "must be 16-byte aligned");
      SELKV_CHECK_ARG(aligned(p.workspace, 16), "workspace", "must be 16-byte aligned");
    } else {
      SELKV_CHECK_ARG(aligned(metadata, 16), "metadata", "must be 16-byte aligned");
    }
    SELKV_CHECK_ARG(aligned(p.req_ids, 4), "req_ids", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.positions, 4), "positions", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.seq_lens, 4), "seq_lens", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.block_table, 4), "block_table", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.selection, 4), "selection", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.block_ids, 4), "block_ids", "must be 4-byte aligned");
    SELKV_CHECK_ARG(aligned(p.block_counts, 4), "block_counts", "must be 4-byte aligned");
  }

  // ---- overlaps (DESIGN §2): outputs against each other and every input ----
  using detail::Dim;
  using detail::Extent;
  using detail::extent_of;
  const int64_t R = p.num_rows, es = elem_bytes(p.dtype);
  const Extent e_req = extent_of(p.req_ids, 4, {Dim{R, 1}});
  const Extent e_pos = extent_of(p.positions, 4, {Dim{R, 1}});
  const Extent e_sel = compact ? extent_of(p.block_ids, 4, {Dim{R, p.block_ids_stride}, Dim{sel_cols, 1}})
                               : extent_of(p.selection, 4, {Dim{R, p.selection_stride}, Dim{sel_cols, 1}});
  const Extent e_cnt = compact ? extent_of(p.block_counts, 4, {Dim{R, 1}}) : Extent{};
  const Extent e_len = extent_of(p.seq_lens, 4, {Dim{p.num_req, 1}});
  const Extent e_tab = has_table ? extent_of(p.block_table, 4, {Dim{p.num_req, p.block_table_stride},
                                                                 Dim{p.block_table_width, 1}})
                                 : Extent{};
  const char* sel_name = compact ? "block_ids" : "selection";
  if (!attn) {
    const Extent e_md = detail::byte_range(metadata, int64_t(qsa_metadata_size(R, p.max_blocks)));
    SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
        kOp, "metadata", e_md,
        {{"req_ids", e_req}, {"positions", e_pos}, {sel_name, e_sel}, {"block_counts", e_cnt},
         {"seq_lens", e_len}, {"block_table", e_tab}}));
    *work = Work::kLaunch;
    return Status::Ok();
  }
  const int64_t Hq = p.num_q_heads, D = p.head_dim;
  const Dim out_dims[3] = {{R, p.out_row_stride}, {Hq, p.out_head_stride}, {D, 1}};
  SELKV_RETURN_IF_ERROR(detail::check_no_self_overlap(kOp, "out", {out_dims[0], out_dims[1], out_dims[2]}));
  if (p.lse != nullptr)
    SELKV_RETURN_IF_ERROR(
        detail::check_no_self_overlap(kOp, "lse", {Dim{R, p.lse_row_stride}, Dim{Hq, p.lse_head_stride}}));
  const Extent e_out = extent_of(p.out, es, {out_dims[0], out_dims[1], out_dims[2]});
  const Extent e_lse = extent_of(p.lse, 4, {Dim{R, p.lse_row_stride}, Dim{Hq, p.lse_head_stride}});
  const Extent e_q = extent_of(p.q, es, {Dim{R, p.q_row_stride}, Dim{Hq, p.q_head_stride}, Dim{D, 1}});
  auto cache_extent = [&](const QsaCacheView& c) {
    return extent_of(c.data, es, {Dim{p.num_pages, c.page_stride}, Dim{p.page_size, c.slot_stride},
                                  Dim{p.num_kv_heads, c.head_stride}, Dim{D, 1}});
  };
  const Extent e_k = cache_extent(p.k_cache), e_v = cache_extent(p.v_cache);
  const Extent e_md = p.metadata != nullptr
                          ? detail::byte_range(p.metadata, int64_t(qsa_metadata_size(R, p.max_blocks)))
                          : Extent{};
  const Extent e_ws =
      p.workspace != nullptr ? detail::byte_range(p.workspace, int64_t(qsa_workspace_size(D))) : Extent{};
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, "lse", e_lse, "out", e_out));
  for (const auto& [name, ext] : {std::pair<const char*, const Extent&>{"out", e_out}, {"lse", e_lse}}) {
    SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
        kOp, name, ext,
        {{"q", e_q}, {"k_cache", e_k}, {"v_cache", e_v}, {"req_ids", e_req}, {"positions", e_pos},
         {sel_name, e_sel}, {"block_counts", e_cnt}, {"seq_lens", e_len}, {"block_table", e_tab},
         {"metadata", e_md}, {"workspace", e_ws}}));
  }
  // The workspace is written too: apart from every input.
  SELKV_RETURN_IF_ERROR(detail::check_disjoint_from(
      kOp, "workspace", e_ws,
      {{"q", e_q}, {"k_cache", e_k}, {"v_cache", e_v}, {"req_ids", e_req}, {"positions", e_pos},
       {sel_name, e_sel}, {"block_counts", e_cnt}, {"seq_lens", e_len}, {"block_table", e_tab},
       {"metadata", e_md}}));
  *work = Work::kLaunch;
  return Status::Ok();
}

}  // namespace qsa

Status check_qsa_sparse_prefill(const QsaSparsePrefillParams& p) {
  qsa::Work work;
  return qsa::check_params("selkv::qsa_sparse_prefill", p, qsa::Use::kAttention, /*device=*/true, &work);
}

}  // namespace selkv
