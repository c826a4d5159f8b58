// torch ops for C8 (include/selkv/qsa.h): selkv::qsa_sparse_prefill, selkv::qsa_metadata_size,
// selkv::qsa_workspace_size, selkv::qsa_page4_wanted (whether a call of that shape with a plan takes the page-4 route),
// selkv::qsa_plan.
// qsa_sparse_prefill, out-variant: q [R, Hq, D] (fp16 / bf16), k_cache and v_cache
// [num_pages, P, Hkv, D] views with any strides and a dense last dim (an interleaved
// [pages, 2, P, Hkv, D] buffer is passed as its two views [:, 0] and [:, 1]), int32 block_table
// [num_req, width], seq_lens [num_req], req_ids [R], positions [R], and the selection in one of
// its two forms: expanded int32 selection [R, 4K + 3], or compact int32 block_ids [R, K] with
// block_counts [R]. out [R, Hq, D] of q's dtype, optional fp32 lse [R, Hq], optional uint8
// metadata (the page-4 plan of qsa_plan; None = no plan) and uint8 workspace (the page-4 route's
// scratch, qsa_workspace_size(D) bytes; None = none). CPU runs the oracle on the same Params,
// Meta the C++ checks on stand-in pointers, CUDA the C++ API on the current stream (qsa_route
// picks the kernel: page-4 for R >= 4096, K >= 384 with a plan on SM90, else the exact simple kernel).
// qsa_plan writes the page-4 plan of the same selection / request / block-table tensors into a
// uint8 metadata tensor of qsa_metadata_size(R, K) bytes (or more): CUDA the C++ qsa_plan on the
// current stream, CPU selkv::ref::qsa_plan (byte-identical), Meta the C++ checks. The plan reads
// no q or cache data; it takes their sizes as ints (num_q_heads, num_kv_heads, head_dim for the
// C++ shape rules and the grouping, num_pages and page_size for the validity rule and the
// physical addresses).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "op_utils.h"
#include "qsa/qsa_checks.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

constexpr const char* kQsaOp = "selkv::qsa_sparse_prefill";
constexpr const char* kPlanOp = "selkv::qsa_plan";

// The stride of a dim of size <= 1 carries no information; 0 keeps the C++ rules from tripping on it.
int64_t stride_or_zero(const at::Tensor& t, int64_t d) { return t.size(d) <= 1 ? 0 : t.stride(d); }

QsaDtype qsa_dtype(const at::Tensor& q) {
  switch (q.scalar_type()) {
    case at::kHalf: return QsaDtype::kFp16;
    case at::kBFloat16: return QsaDtype::kBf16;
    default: break;
  }
  TORCH_CHECK(false, kQsaOp, ": q: expected dtype Half or BFloat16, got ", q.scalar_type());
}

QsaCacheView cache_view(const at::Tensor& c) {
  QsaCacheView v;
  v.data = data_or_null(c);
  v.page_stride = stride_or_zero(c, 0);
  v.slot_stride = stride_or_zero(c, 1);
  v.head_stride = stride_or_zero(c, 2);
  return v;
}

// The plan's inputs, shared by both ops: block_table, seq_lens, req_ids, positions and the
// selection in one of its forms, for R rows. Fills p's request, selection and row fields.
void fill_plan_inputs(const char* kOp, QsaSparsePrefillParams& p, int64_t R, const at::Tensor& block_table,
                      const at::Tensor& seq_lens, const at::Tensor& req_ids, const at::Tensor& positions,
                      const std::optional<at::Tensor>& selection, const std::optional<at::Tensor>& block_ids,
                      const std::optional<at::Tensor>& block_counts) {
  TensorArg(kOp, "block_table", block_table, "[num_req, width]").dtype(at::kInt).dims(2).inner_contiguous();
  const int64_t num_req = block_table.size(0);
  TensorArg(kOp, "seq_lens", seq_lens, "[num_req]").dtype(at::kInt).dims(1).size(0, num_req).contiguous();
  TensorArg(kOp, "req_ids", req_ids, "[R]").dtype(at::kInt).dims(1).size(0, R).contiguous();
  TensorArg(kOp, "positions", positions, "[R]").dtype(at::kInt).dims(1).size(0, R).contiguous();

  TORCH_CHECK(selection.has_value() != block_ids.has_value(), kOp,
              ": selection, block_ids: expected exactly one selection form (selection [R, 4K + 3], or "
              "block_ids [R, K] with block_counts [R]), got ",
              selection.has_value() ? "both" : "neither");
  TORCH_CHECK(block_ids.has_value() == block_counts.has_value(), kOp,
              ": block_counts: expected together with block_ids (compact form) and absent otherwise");
  if (selection.has_value()) {
    TensorArg(kOp, "selection", *selection, "[R, 4K + 3]").dtype(at::kInt).dims(2).size(0, R).inner_contiguous();
    const int64_t cols = selection->size(1);
    TORCH_CHECK(cols >= 7 && (cols - 3) % 4 == 0, kOp, ": selection: expected 4K + 3 columns (K >= 1 blocks), got ",
                cols);
    p.form = QsaSelectionForm::kExpanded;
    p.max_blocks = to_int32(kOp, "max_blocks ((selection.size(1) - 3) / 4)", (cols - 3) / 4);
    p.selection = static_cast<const int32_t*>(data_or_null(*selection));
    p.selection_stride = stride_or_zero(*selection, 0);
  } else {
    TensorArg(kOp, "block_ids", *block_ids, "[R, K]").dtype(at::kInt).dims(2).size(0, R).inner_contiguous();
    TensorArg(kOp, "block_counts", *block_counts, "[R]").dtype(at::kInt).dims(1).size(0, R).contiguous();
    p.form = QsaSelectionForm::kCompact;
    p.max_blocks = to_int32(kOp, "max_blocks (block_ids.size(1))", block_ids->size(1));
    p.block_ids = static_cast<const int32_t*>(data_or_null(*block_ids));
    p.block_ids_stride = stride_or_zero(*block_ids, 0);
    p.block_counts = static_cast<const int32_t*>(data_or_null(*block_counts));
  }

  p.num_rows = R;
  p.block_table = static_cast<const int32_t*>(data_or_null(block_table));
  p.block_table_stride = stride_or_zero(block_table, 0);
  p.num_req = to_int32(kOp, "num_req (block_table.size(0))", num_req);
  p.block_table_width = to_int32(kOp, "block_table_width (block_table.size(1))", block_table.size(1));
  p.seq_lens = static_cast<const int32_t*>(data_or_null(seq_lens));
  p.req_ids = static_cast<const int32_t*>(data_or_null(req_ids));
  p.positions = static_cast<const int32_t*>(data_or_null(positions));
}

// Meta: the stand-ins of fill_plan_inputs' pointers.
void stand_in_plan_inputs(MetaStandIns& stand_in, QsaSparsePrefillParams& m, const at::Tensor& block_table,
                          const at::Tensor& seq_lens, const at::Tensor& req_ids, const at::Tensor& positions,
                          const std::optional<at::Tensor>& selection, const std::optional<at::Tensor>& block_ids,
                          const std::optional<at::Tensor>& block_counts) {
  m.block_table = static_cast<const int32_t*>(stand_in(block_table));
  m.seq_lens = static_cast<const int32_t*>(stand_in(seq_lens));
  m.req_ids = static_cast<const int32_t*>(stand_in(req_ids));
  m.positions = static_cast<const int32_t*>(stand_in(positions));
  m.selection = static_cast<const int32_t*>(stand_in(selection));
  m.block_ids = static_cast<const int32_t*>(stand_in(block_ids));
  m.block_counts = static_cast<const int32_t*>(stand_in(block_counts));
}

// The plan tensor: uint8, 1-d, dense. Its size (qsa_metadata_size bytes or more) and, on the GPU,
// its 16-byte alignment are the C++ API's rules. Its bytes are read as size(0), not numel(),
// which a symbolic-shape fake tensor (torch.compile) refuses.
void check_metadata_tensor(const char* kOp, const at::Tensor& metadata) {
  TensorArg(kOp, "metadata", metadata, "[qsa_metadata_size(R, K)] bytes").dtype(at::kByte).dims(1).contiguous();
}

// ---- selkv::qsa_sparse_prefill -----------------------------------------------------------------
template <Backend B>
void qsa_sparse_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& req_ids,
                        const at::Tensor& positions, const std::optional<at::Tensor>& selection,
                        const std::optional<at::Tensor>& block_ids, const std::optional<at::Tensor>& block_counts,
                        double scale, bool force_simple, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                        const std::optional<at::Tensor>& metadata, const std::optional<at::Tensor>& workspace) {
  constexpr const char* kOp = kQsaOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"lse", lse}, {"q", q}, {"k_cache", k_cache}, {"v_cache", v_cache},
                 {"block_table", block_table}, {"seq_lens", seq_lens}, {"req_ids", req_ids},
                 {"positions", positions}, {"selection", selection}, {"block_ids", block_ids},
                 {"block_counts", block_counts}, {"metadata", metadata}, {"workspace", workspace}});

  QsaSparsePrefillParams p;
  p.dtype = qsa_dtype(q);
  TensorArg(kOp, "q", q, "[R, Hq, D]").dims(3).inner_contiguous();
  const int64_t R = q.size(0), Hq = q.size(1), D = q.size(2);
  TensorArg(kOp, "k_cache", k_cache, "[num_pages, P, Hkv, D]")
      .dtype(q.scalar_type()).dims(4).size(3, D).inner_contiguous();
  const int64_t pages = k_cache.size(0), P = k_cache.size(1), Hkv = k_cache.size(2);
  TensorArg(kOp, "v_cache", v_cache, "[num_pages, P, Hkv, D] like k_cache")
      .dtype(q.scalar_type()).dims(4).size(0, pages).size(1, P).size(2, Hkv).size(3, D).inner_contiguous();
  fill_plan_inputs(kOp, p, R, block_table, seq_lens, req_ids, positions, selection, block_ids, block_counts);

  TensorArg(kOp, "out", out, "[R, Hq, D] like q")
      .dtype(q.scalar_type()).dims(3).size(0, R).size(1, Hq).size(2, D).inner_contiguous();
  if (lse.has_value()) {
    TensorArg(kOp, "lse", *lse, "[R, Hq]").dtype(at::kFloat).dims(2).size(0, R).size(1, Hq);
    p.lse = static_cast<float*>(mutable_data_or_null(*lse));
    p.lse_row_stride = stride_or_zero(*lse, 0);
    p.lse_head_stride = stride_or_zero(*lse, 1);
  }
  if (metadata.has_value()) {
    check_metadata_tensor(kOp, *metadata);
    // An empty tensor has no data pointer, which the C++ API reads as "no plan": name it here.
    TORCH_CHECK(R == 0 || metadata->size(0) > 0, kOp, ": metadata: expected the plan of qsa_plan (",
                "qsa_metadata_size(R, K) bytes), got an empty tensor; pass None for no plan");
    p.metadata = data_or_null(*metadata);
    p.metadata_bytes = size_t(metadata->size(0));
  }
  if (workspace.has_value()) {
    TensorArg(kOp, "workspace", *workspace, "[qsa_workspace_size(D)] bytes").dtype(at::kByte).dims(1).contiguous();
    TORCH_CHECK(R == 0 || workspace->size(0) > 0, kOp, ": workspace: expected qsa_workspace_size(D) bytes, got an ",
                "empty tensor; pass None for none");
    p.workspace = mutable_data_or_null(*workspace);
    p.workspace_bytes = size_t(workspace->size(0));
  }

  p.num_q_heads = to_int32(kOp, "num_q_heads (q.size(1))", Hq);
  p.num_kv_heads = to_int32(kOp, "num_kv_heads (k_cache.size(2))", Hkv);
  p.head_dim = to_int32(kOp, "head_dim (q.size(2))", D);
  p.q = data_or_null(q);
  p.q_row_stride = stride_or_zero(q, 0);
  p.q_head_stride = stride_or_zero(q, 1);
  p.k_cache = cache_view(k_cache);
  p.v_cache = cache_view(v_cache);
  p.num_pages = pages;
  p.page_size = to_int32(kOp, "page_size (k_cache.size(1))", P);
  p.scale = to_float(kOp, "scale", scale);
  p.force_simple = force_simple;
  p.out = mutable_data_or_null(out);
  p.out_row_stride = stride_or_zero(out, 0);
  p.out_head_stride = stride_or_zero(out, 1);

  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    QsaSparsePrefillParams m = p;
    m.q = stand_in(q);
    m.k_cache.data = stand_in(k_cache);
    m.v_cache.data = stand_in(v_cache);
    stand_in_plan_inputs(stand_in, m, block_table, seq_lens, req_ids, positions, selection, block_ids, block_counts);
    m.out = stand_in(out);
    m.lse = static_cast<float*>(stand_in(lse));
    m.metadata = stand_in(metadata);
    m.workspace = stand_in(workspace);
    throw_if_error(selkv::check_qsa_sparse_prefill(m));
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::qsa_sparse_prefill(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_qsa_sparse_prefill(p));  // the CUDA run's rules, then the oracle
    throw_if_error(selkv::ref::qsa_sparse_prefill(p));
  }
}

// ---- selkv::qsa_metadata_size ------------------------------------------------------------------
int64_t qsa_metadata_bytes(int64_t num_rows, int64_t max_blocks) {
  return int64_t(selkv::qsa_metadata_size(num_rows, max_blocks));
}

// ---- selkv::qsa_workspace_size -----------------------------------------------------------------
int64_t qsa_workspace_bytes(int64_t head_dim) { return int64_t(selkv::qsa_workspace_size(head_dim)); }

// ---- selkv::qsa_page4_wanted (the shape form) ----------------------------------------------------
bool qsa_page4_wanted_op(int64_t num_rows, int64_t max_blocks) {
  return selkv::qsa_page4_wanted(num_rows, max_blocks);
}

// ---- selkv::qsa_plan ---------------------------------------------------------------------------
template <Backend B>
void qsa_plan(const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& req_ids,
              const at::Tensor& positions, const std::optional<at::Tensor>& selection,
              const std::optional<at::Tensor>& block_ids, const std::optional<at::Tensor>& block_counts,
              int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_pages, int64_t page_size,
              const at::Tensor& metadata) {
  constexpr const char* kOp = kPlanOp;
  check_devices(kOp, device_type(B),
                {{"metadata", metadata}, {"block_table", block_table}, {"seq_lens", seq_lens},
                 {"req_ids", req_ids}, {"positions", positions}, {"selection", selection},
                 {"block_ids", block_ids}, {"block_counts", block_counts}});
  check_metadata_tensor(kOp, metadata);
  QsaSparsePrefillParams p;
  TensorArg(kOp, "req_ids", req_ids, "[R]").dims(1);
  fill_plan_inputs(kOp, p, req_ids.size(0), block_table, seq_lens, req_ids, positions, selection, block_ids,
                   block_counts);
  p.num_q_heads = to_int32(kOp, "num_q_heads", num_q_heads);
  p.num_kv_heads = to_int32(kOp, "num_kv_heads", num_kv_heads);
  p.head_dim = to_int32(kOp, "head_dim", head_dim);
  p.num_pages = num_pages;
  p.page_size = to_int32(kOp, "page_size", page_size);
  void* md = mutable_data_or_null(metadata);
  const size_t md_bytes = size_t(metadata.size(0));

  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    QsaSparsePrefillParams m = p;
    stand_in_plan_inputs(stand_in, m, block_table, seq_lens, req_ids, positions, selection, block_ids, block_counts);
    qsa::Work work;
    throw_if_error(qsa::check_params(kOp, m, qsa::Use::kPlan, /*device=*/true, &work, stand_in(metadata), md_bytes));
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(metadata);
    throw_if_error(selkv::qsa_plan(p, md, md_bytes, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::ref::qsa_plan(p, md, md_bytes));
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def(
      "qsa_sparse_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor req_ids, Tensor positions, Tensor? selection, Tensor? block_ids, Tensor? block_counts, "
      "float scale, bool force_simple, Tensor(a!) out, Tensor(b!)? lse, Tensor? metadata=None, "
      "Tensor(c!)? workspace=None) -> ()",
      tags);
  m.def("qsa_metadata_size(int num_rows, int max_blocks) -> int", &::selkv::torch_ext::qsa_metadata_bytes);
  m.def("qsa_workspace_size(int head_dim) -> int", &::selkv::torch_ext::qsa_workspace_bytes);
  m.def("qsa_page4_wanted(int num_rows, int max_blocks) -> bool", &::selkv::torch_ext::qsa_page4_wanted_op);
  m.def(
      "qsa_plan(Tensor block_table, Tensor seq_lens, Tensor req_ids, Tensor positions, Tensor? selection, "
      "Tensor? block_ids, Tensor? block_counts, int num_q_heads, int num_kv_heads, int head_dim, int num_pages, "
      "int page_size, Tensor(a!) metadata) -> ()",
      tags);
}

#define SELKV_REGISTER_QSA_OPS(KEY, BACKEND)                                      \
  TORCH_LIBRARY_IMPL(selkv, KEY, m) {                                             \
    using namespace ::selkv::torch_ext;                                           \
    m.impl("qsa_sparse_prefill", TORCH_FN(qsa_sparse_prefill<BACKEND>));          \
    m.impl("qsa_plan", TORCH_FN(qsa_plan<BACKEND>));                              \
  }

SELKV_REGISTER_QSA_OPS(CUDA, Backend::kCuda)
SELKV_REGISTER_QSA_OPS(CPU, Backend::kCpu)
SELKV_REGISTER_QSA_OPS(Meta, Backend::kMeta)
