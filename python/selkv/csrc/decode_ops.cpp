// torch ops for C5, the FP8 sparse MLA decode (include/selkv/decode.h):
//   selkv::decode_metadata_size, selkv::get_decode_metadata, selkv::sparse_mla_decode,
//   selkv::decode_plan_fields.
//
// The C++ API splits the decode into a plan step (make_decode_metadata: a device buffer plus a
// host-side DecodeMetadata recording the shape it was made for) and the call (sparse_mla_decode,
// which rejects a call whose shape differs from the plan's). The torch layer carries the host
// side as a plain `int[]` "plan" returned by get_decode_metadata and passed back to
// sparse_mla_decode, which rebuilds the DecodeMetadata from it; all validation (shape match,
// topk_length identity, workspace size) is the C++ API's own. The plan's layout is defined once,
// in SELKV_DECODE_PLAN_FIELDS below; Python reads fields by name (selkv::decode_plan_fields).
// CUDA kernels run the C++ API on torch's current stream (graph capturable, no host sync); CPU
// kernels run the fp64 oracle (selkv::ref::sparse_decode, out rounded to bf16) behind the same
// checks; the Meta kernel of sparse_mla_decode only checks tensors (torch.compile).
// get_decode_metadata is a planning step with host-visible results (like FlashMLA's
// get_mla_metadata): it has CUDA and CPU kernels and is meant to run outside torch.compile.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "op_utils.h"
#include "decode/decode_params.h"
#include "reference/oracle.h"
#include "selkv/decode.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

constexpr const char* kPlanOp = "selkv::get_decode_metadata";
constexpr const char* kDecodeOp = "selkv::sparse_mla_decode";

// The plan's `int[]` layout: (enum value, name) in order. The one definition of it: the enum
// below and the names selkv::decode_plan_fields returns (python/selkv/decode.py indexes by name)
// both come from this list.
#define SELKV_DECODE_PLAN_FIELDS(X)                                                            \
  X(kPlanBatch, "batch")                                                                       \
  X(kPlanSeqQ, "seq_q")                                                                        \
  X(kPlanHeads, "num_heads")                                                                   \
  X(kPlanTopk, "topk")                                                                         \
  X(kPlanTopkLength, "topk_length") /* the tensor's address, 0 = none */                       \
  X(kPlanNumSms, "num_sms")                                                                    \
  X(kPlanParts, "num_sm_parts")                                                                \
  X(kPlanWorkspaceBytes, "workspace_bytes")                                                    \
  X(kPlanMinBlocks, "min_blocks_per_part")

#define SELKV_PLAN_ENUM(field, name) field,
enum PlanField : int { SELKV_DECODE_PLAN_FIELDS(SELKV_PLAN_ENUM) kPlanSize };
#undef SELKV_PLAN_ENUM

#define SELKV_PLAN_NAME(field, name) name,
constexpr const char* kPlanFieldNames[kPlanSize] = {SELKV_DECODE_PLAN_FIELDS(SELKV_PLAN_NAME)};
#undef SELKV_PLAN_NAME
#undef SELKV_DECODE_PLAN_FIELDS

// Plan value `f` as an int32 field of DecodeShape / DecodeMetadata (to_int32's message, built
// only on failure: this runs on every decode call).
int32_t plan_int32(c10::IntArrayRef plan, PlanField f) {
  const int64_t v = plan[f];
  TORCH_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
              kDecodeOp, ": plan[", kPlanFieldNames[f], "]: ", v, " does not fit in int32");
  return static_cast<int32_t>(v);
}

std::vector<int64_t> plan_of(const DecodeMetadata& md) {
  std::vector<int64_t> plan(kPlanSize, 0);
  plan[kPlanBatch] = md.shape.batch;
  plan[kPlanSeqQ] = md.shape.seq_q;
  plan[kPlanHeads] = md.shape.num_heads;
  plan[kPlanTopk] = md.shape.topk;
  plan[kPlanTopkLength] = int64_t(reinterpret_cast<uintptr_t>(md.shape.topk_length));
  plan[kPlanNumSms] = md.shape.num_sms;
  plan[kPlanParts] = md.num_sm_parts;
  plan[kPlanWorkspaceBytes] = int64_t(decode_workspace_size(md));
  plan[kPlanMinBlocks] = md.min_blocks_per_part;
  return plan;
}

// The host-side DecodeMetadata a plan describes, over the device (or host) buffer `metadata`.
DecodeMetadata metadata_of(const at::Tensor& metadata, c10::IntArrayRef plan) {
  TORCH_CHECK(plan.size() == size_t(kPlanSize), kDecodeOp, ": plan: expected the ", int(kPlanSize),
              " values returned by get_decode_metadata, got ", plan.size());
  DecodeMetadata md;
  md.data = static_cast<int32_t*>(mutable_data_or_null(metadata));
  // (meta tensors: no data and possibly symbolic sizes; nothing reads these fields then)
  md.bytes = metadata.is_meta() ? 0 : size_t(metadata.numel()) * sizeof(int32_t);
  md.shape.batch = plan_int32(plan, kPlanBatch);
  md.shape.seq_q = plan_int32(plan, kPlanSeqQ);
  md.shape.num_heads = plan_int32(plan, kPlanHeads);
  md.shape.topk = plan_int32(plan, kPlanTopk);
  md.shape.topk_length = reinterpret_cast<const int32_t*>(uintptr_t(plan[kPlanTopkLength]));
  md.shape.num_sms = plan_int32(plan, kPlanNumSms);
  md.num_sm_parts = plan_int32(plan, kPlanParts);
  md.min_blocks_per_part = plan_int32(plan, kPlanMinBlocks);
  md.valid = md.data != nullptr;
  return md;
}

// ---- selkv::decode_plan_fields -----------------------------------------------------------------
std::vector<std::string> decode_plan_fields() {
  return std::vector<std::string>(std::begin(kPlanFieldNames), std::end(kPlanFieldNames));
}

// ---- selkv::decode_metadata_size ---------------------------------------------------------------
int64_t decode_metadata_ints(int64_t batch, int64_t seq_q) {
  return int64_t(selkv::decode_metadata_size(batch, seq_q) / sizeof(int32_t));
}

// ---- selkv::get_decode_metadata ----------------------------------------------------------------
template <Backend B>
std::vector<int64_t> get_decode_metadata(int64_t batch, int64_t seq_q, int64_t num_heads,
                                         int64_t topk, const std::optional<at::Tensor>& topk_length,
                                         int64_t num_sms, const at::Tensor& metadata,
                                         int64_t min_blocks_per_part) {
  constexpr const char* kOp = kPlanOp;
  check_devices(kOp, device_type(B), {{"metadata", metadata}, {"topk_length", topk_length}});
  TensorArg(kOp, "metadata", metadata, "[decode_metadata_size(batch, seq_q)]")
      .dtype(at::kInt).dims(1).contiguous();
  if (topk_length.has_value()) {
    TensorArg(kOp, "topk_length", *topk_length, "[batch]")
        .dtype(at::kInt).dims(1).size(0, batch).contiguous();
  }
  DecodeShape shape;
  shape.batch = to_int32(kOp, "batch", batch);
  shape.seq_q = to_int32(kOp, "seq_q", seq_q);
  shape.num_heads = to_int32(kOp, "num_heads", num_heads);
  shape.topk = to_int32(kOp, "topk", topk);
  shape.topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  shape.num_sms = to_int32(kOp, "num_sms", num_sms);
  shape.min_blocks_per_part = to_int32(kOp, "min_blocks_per_part", min_blocks_per_part);
  DecodeMetadata md;
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(metadata);
    throw_if_error(selkv::make_decode_metadata(shape, metadata.mutable_data_ptr(),
                                               size_t(metadata.numel()) * sizeof(int32_t), &md,
                                               scope.stream()));
  } else {
    // CPU: the oracle needs no schedule. The plan is a one-part plan (what the C++ API makes on
    // a one-SM device); the shape itself is validated by sparse_mla_decode against each call.
    const size_t need = selkv::decode_metadata_size(shape.batch, shape.seq_q);
    TORCH_CHECK(size_t(metadata.numel()) * sizeof(int32_t) >= need, kOp, ": metadata: needs ",
                need / sizeof(int32_t), " int32 values, got ", metadata.numel());
    if (B == Backend::kCpu && metadata.numel() > 0) {
      std::memset(metadata.mutable_data_ptr(), 0, size_t(metadata.numel()) * sizeof(int32_t));
      // The lengths snapshot, where the GPU scheduler keeps it: the CPU decode reads the lengths
      // from the plan too, so both devices compute the result for the lengths at planning time.
      if (shape.topk_length != nullptr && shape.batch > 0 && shape.seq_q > 0) {
        int32_t* lens = metadata.mutable_data_ptr<int32_t>() +
                        decode::md_lengths_offset(shape.batch * shape.seq_q);
        for (int32_t b = 0; b < shape.batch; ++b)
          lens[b] = decode::clamp_topk_length(shape.topk_length[b], shape.topk);
      }
    }
    md.data = static_cast<int32_t*>(mutable_data_or_null(metadata));
    md.bytes = size_t(metadata.numel()) * sizeof(int32_t);
    md.shape = shape;
    md.shape.num_sms = 1;
    md.num_sm_parts = 1;
    md.min_blocks_per_part = 1;
    md.valid = true;
  }
  return plan_of(md);
}

// ---- selkv::sparse_mla_decode ------------------------------------------------------------------
SparseDecodeParams decode_params(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& indices,
                                 const std::optional<at::Tensor>& topk_length,
                                 const std::optional<at::Tensor>& attn_sink, double sm_scale,
                                 const at::Tensor& out, const at::Tensor& lse) {
  constexpr const char* kOp = kDecodeOp;
  TensorArg(kOp, "q", q, "[batch, seq_q, num_heads, 576]")
      .dtype(at::kBFloat16).dims(4).size(3, fmt::kQkDim).inner_contiguous();
  const int64_t b = q.size(0), s = q.size(1), h = q.size(2);
  const CacheTensorView cv = check_cache_tensor(kOp, "kv_cache", kv_cache, KvFormat::kDsMlaFp8);
  TensorArg(kOp, "indices", indices, "[batch, seq_q, topk]")
      .dtype(at::kInt).dims(3).size(0, b).size(1, s).inner_contiguous();
  if (topk_length.has_value()) {
    TensorArg(kOp, "topk_length", *topk_length, "[batch]").dtype(at::kInt).dims(1).size(0, b).contiguous();
  }
  if (attn_sink.has_value()) {
    TensorArg(kOp, "attn_sink", *attn_sink, "[num_heads]").dtype(at::kFloat).dims(1).size(0, h).contiguous();
  }
  TensorArg(kOp, "out", out, "[batch, seq_q, num_heads, 512]")
      .dtype(at::kBFloat16).dims(4).size(0, b).size(1, s).size(2, h).size(3, fmt::kVDim).inner_contiguous();
  TensorArg(kOp, "lse", lse, "[batch, seq_q, num_heads]")
      .dtype(at::kFloat).dims(3).size(0, b).size(1, s).size(2, h).inner_contiguous();

  SparseDecodeParams p;
  p.q = data_or_null(q);
  p.q_batch_stride = q.stride(0);
  p.q_seq_stride = q.stride(1);
  p.q_head_stride = q.stride(2);
  p.batch = to_int32(kOp, "batch (q.size(0))", b);
  p.seq_q = to_int32(kOp, "seq_q (q.size(1))", s);
  p.num_heads = to_int32(kOp, "num_heads (q.size(2))", h);
  p.cache.data = data_or_null(kv_cache);
  p.cache.num_blocks = cv.num_blocks;
  p.cache.page_size = cv.page_size;
  p.cache.block_stride_bytes = cv.block_stride_bytes;
  p.cache.format = KvFormat::kDsMlaFp8;
  p.indices = static_cast<const int32_t*>(data_or_null(indices));
  p.indices_batch_stride = indices.stride(0);
  p.indices_seq_stride = indices.stride(1);
  p.topk = to_int32(kOp, "topk (indices.size(2))", indices.size(2));
  p.topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  p.attn_sink = static_cast<const float*>(data_or_null(attn_sink));
  p.sm_scale = to_float(kOp, "sm_scale", sm_scale);
  p.out = mutable_data_or_null(out);
  p.out_batch_stride = out.stride(0);
  p.out_seq_stride = out.stride(1);
  p.out_head_stride = out.stride(2);
  p.lse = static_cast<float*>(mutable_data_or_null(lse));
  p.lse_batch_stride = lse.stride(0);
  p.lse_seq_stride = lse.stride(1);
  return p;
}

// The oracle on host tensors: gathers q / indices into the dense layout it takes, writes out
// (rounded to bf16) and lse through the output strides.
void run_oracle(const SparseDecodeParams& p, const DecodeMetadata& md) {
  const int B = p.batch, S = p.seq_q, H = p.num_heads, K = p.topk;
  constexpr int D = fmt::kQkDim, V = fmt::kVDim;
  const size_t rows = size_t(B) * S;
  std::vector<uint16_t> q(rows * H * D);
  std::vector<int32_t> idx(rows * K);
  const auto* qs = static_cast<const uint16_t*>(p.q);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s) {
      const size_t r = size_t(b) * S + s;
      for (int h = 0; h < H; ++h)
        std::memcpy(&q[(r * H + h) * D],
                    qs + b * p.q_batch_stride + s * p.q_seq_stride + h * p.q_head_stride, D * 2);
      std::memcpy(&idx[r * K], p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride,
                  size_t(K) * 4);
    }
  std::vector<float> out(rows * H * V), lse(rows * H);
  ref::SparseDecodeRefArgs a;
  a.q = q.data();
  a.B = B;
  a.S_q = S;
  a.H = H;
  a.cache = p.cache;
  a.indices = idx.data();
  a.K = K;
  // the plan's lengths snapshot (get_decode_metadata's CPU branch), as the GPU kernels read it
  a.topk_length = p.topk_length != nullptr ? md.data + decode::md_lengths_offset(B * S) : nullptr;
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.attn_sink;
  a.out = out.data();
  a.lse = lse.data();
  throw_if_error(ref::check_sparse_decode_args(a));
  ref::sparse_decode(a);
  auto* os = static_cast<uint16_t*>(p.out);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s) {
      const size_t r = size_t(b) * S + s;
      for (int h = 0; h < H; ++h) {
        uint16_t* dst = os + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride;
        const float* src = &out[(r * H + h) * V];
        for (int d = 0; d < V; ++d) dst[d] = codec::float_to_bf16(src[d]);
        p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse[r * H + h];
      }
    }
}

template <Backend B>
void sparse_mla_decode(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& indices,
                       const std::optional<at::Tensor>& topk_length,
                       const std::optional<at::Tensor>& attn_sink, const at::Tensor& metadata,
                       c10::IntArrayRef plan, const at::Tensor& workspace, double sm_scale,
                       const at::Tensor& out, const at::Tensor& lse) {
  constexpr const char* kOp = kDecodeOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"lse", lse}, {"q", q}, {"kv_cache", kv_cache}, {"indices", indices},
                 {"topk_length", topk_length}, {"attn_sink", attn_sink}, {"metadata", metadata},
                 {"workspace", workspace}});
  TensorArg(kOp, "metadata", metadata, "[decode_metadata_size(batch, seq_q)]")
      .dtype(at::kInt).dims(1).contiguous();
  TensorArg(kOp, "workspace", workspace, "[plan workspace_bytes]").dtype(at::kByte).dims(1).contiguous();
  const SparseDecodeParams p =
      decode_params(q, kv_cache, indices, topk_length, attn_sink, sm_scale, out, lse);
  const DecodeMetadata md = metadata_of(metadata, plan);
  if constexpr (B == Backend::kMeta) return;
  const size_t ws_bytes = size_t(workspace.numel());
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::sparse_mla_decode(p, md, workspace.mutable_data_ptr(), ws_bytes, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_sparse_mla_decode(p, md, ws_bytes));
    run_oracle(p, md);
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("decode_plan_fields() -> str[]", &::selkv::torch_ext::decode_plan_fields);
  m.def("decode_metadata_size(int batch, int seq_q) -> int",
        &::selkv::torch_ext::decode_metadata_ints);
  m.def(
      "get_decode_metadata(int batch, int seq_q, int num_heads, int topk, Tensor? topk_length, "
      "int num_sms, Tensor(a!) metadata, int min_blocks_per_part=0) -> int[]");
  m.def(
      "sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_length, "
      "Tensor? attn_sink, Tensor metadata, int[] plan, Tensor(a!) workspace, float sm_scale, "
      "Tensor(b!) out, Tensor(c!) lse) -> ()",
      tags);
}

TORCH_LIBRARY_IMPL(selkv, CUDA, m) {
  using namespace ::selkv::torch_ext;
  m.impl("get_decode_metadata", TORCH_FN(get_decode_metadata<Backend::kCuda>));
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kCuda>));
}
TORCH_LIBRARY_IMPL(selkv, CPU, m) {
  using namespace ::selkv::torch_ext;
  m.impl("get_decode_metadata", TORCH_FN(get_decode_metadata<Backend::kCpu>));
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kCpu>));
}
TORCH_LIBRARY_IMPL(selkv, Meta, m) {
  using namespace ::selkv::torch_ext;
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kMeta>));
}
