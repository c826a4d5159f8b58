// torch ops for C5, the FP8 sparse MLA decode (include/selkv/decode.h: ds_mla_fp8, or model1_fp8
// with the optional extra KV cache; the format follows from the cache tensor's last dim, 656 or
// 584), and C6's decode over a packed KV buffer (include/selkv/packed.h):
//   selkv::decode_metadata_size, selkv::get_decode_metadata, selkv::sparse_mla_decode,
//   selkv::sparse_mla_decode_packed, selkv::decode_plan_fields.
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
// checks; the Meta kernels run the same C++ checks on stand-in pointers (torch.compile: a call
// that would fail fails when traced).
// sparse_mla_decode_packed is the same op over a packed KV buffer (made by pack_selected_kv) in
// place of the cache and indices: the same plan, workspace and outputs; its CPU kernel runs the
// packed oracle (selkv::ref::sparse_decode_packed). The buffer does not record its top-k, so the
// op takes it (`topk`); the C++ API checks the buffer's size against (batch, seq_q, topk).
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
#include "selkv/packed.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

constexpr const char* kPlanOp = "selkv::get_decode_metadata";
constexpr const char* kDecodeOp = "selkv::sparse_mla_decode";
constexpr const char* kPackedDecodeOp = "selkv::sparse_mla_decode_packed";

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
  X(kPlanMinBlocks, "min_blocks_per_part")                                                    \
  X(kPlanExtraTopk, "extra_topk")                                                              \
  X(kPlanExtraTopkLength, "extra_topk_length") /* the tensor's address, 0 = none */

#define SELKV_PLAN_ENUM(field, name) field,
enum PlanField : int { SELKV_DECODE_PLAN_FIELDS(SELKV_PLAN_ENUM) kPlanSize };
#undef SELKV_PLAN_ENUM

#define SELKV_PLAN_NAME(field, name) name,
constexpr const char* kPlanFieldNames[kPlanSize] = {SELKV_DECODE_PLAN_FIELDS(SELKV_PLAN_NAME)};
#undef SELKV_PLAN_NAME
#undef SELKV_DECODE_PLAN_FIELDS

// Plan value `f` as an int32 field of DecodeShape / DecodeMetadata (to_int32's message, built
// only on failure: this runs on every decode call). `op` is the decode op that received the plan.
int32_t plan_int32(const char* op, c10::IntArrayRef plan, PlanField f) {
  const int64_t v = plan[f];
  TORCH_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
              op, ": plan[", kPlanFieldNames[f], "]: ", v, " does not fit in int32");
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
  plan[kPlanExtraTopk] = md.shape.extra_topk;
  plan[kPlanExtraTopkLength] = int64_t(reinterpret_cast<uintptr_t>(md.shape.extra_topk_length));
  return plan;
}

// The host-side DecodeMetadata a plan describes, over the device (or host) buffer `metadata`.
DecodeMetadata metadata_of(const char* op, const at::Tensor& metadata, c10::IntArrayRef plan) {
  TORCH_CHECK(plan.size() == size_t(kPlanSize), op, ": plan: expected the ", int(kPlanSize),
              " values returned by get_decode_metadata, got ", plan.size());
  DecodeMetadata md;
  md.data = static_cast<int32_t*>(mutable_data_or_null(metadata));
  // (meta tensors: no data and possibly symbolic sizes; nothing reads these fields then)
  md.bytes = metadata.is_meta() ? 0 : size_t(metadata.numel()) * sizeof(int32_t);
  md.shape.batch = plan_int32(op, plan, kPlanBatch);
  md.shape.seq_q = plan_int32(op, plan, kPlanSeqQ);
  md.shape.num_heads = plan_int32(op, plan, kPlanHeads);
  md.shape.topk = plan_int32(op, plan, kPlanTopk);
  md.shape.topk_length = reinterpret_cast<const int32_t*>(uintptr_t(plan[kPlanTopkLength]));
  md.shape.num_sms = plan_int32(op, plan, kPlanNumSms);
  md.num_sm_parts = plan_int32(op, plan, kPlanParts);
  md.min_blocks_per_part = plan_int32(op, plan, kPlanMinBlocks);
  md.shape.extra_topk = plan_int32(op, plan, kPlanExtraTopk);
  md.shape.extra_topk_length = reinterpret_cast<const int32_t*>(uintptr_t(plan[kPlanExtraTopkLength]));
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
                                         int64_t min_blocks_per_part, int64_t extra_topk,
                                         const std::optional<at::Tensor>& extra_topk_length) {
  constexpr const char* kOp = kPlanOp;
  check_devices(kOp, device_type(B),
                {{"metadata", metadata}, {"topk_length", topk_length}, {"extra_topk_length", extra_topk_length}});
  TensorArg(kOp, "metadata", metadata, "[decode_metadata_size(batch, seq_q)]")
      .dtype(at::kInt).dims(1).contiguous();
  if (topk_length.has_value()) {
    TensorArg(kOp, "topk_length", *topk_length, "[batch]")
        .dtype(at::kInt).dims(1).size(0, batch).contiguous();
  }
  if (extra_topk_length.has_value()) {
    TensorArg(kOp, "extra_topk_length", *extra_topk_length, "[batch]")
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
  shape.extra_topk = to_int32(kOp, "extra_topk", extra_topk);
  shape.extra_topk_length = static_cast<const int32_t*>(data_or_null(extra_topk_length));
  DecodeMetadata md;
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(metadata);
    throw_if_error(selkv::make_decode_metadata(shape, metadata.mutable_data_ptr(),
                                               size_t(metadata.numel()) * sizeof(int32_t), &md,
                                               scope.stream()));
  } else {
    // CPU: the oracle's one-part plan with the lengths snapshot (ref::make_decode_metadata).
    throw_if_error(selkv::ref::make_decode_metadata(shape, mutable_data_or_null(metadata),
                                                    size_t(metadata.numel()) * sizeof(int32_t), &md));
  }
  return plan_of(md);
}

// ---- selkv::sparse_mla_decode and selkv::sparse_mla_decode_packed ------------------------------
// q's tensor checks; its (batch, seq_q, num_heads) size every other tensor.
struct QShape {
  int64_t b, s, h;
};
// d_qk: 576 (ds_mla_fp8, the packed buffer) or 512 (model1_fp8).
QShape check_q_tensor(const char* kOp, const at::Tensor& q, int64_t d_qk = fmt::kQkDim) {
  TensorArg(kOp, "q", q, d_qk == fmt::kQkDim ? "[batch, seq_q, num_heads, 576]" : "[batch, seq_q, num_heads, 512]")
      .dtype(at::kBFloat16).dims(4).size(3, d_qk).inner_contiguous();
  return {q.size(0), q.size(1), q.size(2)};
}

// The cache's record format, from its last dim: 656 bytes ds_mla_fp8, 584 model1_fp8 (FlashMLA's
// MODEL1 tensor [num_blocks, page_size, 584] over padded pages); a 3-d cache of neither is an
// error naming both sizes, another rank is check_cache_tensor's (as ds_mla_fp8).
KvFormat decode_cache_format(const char* kOp, const at::Tensor& kv_cache) {
  if (kv_cache.dim() != 3) return KvFormat::kDsMlaFp8;
  const int64_t rec = kv_cache.size(2);
  TORCH_CHECK(rec == fmt::record_bytes(KvFormat::kDsMlaFp8) || rec == fmt::kModel1RecordBytes, kOp,
              ": kv_cache: expected size 656 (ds_mla_fp8) or 584 (model1_fp8) in dim 2, got shape ",
              kv_cache.sizes());
  return rec == fmt::kModel1RecordBytes ? KvFormat::kModel1Fp8 : KvFormat::kDsMlaFp8;
}

// The tensors both decodes take besides q and the KV source: topk_length, attn_sink, out, lse.
void check_aux_tensors(const char* kOp, const QShape& qs,
                       const std::optional<at::Tensor>& topk_length,
                       const std::optional<at::Tensor>& attn_sink, const at::Tensor& out,
                       const at::Tensor& lse) {
  const int64_t b = qs.b, s = qs.s, h = qs.h;
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
}

// The fields of SparseDecodeParams / PackedDecodeParams other than the KV source (after the
// tensor checks above).
template <class P>
void set_common_params(const char* kOp, P* p, const at::Tensor& q,
                       const std::optional<at::Tensor>& topk_length,
                       const std::optional<at::Tensor>& attn_sink, double sm_scale,
                       const at::Tensor& out, const at::Tensor& lse) {
  p->q = data_or_null(q);
  p->q_batch_stride = q.stride(0);
  p->q_seq_stride = q.stride(1);
  p->q_head_stride = q.stride(2);
  p->batch = to_int32(kOp, "batch (q.size(0))", q.size(0));
  p->seq_q = to_int32(kOp, "seq_q (q.size(1))", q.size(1));
  p->num_heads = to_int32(kOp, "num_heads (q.size(2))", q.size(2));
  p->topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  p->attn_sink = static_cast<const float*>(data_or_null(attn_sink));
  p->sm_scale = to_float(kOp, "sm_scale", sm_scale);
  p->out = mutable_data_or_null(out);
  p->out_batch_stride = out.stride(0);
  p->out_seq_stride = out.stride(1);
  p->out_head_stride = out.stride(2);
  p->lse = static_cast<float*>(mutable_data_or_null(lse));
  p->lse_batch_stride = lse.stride(0);
  p->lse_seq_stride = lse.stride(1);
}

SparseDecodeParams decode_params(const at::Tensor& q, const at::Tensor& kv_cache,
                                 const at::Tensor& indices,
                                 const std::optional<at::Tensor>& topk_length,
                                 const std::optional<at::Tensor>& attn_sink, double sm_scale,
                                 const at::Tensor& out, const at::Tensor& lse,
                                 const std::optional<at::Tensor>& extra_kv_cache,
                                 const std::optional<at::Tensor>& extra_indices,
                                 const std::optional<at::Tensor>& extra_topk_length) {
  constexpr const char* kOp = kDecodeOp;
  const KvFormat format = decode_cache_format(kOp, kv_cache);
  const QShape qs = check_q_tensor(kOp, q, fmt::dequant_dim(format));
  const CacheTensorView cv = check_cache_tensor(kOp, "kv_cache", kv_cache, format);
  TensorArg(kOp, "indices", indices, "[batch, seq_q, topk]")
      .dtype(at::kInt).dims(3).size(0, qs.b).size(1, qs.s).inner_contiguous();
  check_aux_tensors(kOp, qs, topk_length, attn_sink, out, lse);
  // The extra cache comes with its indices; its lengths only with both (the C++ API checks the
  // rest: model1_fp8 only, the plan's extra_topk and extra_topk_length).
  TORCH_CHECK(extra_kv_cache.has_value() == extra_indices.has_value(), kOp, ": ",
              extra_kv_cache.has_value() ? "extra_indices" : "extra_kv_cache",
              ": extra_kv_cache and extra_indices go together");
  TORCH_CHECK(!extra_topk_length.has_value() || extra_kv_cache.has_value(), kOp,
              ": extra_topk_length: given without extra_kv_cache");

  SparseDecodeParams p;
  set_common_params(kOp, &p, q, topk_length, attn_sink, sm_scale, out, lse);
  p.cache.data = data_or_null(kv_cache);
  p.cache.num_blocks = cv.num_blocks;
  p.cache.page_size = cv.page_size;
  p.cache.block_stride_bytes = cv.block_stride_bytes;
  p.cache.format = format;
  p.indices = static_cast<const int32_t*>(data_or_null(indices));
  p.indices_batch_stride = indices.stride(0);
  p.indices_seq_stride = indices.stride(1);
  p.topk = to_int32(kOp, "topk (indices.size(2))", indices.size(2));
  if (extra_kv_cache.has_value()) {
    const CacheTensorView xv = check_cache_tensor(kOp, "extra_kv_cache", *extra_kv_cache, format);
    TensorArg(kOp, "extra_indices", *extra_indices, "[batch, seq_q, extra_topk]")
        .dtype(at::kInt).dims(3).size(0, qs.b).size(1, qs.s).inner_contiguous();
    if (extra_topk_length.has_value()) {
      TensorArg(kOp, "extra_topk_length", *extra_topk_length, "[batch]")
          .dtype(at::kInt).dims(1).size(0, qs.b).contiguous();
    }
    p.extra_cache.data = data_or_null(*extra_kv_cache);
    p.extra_cache.num_blocks = xv.num_blocks;
    p.extra_cache.page_size = xv.page_size;
    p.extra_cache.block_stride_bytes = xv.block_stride_bytes;
    p.extra_cache.format = format;
    p.extra_indices = static_cast<const int32_t*>(data_or_null(*extra_indices));
    p.extra_indices_batch_stride = extra_indices->stride(0);
    p.extra_indices_seq_stride = extra_indices->stride(1);
    p.extra_topk = to_int32(kOp, "extra_topk (extra_indices.size(2))", extra_indices->size(2));
    p.extra_topk_length = static_cast<const int32_t*>(data_or_null(extra_topk_length));
  }
  return p;
}

PackedDecodeParams packed_decode_params(const at::Tensor& q, const at::Tensor& packed_kv,
                                        int64_t topk, const std::optional<at::Tensor>& topk_length,
                                        const std::optional<at::Tensor>& attn_sink, double sm_scale,
                                        const at::Tensor& out, const at::Tensor& lse) {
  constexpr const char* kOp = kPackedDecodeOp;
  const QShape qs = check_q_tensor(kOp, q);
  // Opaque bytes: any shape; its size is checked by the C++ API against (batch, seq_q, topk).
  TensorArg(kOp, "packed_kv", packed_kv, "[packed_kv_workspace_size(batch, seq_q, topk)] bytes")
      .dtype(at::kByte).contiguous();
  check_aux_tensors(kOp, qs, topk_length, attn_sink, out, lse);

  PackedDecodeParams p;
  set_common_params(kOp, &p, q, topk_length, attn_sink, sm_scale, out, lse);
  p.packed_kv = data_or_null(packed_kv);
  // (meta tensors: possibly a symbolic size; nothing reads the field then)
  p.packed_kv_bytes = packed_kv.is_meta() ? 0 : size_t(packed_kv.numel());
  p.topk = to_int32(kOp, "topk", topk);
  return p;
}

// q of a call gathered into the dense [B, S_q, H, D] layout the oracles take (D = 576, or 512
// for model1_fp8).
template <class P>
std::vector<uint16_t> dense_q(const P& p, int D = fmt::kQkDim) {
  const int B = p.batch, S = p.seq_q, H = p.num_heads;
  std::vector<uint16_t> q(size_t(B) * S * H * D);
  const auto* qs = static_cast<const uint16_t*>(p.q);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h)
        std::memcpy(&q[((size_t(b) * S + s) * H + h) * D],
                    qs + b * p.q_batch_stride + s * p.q_seq_stride + h * p.q_head_stride, D * 2);
  return q;
}

// The oracle's dense out [B, S_q, H, 512] (rounded to bf16) and lse [B, S_q, H] written through
// the call's output strides.
template <class P>
void write_outputs(const P& p, const std::vector<float>& out, const std::vector<float>& lse) {
  const int B = p.batch, S = p.seq_q, H = p.num_heads;
  constexpr int V = fmt::kVDim;
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

// The plan's lengths snapshot (get_decode_metadata's CPU branch) when the call has topk_length:
// the oracles read the lengths from there, as the GPU kernels do.
template <class P>
const int32_t* planned_lengths(const P& p, const DecodeMetadata& md) {
  return p.topk_length != nullptr ? md.data + decode::md_lengths_offset(p.batch * p.seq_q) : nullptr;
}
// The same for the extra cache's lengths.
const int32_t* planned_extra_lengths(const SparseDecodeParams& p, const DecodeMetadata& md) {
  return p.extra_topk_length != nullptr ? md.data + decode::md_extra_lengths_offset(p.batch * p.seq_q, p.batch)
                                        : nullptr;
}

// An index tensor [B, S_q, K] gathered dense.
std::vector<int32_t> dense_indices(const int32_t* idx, int64_t bs, int64_t ss, int B, int S, int K) {
  std::vector<int32_t> d(size_t(B) * S * K);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      std::memcpy(&d[(size_t(b) * S + s) * K], idx + b * bs + s * ss, size_t(K) * 4);
  return d;
}

// The oracle on host tensors: gathers q / indices into the dense layout it takes, writes out
// (rounded to bf16) and lse through the output strides.
void run_oracle(const SparseDecodeParams& p, const DecodeMetadata& md) {
  const int B = p.batch, S = p.seq_q, H = p.num_heads, K = p.topk;
  const size_t rows = size_t(B) * S;
  const std::vector<uint16_t> q = dense_q(p, fmt::dequant_dim(p.cache.format));
  const std::vector<int32_t> idx = dense_indices(p.indices, p.indices_batch_stride, p.indices_seq_stride, B, S, K);
  const std::vector<int32_t> idx2 =
      p.extra_topk > 0 ? dense_indices(p.extra_indices, p.extra_indices_batch_stride, p.extra_indices_seq_stride, B,
                                       S, p.extra_topk)
                       : std::vector<int32_t>();
  std::vector<float> out(rows * H * fmt::kVDim), lse(rows * H);
  ref::SparseDecodeRefArgs a;
  a.q = q.data();
  a.B = B;
  a.S_q = S;
  a.H = H;
  a.cache = p.cache;
  a.indices = idx.data();
  a.K = K;
  a.topk_length = planned_lengths(p, md);
  if (p.extra_topk > 0) {
    a.extra_cache = p.extra_cache;
    a.extra_indices = idx2.data();
    a.K2 = p.extra_topk;
    a.extra_topk_length = planned_extra_lengths(p, md);
  }
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.attn_sink;
  a.out = out.data();
  a.lse = lse.data();
  a.empty_lse_pos_inf = p.empty_lse_pos_inf;
  throw_if_error(ref::check_sparse_decode_args(a));
  ref::sparse_decode(a);
  write_outputs(p, out, lse);
}

// The packed oracle on host tensors (the buffer is read in place).
void run_packed_oracle(const PackedDecodeParams& p, const DecodeMetadata& md) {
  const size_t rows = size_t(p.batch) * p.seq_q;
  const std::vector<uint16_t> q = dense_q(p);
  std::vector<float> out(rows * p.num_heads * fmt::kVDim), lse(rows * p.num_heads);
  ref::SparseDecodePackedRefArgs a;
  a.q = q.data();
  a.B = p.batch;
  a.S_q = p.seq_q;
  a.H = p.num_heads;
  a.packed_kv = static_cast<const uint8_t*>(p.packed_kv);
  a.packed_kv_bytes = p.packed_kv_bytes;
  a.K = p.topk;
  a.topk_length = planned_lengths(p, md);
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.attn_sink;
  a.out = out.data();
  a.lse = lse.data();
  a.empty_lse_pos_inf = p.empty_lse_pos_inf;
  throw_if_error(ref::check_sparse_decode_packed_args(a));
  ref::sparse_decode_packed(a);
  write_outputs(p, out, lse);
}

// The metadata and workspace tensors (the C++ API checks the plan and the workspace's size).
void check_plan_tensors(const char* kOp, const at::Tensor& metadata, const at::Tensor& workspace) {
  TensorArg(kOp, "metadata", metadata, "[decode_metadata_size(batch, seq_q)]")
      .dtype(at::kInt).dims(1).contiguous();
  TensorArg(kOp, "workspace", workspace, "[plan workspace_bytes]").dtype(at::kByte).dims(1).contiguous();
}

// Meta kernels: the C++ checks on stand-in pointers (MetaStandIns). A length tensor stands in as
// the address the plan recorded (the plan is matched to the tensors it was made with). `md` gets
// the metadata's stand-in and size; false when a size is symbolic (then the call is checked when
// it runs).
const int32_t* stand_in_lengths(const std::optional<at::Tensor>& t, const int32_t* planned, MetaStandIns& stand_in) {
  if (!t.has_value()) return nullptr;
  return planned != nullptr ? planned : static_cast<const int32_t*>(stand_in(t));
}
template <class P>
bool meta_stand_ins(MetaStandIns& stand_in, P* p, DecodeMetadata* md, const at::Tensor& q, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& metadata, const at::Tensor& workspace,
                    const std::optional<at::Tensor>& topk_length, const std::optional<at::Tensor>& attn_sink,
                    size_t* workspace_bytes) {
  const auto md_ints = metadata.sym_numel().maybe_as_int();
  const auto ws = workspace.sym_numel().maybe_as_int();
  if (!md_ints.has_value() || !ws.has_value()) return false;
  p->q = stand_in(q);
  p->out = stand_in(out);
  p->lse = static_cast<float*>(stand_in(lse));
  p->topk_length = stand_in_lengths(topk_length, md->shape.topk_length, stand_in);
  p->attn_sink = static_cast<const float*>(stand_in(attn_sink));
  md->data = static_cast<int32_t*>(stand_in(metadata));  // null for an empty tensor, as when run
  md->bytes = size_t(*md_ints) * sizeof(int32_t);
  md->valid = md->data != nullptr;
  *workspace_bytes = size_t(*ws);
  return true;
}

template <Backend B>
void sparse_mla_decode(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& indices,
                       const std::optional<at::Tensor>& topk_length,
                       const std::optional<at::Tensor>& attn_sink, const at::Tensor& metadata,
                       c10::IntArrayRef plan, const at::Tensor& workspace, double sm_scale,
                       const at::Tensor& out, const at::Tensor& lse,
                       const std::optional<at::Tensor>& extra_kv_cache,
                       const std::optional<at::Tensor>& extra_indices,
                       const std::optional<at::Tensor>& extra_topk_length, bool empty_lse_pos_inf) {
  constexpr const char* kOp = kDecodeOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"lse", lse}, {"q", q}, {"kv_cache", kv_cache}, {"indices", indices},
                 {"topk_length", topk_length}, {"attn_sink", attn_sink}, {"metadata", metadata},
                 {"workspace", workspace}, {"extra_kv_cache", extra_kv_cache}, {"extra_indices", extra_indices},
                 {"extra_topk_length", extra_topk_length}});
  check_plan_tensors(kOp, metadata, workspace);
  SparseDecodeParams p = decode_params(q, kv_cache, indices, topk_length, attn_sink, sm_scale, out, lse,
                                       extra_kv_cache, extra_indices, extra_topk_length);
  p.empty_lse_pos_inf = empty_lse_pos_inf;
  const DecodeMetadata md = metadata_of(kOp, metadata, plan);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    DecodeMetadata m = md;
    size_t ws_bytes = 0;
    if (meta_stand_ins(stand_in, &p, &m, q, out, lse, metadata, workspace, topk_length, attn_sink, &ws_bytes)) {
      p.cache.data = stand_in(kv_cache);
      p.indices = static_cast<const int32_t*>(stand_in(indices));
      if (extra_kv_cache.has_value()) {
        p.extra_cache.data = stand_in(*extra_kv_cache);
        p.extra_indices = static_cast<const int32_t*>(stand_in(extra_indices));
        p.extra_topk_length = stand_in_lengths(extra_topk_length, m.shape.extra_topk_length, stand_in);
      }
      throw_if_error(selkv::check_sparse_mla_decode(p, m, ws_bytes));
    }
    return;
  }
  const size_t ws_bytes = size_t(workspace.numel());
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::sparse_mla_decode(p, md, workspace.mutable_data_ptr(), ws_bytes, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_sparse_mla_decode(p, md, ws_bytes));
    run_oracle(p, md);
  }
}

template <Backend B>
void sparse_mla_decode_packed(const at::Tensor& q, const at::Tensor& packed_kv, int64_t topk,
                              const std::optional<at::Tensor>& topk_length,
                              const std::optional<at::Tensor>& attn_sink,
                              const at::Tensor& metadata, c10::IntArrayRef plan,
                              const at::Tensor& workspace, double sm_scale, const at::Tensor& out,
                              const at::Tensor& lse, bool empty_lse_pos_inf) {
  constexpr const char* kOp = kPackedDecodeOp;
  check_devices(kOp, device_type(B),
                {{"out", out}, {"lse", lse}, {"q", q}, {"packed_kv", packed_kv},
                 {"topk_length", topk_length}, {"attn_sink", attn_sink}, {"metadata", metadata},
                 {"workspace", workspace}});
  check_plan_tensors(kOp, metadata, workspace);
  PackedDecodeParams p = packed_decode_params(q, packed_kv, topk, topk_length, attn_sink, sm_scale, out, lse);
  p.empty_lse_pos_inf = empty_lse_pos_inf;
  const DecodeMetadata md = metadata_of(kOp, metadata, plan);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    DecodeMetadata m = md;
    size_t ws_bytes = 0;
    const auto kv_bytes = packed_kv.sym_numel().maybe_as_int();
    if (kv_bytes.has_value() && meta_stand_ins(stand_in, &p, &m, q, out, lse, metadata, workspace, topk_length, attn_sink, &ws_bytes)) {
      p.packed_kv = stand_in(packed_kv);
      p.packed_kv_bytes = size_t(*kv_bytes);
      throw_if_error(selkv::check_sparse_mla_decode_packed(p, m, ws_bytes));
    }
    return;
  }
  const size_t ws_bytes = size_t(workspace.numel());
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::sparse_mla_decode_packed(p, md, workspace.mutable_data_ptr(), ws_bytes,
                                                   scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_sparse_mla_decode_packed(p, md, ws_bytes));
    run_packed_oracle(p, md);
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
      "int num_sms, Tensor(a!) metadata, int min_blocks_per_part=0, int extra_topk=0, "
      "Tensor? extra_topk_length=None) -> int[]");
  m.def(
      "sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_length, "
      "Tensor? attn_sink, Tensor metadata, int[] plan, Tensor(a!) workspace, float sm_scale, "
      "Tensor(b!) out, Tensor(c!) lse, Tensor? extra_kv_cache=None, Tensor? extra_indices=None, "
      "Tensor? extra_topk_length=None, bool empty_lse_pos_inf=False) -> ()",
      tags);
  m.def(
      "sparse_mla_decode_packed(Tensor q, Tensor packed_kv, int topk, Tensor? topk_length, "
      "Tensor? attn_sink, Tensor metadata, int[] plan, Tensor(a!) workspace, float sm_scale, "
      "Tensor(b!) out, Tensor(c!) lse, bool empty_lse_pos_inf=False) -> ()",
      tags);
}

TORCH_LIBRARY_IMPL(selkv, CUDA, m) {
  using namespace ::selkv::torch_ext;
  m.impl("get_decode_metadata", TORCH_FN(get_decode_metadata<Backend::kCuda>));
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kCuda>));
  m.impl("sparse_mla_decode_packed", TORCH_FN(sparse_mla_decode_packed<Backend::kCuda>));
}
TORCH_LIBRARY_IMPL(selkv, CPU, m) {
  using namespace ::selkv::torch_ext;
  m.impl("get_decode_metadata", TORCH_FN(get_decode_metadata<Backend::kCpu>));
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kCpu>));
  m.impl("sparse_mla_decode_packed", TORCH_FN(sparse_mla_decode_packed<Backend::kCpu>));
}
TORCH_LIBRARY_IMPL(selkv, Meta, m) {
  using namespace ::selkv::torch_ext;
  m.impl("sparse_mla_decode", TORCH_FN(sparse_mla_decode<Backend::kMeta>));
  m.impl("sparse_mla_decode_packed", TORCH_FN(sparse_mla_decode_packed<Backend::kMeta>));
}
