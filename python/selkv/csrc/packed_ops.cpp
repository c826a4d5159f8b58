// torch ops for the C6 pack / patch stages (include/selkv/packed.h):
//   selkv::packed_kv_workspace_size, selkv::pack_selected_kv, selkv::patch_packed_kv.
// Out-variants: the caller owns the packed buffer (uint8, contiguous, at least
// packed_kv_workspace_size bytes). CUDA kernels run the C++ API on torch's current stream (graph
// capturable, no host sync); CPU kernels run the oracle on the same Params (byte-exact); Meta
// kernels run the C++ checks on stand-in pointers (torch.compile). Tensor-level checks (dtype,
// device, rank, sizes) are here; strides, alignment, sizes of the buffer and overlaps are the C++
// API's (same names).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "op_utils.h"
#include "reference/oracle.h"
#include "selkv/packed.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

constexpr const char* kPackOp = "selkv::pack_selected_kv";
constexpr const char* kPatchOp = "selkv::patch_packed_kv";

int64_t packed_kv_workspace_size_op(int64_t batch, int64_t seq_q, int64_t topk) {
  return int64_t(selkv::packed_kv_workspace_size(batch, seq_q, topk));
}

// The packed buffer: any contiguous uint8 tensor; its numel is the byte size.
void check_packed_tensor(const char* op, const at::Tensor& packed_kv) {
  TensorArg(op, "packed_kv", packed_kv, "[>= packed_kv_workspace_size(batch, seq_q, topk)] bytes")
      .dtype(at::kByte).contiguous();
}

// Byte size of the packed buffer; unknown (nullopt) for a tensor of symbolic size (torch.compile's
// dynamic-shape tracing), whose numel() cannot be read.
std::optional<size_t> packed_bytes(const at::Tensor& packed_kv) {
  if (packed_kv.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return std::nullopt;
  return size_t(packed_kv.numel());
}

// Meta tensors of symbolic size (the C++ checks need every size): the shape rules and the buffer
// size, when known.
void meta_checks(const char* op, int64_t batch, int64_t seq_q, int64_t topk, std::optional<size_t> bytes) {
  const size_t need = selkv::packed_kv_workspace_size(batch, seq_q, topk);
  TORCH_CHECK(topk > 0 && topk % 64 == 0 && (batch * seq_q == 0 || need > 0), op,
              ": topk: must be a positive multiple of 64 with batch * seq_q * topk < 2^31, got (", batch, ", ",
              seq_q, ", ", topk, ")");
  TORCH_CHECK(!bytes.has_value() || *bytes >= need, op, ": packed_kv_bytes: needs ", need, " bytes, got ",
              bytes.value_or(0));
}

template <Backend B>
void pack_selected_kv(const at::Tensor& kv_cache, const at::Tensor& indices,
                      const std::optional<at::Tensor>& topk_length, const at::Tensor& packed_kv) {
  constexpr const char* kOp = kPackOp;
  check_devices(kOp, device_type(B),
                {{"packed_kv", packed_kv}, {"kv_cache", kv_cache}, {"indices", indices}, {"topk_length", topk_length}});
  const CacheTensorView cv = check_cache_tensor(kOp, "kv_cache", kv_cache, KvFormat::kDsMlaFp8);
  TensorArg(kOp, "indices", indices, "[batch, seq_q, topk]").dtype(at::kInt).dims(3).inner_contiguous();
  const int64_t b = indices.size(0), s = indices.size(1), k = indices.size(2);
  if (topk_length.has_value())
    TensorArg(kOp, "topk_length", *topk_length, "[batch]").dtype(at::kInt).dims(1).size(0, b).contiguous();
  check_packed_tensor(kOp, packed_kv);

  PackSelectedKvParams p;
  p.cache = PagedKvCache{data_or_null(kv_cache), cv.num_blocks, cv.page_size, cv.block_stride_bytes,
                         KvFormat::kDsMlaFp8};
  p.indices = static_cast<const int32_t*>(data_or_null(indices));
  p.indices_batch_stride = indices.stride(0);
  p.indices_seq_stride = indices.stride(1);
  p.batch = to_int32(kOp, "batch (indices.size(0))", b);
  p.seq_q = to_int32(kOp, "seq_q (indices.size(1))", s);
  p.topk = to_int32(kOp, "topk (indices.size(2))", k);
  p.topk_length = static_cast<const int32_t*>(data_or_null(topk_length));
  p.packed_kv = mutable_data_or_null(packed_kv);
  const std::optional<size_t> bytes = packed_bytes(packed_kv);
  p.packed_kv_bytes = bytes.value_or(0);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (bytes.has_value() && concrete_sizes({kv_cache, indices, topk_length})) {
      PackSelectedKvParams m = p;  // the C++ checks on stand-ins
      m.cache.data = stand_in(kv_cache);
      m.indices = static_cast<const int32_t*>(stand_in(indices));
      m.topk_length = static_cast<const int32_t*>(stand_in(topk_length));
      m.packed_kv = stand_in(packed_kv);
      throw_if_error(selkv::check_pack_selected_kv(m));
    } else {
      meta_checks(kOp, b, s, k, bytes);
    }
  } else if constexpr (B == Backend::kCuda) {
    const CudaScope scope(packed_kv);
    throw_if_error(selkv::pack_selected_kv(p, scope.stream()));
  } else {
    throw_if_error(selkv::ref::pack_selected_kv(p));
  }
}

template <Backend B>
void patch_packed_kv(const at::Tensor& packed_kv, int64_t batch, int64_t seq_q, int64_t topk,
                     const at::Tensor& positions, const at::Tensor& records) {
  constexpr const char* kOp = kPatchOp;
  check_devices(kOp, device_type(B), {{"packed_kv", packed_kv}, {"positions", positions}, {"records", records}});
  check_packed_tensor(kOp, packed_kv);
  TensorArg(kOp, "positions", positions, "[num_records]").dtype(at::kLong).dims(1).contiguous();
  const int64_t n = positions.size(0);
  constexpr int64_t kRecord = KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes;  // the packed record
  TensorArg(kOp, "records", records, "[num_records, >= 656]")
      .dtype(at::kByte).dims(2).size(0, n).min_size(1, kRecord).inner_contiguous();

  PatchPackedKvParams p;
  p.packed_kv = mutable_data_or_null(packed_kv);
  const std::optional<size_t> bytes = packed_bytes(packed_kv);
  p.packed_kv_bytes = bytes.value_or(0);
  p.batch = to_int32(kOp, "batch", batch);
  p.seq_q = to_int32(kOp, "seq_q", seq_q);
  p.topk = to_int32(kOp, "topk", topk);
  p.positions = static_cast<const int64_t*>(data_or_null(positions));
  p.records = static_cast<const uint8_t*>(data_or_null(records));
  // The stride of a dim of size <= 1 carries no information: the dense value then.
  p.record_stride_bytes = n <= 1 ? std::max<int64_t>(records.stride(0), kRecord) : records.stride(0);
  p.num_records = n;
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (bytes.has_value() && concrete_sizes({positions, records})) {
      PatchPackedKvParams m = p;
      m.packed_kv = stand_in(packed_kv);
      m.positions = static_cast<const int64_t*>(stand_in(positions));
      m.records = static_cast<const uint8_t*>(stand_in(records));
      throw_if_error(selkv::check_patch_packed_kv(m));
    } else {
      meta_checks(kOp, batch, seq_q, topk, bytes);
    }
  } else if constexpr (B == Backend::kCuda) {
    const CudaScope scope(packed_kv);
    throw_if_error(selkv::patch_packed_kv(p, scope.stream()));
  } else {
    throw_if_error(selkv::ref::patch_packed_kv(p));
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("packed_kv_workspace_size(int batch, int seq_q, int topk) -> int",
        &::selkv::torch_ext::packed_kv_workspace_size_op);
  m.def("pack_selected_kv(Tensor kv_cache, Tensor indices, Tensor? topk_length, Tensor(a!) packed_kv) -> ()", tags);
  m.def(
      "patch_packed_kv(Tensor(a!) packed_kv, int batch, int seq_q, int topk, Tensor positions, Tensor records) -> ()",
      tags);
}

#define SELKV_REGISTER_PACKED_OPS(KEY, BACKEND)                         \
  TORCH_LIBRARY_IMPL(selkv, KEY, m) {                                   \
    using namespace ::selkv::torch_ext;                                 \
    m.impl("pack_selected_kv", TORCH_FN(pack_selected_kv<BACKEND>));    \
    m.impl("patch_packed_kv", TORCH_FN(patch_packed_kv<BACKEND>));      \
  }

SELKV_REGISTER_PACKED_OPS(CUDA, Backend::kCuda)
SELKV_REGISTER_PACKED_OPS(CPU, Backend::kCpu)
SELKV_REGISTER_PACKED_OPS(Meta, Backend::kMeta)
