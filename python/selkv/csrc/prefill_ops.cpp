// torch ops for C4 (include/selkv/dequant.h), C7 (include/selkv/prefill.h) and the composed
// prefill paths (include/selkv/composed.h):
//   selkv::dequant_selected_workspace_rows, selkv::dequant_selected, selkv::sparse_prefill,
//   selkv::dequant_prefill_workspace_size, selkv::dequant_sparse_prefill,
//   selkv::gather_prefill_workspace_size, selkv::gather_sparse_prefill.
// Out-variants: the caller owns every buffer. CUDA kernels run the C++ API on torch's current
// stream; CPU kernels run the oracle on the same Params (C4 / C3 bit-exact; attention in fp64, out
// rounded to bf16); Meta kernels run the C++ checks on stand-in pointers (torch.compile: a traced
// call fails as the run would). Tensor-level checks (dtype, device,
// rank, sizes) are here; strides, alignment and values are the C++ API's (fail closed, same names).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "op_utils.h"
#include "prefill/composed_ref.h"
#include "reference/oracle.h"
#include "selkv/composed.h"
#include "selkv/dequant.h"
#include "selkv/prefill.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

PagedKvCache cache_view(const char* op, const at::Tensor& cache, KvFormat format) {
  const CacheTensorView cv = check_cache_tensor(op, "cache", cache, format);
  return PagedKvCache{data_or_null(cache), cv.num_blocks, cv.page_size, cv.block_stride_bytes, format};
}

// ---- C4: dequant_selected ---------------------------------------------------------------------
constexpr const char* kDequantOp = "selkv::dequant_selected";

int64_t dequant_selected_workspace_rows_op(int64_t num_tokens, int64_t topk, int64_t num_slots) {
  return selkv::dequant_selected_workspace_rows(num_tokens, topk, num_slots);
}

template <Backend B>
void dequant_selected(const at::Tensor& cache, const at::Tensor& indices,
                      const std::optional<at::Tensor>& topk_length, c10::string_view format,
                      const at::Tensor& workspace, const at::Tensor& out_indices) {
  constexpr const char* kOp = kDequantOp;
  check_devices(kOp, device_type(B),
                {{"workspace", workspace}, {"cache", cache}, {"indices", indices},
                 {"topk_length", topk_length}, {"out_indices", out_indices}});
  const KvFormat f = parse_format(kOp, format);
  const PagedKvCache cv = cache_view(kOp, cache, f);
  TensorArg(kOp, "indices", indices, "[num_tokens, topk]").dtype(at::kInt).dims(2).inner_contiguous();
  const int64_t T = indices.size(0), K = indices.size(1);
  if (topk_length.has_value())
    TensorArg(kOp, "topk_length", *topk_length, "[num_tokens]").dtype(at::kInt).dims(1).size(0, T).contiguous();
  const int D = fmt::dequant_dim(f);
  TensorArg(kOp, "workspace", workspace,
            D == 576 ? "[rows, 576] for ds_mla_fp8" : "[rows, 512] for nope_fp8 and model1_fp8")
      .dtype(at::kBFloat16).dims(2).size(1, D).inner_contiguous();
  TensorArg(kOp, "out_indices", out_indices, "[num_tokens, topk]")
      .dtype(at::kInt).dims(2).size(0, T).size(1, K).inner_contiguous();
  DequantSelectedParams p;
  p.cache = cv;
  p.indices = static_cast<const int32_t*>(data_or_null(indices));
  p.indices_row_stride = indices.stride(0);
  p.topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  p.num_tokens = T;
  p.topk = to_int32(kOp, "topk (indices.size(1))", K);
  p.workspace = mutable_data_or_null(workspace);
  p.workspace_rows = workspace.size(0);
  p.workspace_row_stride = workspace.stride(0);
  p.out_indices = static_cast<int32_t*>(mutable_data_or_null(out_indices));
  p.out_indices_row_stride = out_indices.stride(0);
  if (p.workspace_rows <= 1) p.workspace_row_stride = std::max<int64_t>(p.workspace_row_stride, D);
  if (T <= 1) {  // the stride of a dim of size <= 1 carries no information
    p.indices_row_stride = std::max<int64_t>(p.indices_row_stride, K);
    p.out_indices_row_stride = std::max<int64_t>(p.out_indices_row_stride, K);
  }
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({cache, indices, topk_length, workspace, out_indices})) {
      DequantSelectedParams m = p;
      m.cache.data = stand_in(cache);
      m.indices = static_cast<const int32_t*>(stand_in(indices));
      m.topk_length = static_cast<const int32_t*>(stand_in(topk_length));
      m.workspace = stand_in(workspace);
      m.out_indices = static_cast<int32_t*>(stand_in(out_indices));
      throw_if_error(selkv::check_dequant_selected(m));
    }
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(workspace);
    throw_if_error(selkv::dequant_selected_kv(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_dequant_selected(p));  // the CUDA run's rules, then the oracle
    throw_if_error(selkv::ref::dequant_selected(p));
  }
}

// ---- C7: sparse_prefill -----------------------------------------------------------------------
constexpr const char* kPrefillOp = "selkv::sparse_prefill";

// q, indices, topk_length, out, max_logits, lse -> the C7 Params (kv left to the caller).
SparsePrefillParams attn_params(const char* kOp, const at::Tensor& q, const at::Tensor& indices,
                                const std::optional<at::Tensor>& topk_length, double sm_scale,
                                const at::Tensor& out, const at::Tensor& max_logits, const at::Tensor& lse,
                                const std::optional<at::Tensor>& attn_sink) {
  TensorArg(kOp, "q", q, "[num_tokens, num_heads, d_qk]").dtype(at::kBFloat16).dims(3).inner_contiguous();
  const int64_t T = q.size(0), H = q.size(1);
  TensorArg(kOp, "indices", indices, "[num_tokens, topk]").dtype(at::kInt).dims(2).size(0, T).inner_contiguous();
  if (topk_length.has_value())
    TensorArg(kOp, "topk_length", *topk_length, "[num_tokens]").dtype(at::kInt).dims(1).size(0, T).contiguous();
  TensorArg(kOp, "out", out, "[num_tokens, num_heads, 512]")
      .dtype(at::kBFloat16).dims(3).size(0, T).size(1, H).size(2, fmt::kVDim).inner_contiguous();
  TensorArg(kOp, "max_logits", max_logits, "[num_tokens, num_heads]")
      .dtype(at::kFloat).dims(2).size(0, T).size(1, H).inner_contiguous();
  TensorArg(kOp, "lse", lse, "[num_tokens, num_heads]").dtype(at::kFloat).dims(2).size(0, T).size(1, H).inner_contiguous();
  if (attn_sink.has_value())
    TensorArg(kOp, "attn_sink", *attn_sink, "[num_heads]").dtype(at::kFloat).dims(1).size(0, H).contiguous();
  SparsePrefillParams p;
  p.q = data_or_null(q);
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.num_tokens = T;
  p.num_heads = to_int32(kOp, "num_heads (q.size(1))", H);
  p.d_qk = to_int32(kOp, "d_qk (q.size(2))", q.size(2));
  p.indices = static_cast<const int32_t*>(data_or_null(indices));
  p.indices_token_stride = indices.stride(0);
  p.topk = to_int32(kOp, "topk (indices.size(1))", indices.size(1));
  p.topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  p.sm_scale = to_float(kOp, "sm_scale", sm_scale);
  p.attn_sink = static_cast<const float*>(data_or_null(attn_sink));
  p.out = mutable_data_or_null(out);
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.max_logits = static_cast<float*>(mutable_data_or_null(max_logits));
  p.max_logits_token_stride = max_logits.stride(0);
  p.lse = static_cast<float*>(mutable_data_or_null(lse));
  p.lse_token_stride = lse.stride(0);
  // Strides of dims of size <= 1 carry no information: use dense values there.
  if (H <= 1) {
    p.q_head_stride = std::max<int64_t>(p.q_head_stride, p.d_qk);
    p.out_head_stride = std::max<int64_t>(p.out_head_stride, fmt::kVDim);
  }
  if (T <= 1) p.indices_token_stride = std::max<int64_t>(p.indices_token_stride, p.topk);
  return p;
}

// Meta: stand-ins for the C7 part of a call (kv stays null: the caller sets it).
void meta_attn_stand_ins(MetaStandIns& stand_in, SparsePrefillParams* a, const at::Tensor& q, const at::Tensor& indices,
                         const std::optional<at::Tensor>& topk_length, const at::Tensor& out,
                         const at::Tensor& max_logits, const at::Tensor& lse,
                         const std::optional<at::Tensor>& attn_sink) {
  a->q = stand_in(q);
  a->out = stand_in(out);
  a->indices = static_cast<const int32_t*>(stand_in(indices));
  a->topk_length = static_cast<const int32_t*>(stand_in(topk_length));
  a->max_logits = static_cast<float*>(stand_in(max_logits));
  a->lse = static_cast<float*>(stand_in(lse));
  a->attn_sink = static_cast<const float*>(stand_in(attn_sink));
}

template <Backend B>
void sparse_prefill(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                    const std::optional<at::Tensor>& topk_length, double sm_scale, const at::Tensor& out,
                    const at::Tensor& max_logits, const at::Tensor& lse,
                    const std::optional<at::Tensor>& attn_sink) {
  constexpr const char* kOp = kPrefillOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"q", q}, {"kv", kv}, {"indices", indices}, {"topk_length", topk_length},
                 {"max_logits", max_logits}, {"lse", lse}, {"attn_sink", attn_sink}});
  SparsePrefillParams p = attn_params(kOp, q, indices, topk_length, sm_scale, out, max_logits, lse, attn_sink);
  TensorArg(kOp, "kv", kv, "[num_kv, d_qk]").dtype(at::kBFloat16).dims(2).size(1, q.size(2)).inner_contiguous();
  p.kv = data_or_null(kv);
  p.num_kv = kv.size(0);
  p.kv_row_stride = kv.size(0) <= 1 ? std::max<int64_t>(kv.stride(0), p.d_qk) : kv.stride(0);
  if (p.num_kv == 0) p.kv = nullptr;
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({q, kv, indices, topk_length, out, max_logits, lse, attn_sink})) {
      SparsePrefillParams m = p;  // the C++ checks on stand-in pointers, as the composed routes'
      meta_attn_stand_ins(stand_in, &m, q, indices, topk_length, out, max_logits, lse, attn_sink);
      m.kv = stand_in(kv);
      throw_if_error(selkv::check_sparse_mla_prefill(m));
    }
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::sparse_mla_prefill(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_sparse_mla_prefill(p));
    throw_if_error(selkv::ref::sparse_mla_prefill_strided(p));
  }
}

// ---- (a) dequant_sparse_prefill -----------------------------------------------------------------
constexpr const char* kDqPrefillOp = "selkv::dequant_sparse_prefill";

int64_t dequant_prefill_workspace_size_op(int64_t num_tokens, int64_t topk, int64_t num_slots,
                                          c10::string_view format) {
  const KvFormat f = parse_format("selkv::dequant_prefill_workspace_size", format);
  TORCH_CHECK(selkv::composed_prefill_format(f), "selkv::dequant_prefill_workspace_size: format: must be ",
              "ds_mla_fp8 or nope_fp8, got ", format);
  const int32_t k = to_int32("selkv::dequant_prefill_workspace_size", "topk", topk);
  const size_t n = selkv::dequant_prefill_workspace_size(num_tokens, k, num_slots, f);
  TORCH_CHECK(n <= size_t(INT64_MAX), "selkv::dequant_prefill_workspace_size: num_tokens: shape (", num_tokens,
              ", ", topk, ") is not supported");
  return int64_t(n);
}

template <Backend B>
void dequant_sparse_prefill(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& indices,
                            const std::optional<at::Tensor>& topk_length, c10::string_view format,
                            double sm_scale, const at::Tensor& workspace, const at::Tensor& out,
                            const at::Tensor& max_logits, const at::Tensor& lse,
                            const std::optional<at::Tensor>& attn_sink) {
  constexpr const char* kOp = kDqPrefillOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"q", q}, {"cache", cache}, {"indices", indices}, {"topk_length", topk_length},
                 {"workspace", workspace}, {"max_logits", max_logits}, {"lse", lse}, {"attn_sink", attn_sink}});
  DequantPrefillParams p;
  p.attn = attn_params(kOp, q, indices, topk_length, sm_scale, out, max_logits, lse, attn_sink);
  p.cache = cache_view(kOp, cache, parse_format(kOp, format));
  TensorArg(kOp, "workspace", workspace, "[dequant_prefill_workspace_size(...)] uint8")
      .dtype(at::kByte).dims(1).contiguous();
  p.workspace = mutable_data_or_null(workspace);
  p.workspace_bytes = size_t(workspace.numel());
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({q, cache, indices, topk_length, workspace, out, max_logits, lse, attn_sink})) {
      DequantPrefillParams m = p;
      meta_attn_stand_ins(stand_in, &m.attn, q, indices, topk_length, out, max_logits, lse, attn_sink);
      m.cache.data = stand_in(cache);
      m.workspace = stand_in(workspace);
      throw_if_error(selkv::check_dequant_sparse_mla_prefill(m));
    }
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::dequant_sparse_mla_prefill(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_dequant_sparse_mla_prefill(p));
    throw_if_error(selkv::ref::dequant_sparse_mla_prefill(p));
  }
}

// ---- (b) gather_sparse_prefill ------------------------------------------------------------------
constexpr const char* kGaPrefillOp = "selkv::gather_sparse_prefill";

int64_t gather_prefill_workspace_size_op(int64_t num_kv_rows, c10::string_view format) {
  const KvFormat f = parse_format("selkv::gather_prefill_workspace_size", format);
  TORCH_CHECK(selkv::composed_prefill_format(f), "selkv::gather_prefill_workspace_size: format: must be ",
              "ds_mla_fp8 or nope_fp8, got ", format);
  const size_t n = selkv::gather_prefill_workspace_size(num_kv_rows, f);
  TORCH_CHECK(n <= size_t(INT64_MAX), "selkv::gather_prefill_workspace_size: num_kv_rows: ", num_kv_rows,
              " is not supported");
  return int64_t(n);
}

template <Backend B>
void gather_sparse_prefill(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_table,
                           const at::Tensor& seq_starts, const at::Tensor& seq_lens, const at::Tensor& ws_starts,
                           const at::Tensor& indices, const std::optional<at::Tensor>& topk_length,
                           c10::string_view format, int64_t num_kv_rows, double sm_scale,
                           const at::Tensor& workspace, const at::Tensor& out, const at::Tensor& max_logits,
                           const at::Tensor& lse, const std::optional<at::Tensor>& attn_sink) {
  constexpr const char* kOp = kGaPrefillOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"q", q}, {"cache", cache}, {"block_table", block_table},
                 {"seq_starts", seq_starts}, {"seq_lens", seq_lens}, {"ws_starts", ws_starts},
                 {"indices", indices}, {"topk_length", topk_length}, {"workspace", workspace},
                 {"max_logits", max_logits}, {"lse", lse}, {"attn_sink", attn_sink}});
  GatherPrefillParams p;
  p.attn = attn_params(kOp, q, indices, topk_length, sm_scale, out, max_logits, lse, attn_sink);
  const KvFormat f = parse_format(kOp, format);
  const PagedKvCache cv = cache_view(kOp, cache, f);
  TensorArg(kOp, "seq_lens", seq_lens, "[num_reqs]").dtype(at::kInt).dims(1).contiguous();
  const int64_t R = seq_lens.size(0);
  TensorArg(kOp, "seq_starts", seq_starts, "[num_reqs]").dtype(at::kInt).dims(1).size(0, R).contiguous();
  TensorArg(kOp, "ws_starts", ws_starts, "[num_reqs]").dtype(at::kInt).dims(1).size(0, R).contiguous();
  TensorArg(kOp, "block_table", block_table, "[>= num_reqs, max_blocks_per_req]")
      .dtype(at::kInt).dims(2).min_size(0, R).inner_contiguous();
  TensorArg(kOp, "workspace", workspace, "[gather_prefill_workspace_size(...)] uint8")
      .dtype(at::kByte).dims(1).contiguous();
  p.gather.cache = cv.data;
  p.gather.num_blocks = cv.num_blocks;
  p.gather.page_size = cv.page_size;
  p.gather.block_stride_bytes = cv.block_stride_bytes;
  p.gather.format = f;
  p.gather.block_table = static_cast<const int32_t*>(data_or_null(block_table));
  p.gather.block_table_row_stride = block_table.stride(0);
  p.gather.max_blocks_per_req = to_int32(kOp, "max_blocks_per_req (block_table.size(1))", block_table.size(1));
  p.gather.seq_starts = static_cast<const int32_t*>(data_or_null(seq_starts));
  p.gather.seq_lens = static_cast<const int32_t*>(data_or_null(seq_lens));
  p.gather.ws_starts = static_cast<const int32_t*>(data_or_null(ws_starts));
  p.gather.num_reqs = to_int32(kOp, "num_reqs (seq_lens.size(0))", R);
  p.num_kv_rows = num_kv_rows;
  p.workspace = mutable_data_or_null(workspace);
  p.workspace_bytes = size_t(workspace.numel());
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({q, cache, block_table, seq_starts, seq_lens, ws_starts, indices, topk_length, workspace, out,
                        max_logits, lse, attn_sink})) {
      GatherPrefillParams m = p;
      meta_attn_stand_ins(stand_in, &m.attn, q, indices, topk_length, out, max_logits, lse, attn_sink);
      m.gather.cache = stand_in(cache);
      m.gather.block_table = static_cast<const int32_t*>(stand_in(block_table));
      m.gather.seq_starts = static_cast<const int32_t*>(stand_in(seq_starts));
      m.gather.seq_lens = static_cast<const int32_t*>(stand_in(seq_lens));
      m.gather.ws_starts = static_cast<const int32_t*>(stand_in(ws_starts));
      m.workspace = stand_in(workspace);
      throw_if_error(selkv::check_gather_sparse_mla_prefill(m));
    }
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::gather_sparse_mla_prefill(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_gather_sparse_mla_prefill(p));
    throw_if_error(selkv::ref::gather_sparse_mla_prefill(p));
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("dequant_selected_workspace_rows(int num_tokens, int topk, int num_slots) -> int",
        &::selkv::torch_ext::dequant_selected_workspace_rows_op);
  m.def(
      "dequant_selected(Tensor cache, Tensor indices, Tensor? topk_length, str format, "
      "Tensor(a!) workspace, Tensor(b!) out_indices) -> ()",
      tags);
  m.def(
      "sparse_prefill(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, float sm_scale, "
      "Tensor(a!) out, Tensor(b!) max_logits, Tensor(c!) lse, Tensor? attn_sink=None) -> ()",
      tags);
  m.def("dequant_prefill_workspace_size(int num_tokens, int topk, int num_slots, str format) -> int",
        &::selkv::torch_ext::dequant_prefill_workspace_size_op);
  m.def(
      "dequant_sparse_prefill(Tensor q, Tensor cache, Tensor indices, Tensor? topk_length, str format, "
      "float sm_scale, Tensor(a!) workspace, Tensor(b!) out, Tensor(c!) max_logits, Tensor(d!) lse, "
      "Tensor? attn_sink=None) -> ()",
      tags);
  m.def("gather_prefill_workspace_size(int num_kv_rows, str format) -> int",
        &::selkv::torch_ext::gather_prefill_workspace_size_op);
  m.def(
      "gather_sparse_prefill(Tensor q, Tensor cache, Tensor block_table, Tensor seq_starts, "
      "Tensor seq_lens, Tensor ws_starts, Tensor indices, Tensor? topk_length, str format, "
      "int num_kv_rows, float sm_scale, Tensor(a!) workspace, Tensor(b!) out, Tensor(c!) max_logits, "
      "Tensor(d!) lse, Tensor? attn_sink=None) -> ()",
      tags);
}

#define SELKV_REGISTER_PREFILL_OPS(KEY, BACKEND)                                     \
  TORCH_LIBRARY_IMPL(selkv, KEY, m) {                                                \
    using namespace ::selkv::torch_ext;                                              \
    m.impl("dequant_selected", TORCH_FN(dequant_selected<BACKEND>));                 \
    m.impl("sparse_prefill", TORCH_FN(sparse_prefill<BACKEND>));                     \
    m.impl("dequant_sparse_prefill", TORCH_FN(dequant_sparse_prefill<BACKEND>));     \
    m.impl("gather_sparse_prefill", TORCH_FN(gather_sparse_prefill<BACKEND>));       \
  }

SELKV_REGISTER_PREFILL_OPS(CUDA, Backend::kCuda)
SELKV_REGISTER_PREFILL_OPS(CPU, Backend::kCpu)
SELKV_REGISTER_PREFILL_OPS(Meta, Backend::kMeta)
