// torch ops for the KV-cache operations C1-C3 (include/selkv/cache_ops.h):
//   selkv::write_kv_cache, selkv::convert_req_indices_to_slots, selkv::gather_kv_bf16.
// Out-variants (the caller owns all memory; nothing is allocated here). CUDA kernels run the
// C++ API on torch's current stream; CPU kernels run the CPU oracle (selkv::ref) on the same
// Params struct, so GPU and CPU results can be compared bit for bit; Meta kernels run the C++
// API's checks (selkv::check_*) on stand-in pointers, so a traced call fails as the run would.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <string_view>

#include "op_utils.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

// ---- C1: write_kv_cache ----------------------------------------------------------------------
constexpr const char* kWriteOp = "selkv::write_kv_cache";

WriteKvCacheParams write_params(const at::Tensor& latent, const std::optional<at::Tensor>& rope,
                                const at::Tensor& slot_mapping, const at::Tensor& cache,
                                std::string_view format, std::string_view scale_mode) {
  constexpr const char* kOp = kWriteOp;
  WriteKvCacheParams p;
  p.format = parse_format(kOp, format);
  p.scale_mode = parse_scale_mode(kOp, scale_mode);
  TORCH_CHECK(p.format != KvFormat::kModel1Fp8 || p.scale_mode == ScaleMode::kPow2, kOp,
              ": scale_mode: model1_fp8 stores UE8M0 (power-of-two) scales: scale_mode must be 'pow2', got '",
              scale_mode, "'");

  const int nope = fmt::nope_dim(p.format);
  TensorArg(kOp, "latent", latent, nope == 448 ? "[num_tokens, 448] for model1_fp8" : "[num_tokens, 512]")
      .dtype(at::kBFloat16).dims(2).size(1, nope).inner_contiguous();
  const int64_t num_tokens = latent.size(0);
  if (fmt::has_rope(p.format)) {
    TORCH_CHECK(rope.has_value(), kOp, ": rope: required for format '", fmt::format_name(p.format), "'");
    TensorArg(kOp, "rope", *rope, "[num_tokens, 64]")
        .dtype(at::kBFloat16).dims(2).size(0, num_tokens).size(1, fmt::kRopeDim)
        .inner_contiguous();
    p.rope = data_or_null(*rope);
    p.rope_row_stride = rope->stride(0);
  } else {
    TORCH_CHECK(!rope.has_value(), kOp,
                ": rope: must be None for format 'nope_fp8' (its records carry no RoPE)");
  }
  TensorArg(kOp, "slot_mapping", slot_mapping, "[num_tokens]")
      .dtype(at::kLong).dims(1).size(0, num_tokens).contiguous();
  const CacheTensorView cv = check_cache_tensor(kOp, "cache", cache, p.format);

  p.latent = data_or_null(latent);
  p.latent_row_stride = latent.stride(0);
  p.slot_mapping = static_cast<const int64_t*>(data_or_null(slot_mapping));
  p.num_tokens = num_tokens;
  p.cache = mutable_data_or_null(cache);
  p.num_blocks = cv.num_blocks;
  p.page_size = cv.page_size;
  p.block_stride_bytes = cv.block_stride_bytes;
  return p;
}

template <Backend B>
void write_kv_cache(const at::Tensor& latent, const std::optional<at::Tensor>& rope,
                    const at::Tensor& slot_mapping, const at::Tensor& cache,
                    c10::string_view format, c10::string_view scale_mode) {
  check_devices(kWriteOp, device_type(B),
                {{"cache", cache}, {"latent", latent}, {"rope", rope},
                 {"slot_mapping", slot_mapping}});
  const WriteKvCacheParams p = write_params(latent, rope, slot_mapping, cache, format, scale_mode);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({latent, rope, slot_mapping, cache})) {
      WriteKvCacheParams m = p;
      m.latent = stand_in(latent);
      m.rope = stand_in(rope);
      m.slot_mapping = static_cast<const int64_t*>(stand_in(slot_mapping));
      m.cache = stand_in(cache);
      throw_if_error(selkv::check_write_kv_cache(m));
    }
  } else if constexpr (B == Backend::kCuda) {
    const CudaScope scope(cache);
    throw_if_error(selkv::write_kv_cache(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_write_kv_cache(p));  // the CUDA run's rules, then the oracle
    throw_if_error(selkv::ref::write_kv_cache(p));
  }
}

// ---- C2: convert_req_indices_to_slots --------------------------------------------------------
constexpr const char* kConvertOp = "selkv::convert_req_indices_to_slots";

ConvertIndicesParams convert_params(const at::Tensor& req_local_indices,
                                    const at::Tensor& req_id_per_token,
                                    const at::Tensor& block_table, int64_t page_size,
                                    int64_t num_blocks, const at::Tensor& out_slots,
                                    const std::optional<at::Tensor>& valid_counts, bool compact) {
  constexpr const char* kOp = kConvertOp;
  TensorArg(kOp, "req_local_indices", req_local_indices, "[num_tokens, topk]")
      .dtype(at::kInt).dims(2).inner_contiguous();
  const int64_t num_tokens = req_local_indices.size(0);
  const int64_t topk = req_local_indices.size(1);
  // Only the first num_tokens entries are read; a longer vector is allowed.
  TensorArg(kOp, "req_id_per_token", req_id_per_token, "[>= num_tokens]")
      .dtype(at::kInt).dims(1).min_size(0, num_tokens).contiguous();
  TensorArg(kOp, "block_table", block_table, "[num_reqs, max_blocks_per_req]")
      .dtype(at::kInt).dims(2).inner_contiguous();
  TensorArg(kOp, "out_slots", out_slots, "[num_tokens, topk]")
      .dtype(at::kInt).dims(2).size(0, num_tokens).size(1, topk).inner_contiguous();
  if (valid_counts.has_value()) {
    TensorArg(kOp, "valid_counts", *valid_counts, "[num_tokens]")
        .dtype(at::kInt).dims(1).size(0, num_tokens).contiguous();
  }

  ConvertIndicesParams p;
  p.req_local_indices = static_cast<const int32_t*>(data_or_null(req_local_indices));
  p.indices_row_stride = req_local_indices.stride(0);
  p.req_id_per_token = static_cast<const int32_t*>(data_or_null(req_id_per_token));
  p.block_table = static_cast<const int32_t*>(data_or_null(block_table));
  p.block_table_row_stride = block_table.stride(0);
  p.num_reqs = to_int32(kOp, "num_reqs (block_table.size(0))", block_table.size(0));
  p.max_blocks_per_req =
      to_int32(kOp, "max_blocks_per_req (block_table.size(1))", block_table.size(1));
  p.num_tokens = num_tokens;
  p.topk = to_int32(kOp, "topk (req_local_indices.size(1))", topk);
  p.page_size = to_int32(kOp, "page_size", page_size);
  p.num_blocks = num_blocks;
  p.out_slots = static_cast<int32_t*>(mutable_data_or_null(out_slots));
  p.out_row_stride = out_slots.stride(0);
  p.valid_counts = static_cast<int32_t*>(mutable_data_or_null(valid_counts));
  p.compact = compact;
  return p;
}

template <Backend B>
void convert_req_indices_to_slots(const at::Tensor& req_local_indices,
                                  const at::Tensor& req_id_per_token,
                                  const at::Tensor& block_table, int64_t page_size,
                                  int64_t num_blocks, const at::Tensor& out_slots,
                                  const std::optional<at::Tensor>& valid_counts, bool compact) {
  check_devices(kConvertOp, device_type(B),
                {{"out_slots", out_slots}, {"req_local_indices", req_local_indices},
                 {"req_id_per_token", req_id_per_token}, {"block_table", block_table},
                 {"valid_counts", valid_counts}});
  const ConvertIndicesParams p =
      convert_params(req_local_indices, req_id_per_token, block_table, page_size, num_blocks,
                     out_slots, valid_counts, compact);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({req_local_indices, req_id_per_token, block_table, out_slots, valid_counts})) {
      ConvertIndicesParams m = p;
      m.req_local_indices = static_cast<const int32_t*>(stand_in(req_local_indices));
      m.req_id_per_token = static_cast<const int32_t*>(stand_in(req_id_per_token));
      m.block_table = static_cast<const int32_t*>(stand_in(block_table));
      m.out_slots = static_cast<int32_t*>(stand_in(out_slots));
      m.valid_counts = static_cast<int32_t*>(stand_in(valid_counts));
      throw_if_error(selkv::check_convert_req_indices_to_slots(m));
    }
  } else if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out_slots);
    throw_if_error(selkv::convert_req_indices_to_slots(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_convert_req_indices_to_slots(p));
    throw_if_error(selkv::ref::convert_req_indices_to_slots(p));
  }
}

// ---- C3: gather_kv_bf16 ----------------------------------------------------------------------
constexpr const char* kGatherOp = "selkv::gather_kv_bf16";

GatherKvParams gather_params(const at::Tensor& cache, const at::Tensor& block_table,
                             const at::Tensor& seq_starts, const at::Tensor& seq_lens,
                             const at::Tensor& ws_starts, std::string_view format,
                             const at::Tensor& out) {
  constexpr const char* kOp = kGatherOp;
  GatherKvParams p;
  p.format = parse_format(kOp, format);
  const CacheTensorView cv = check_cache_tensor(kOp, "cache", cache, p.format);

  TensorArg(kOp, "seq_lens", seq_lens, "[num_reqs]").dtype(at::kInt).dims(1).contiguous();
  const int64_t num_reqs = seq_lens.size(0);
  TensorArg(kOp, "seq_starts", seq_starts, "[num_reqs]")
      .dtype(at::kInt).dims(1).size(0, num_reqs).contiguous();
  TensorArg(kOp, "ws_starts", ws_starts, "[num_reqs]")
      .dtype(at::kInt).dims(1).size(0, num_reqs).contiguous();
  // Rows past num_reqs (e.g. CUDA-graph batch padding) are never read.
  TensorArg(kOp, "block_table", block_table, "[>= num_reqs, max_blocks_per_req]")
      .dtype(at::kInt).dims(2).min_size(0, num_reqs).inner_contiguous();
  const int dim = fmt::dequant_dim(p.format);
  const char* out_doc =
      dim == fmt::kQkDim ? "[rows, 576] for ds_mla_fp8" : "[rows, 512] for nope_fp8 and model1_fp8";
  TensorArg(kOp, "out", out, out_doc).dtype(at::kBFloat16).dims(2).size(1, dim).inner_contiguous();

  p.cache = data_or_null(cache);
  p.num_blocks = cv.num_blocks;
  p.page_size = cv.page_size;
  p.block_stride_bytes = cv.block_stride_bytes;
  p.block_table = static_cast<const int32_t*>(data_or_null(block_table));
  p.block_table_row_stride = block_table.stride(0);
  p.max_blocks_per_req =
      to_int32(kOp, "max_blocks_per_req (block_table.size(1))", block_table.size(1));
  p.seq_starts = static_cast<const int32_t*>(data_or_null(seq_starts));
  p.seq_lens = static_cast<const int32_t*>(data_or_null(seq_lens));
  p.ws_starts = static_cast<const int32_t*>(data_or_null(ws_starts));
  p.num_reqs = to_int32(kOp, "num_reqs (seq_lens.size(0))", num_reqs);
  p.out = mutable_data_or_null(out);
  p.out_row_stride = out.stride(0);
  p.out_rows = out.size(0);
  return p;
}

template <Backend B>
void gather_kv_bf16(const at::Tensor& cache, const at::Tensor& block_table,
                    const at::Tensor& seq_starts, const at::Tensor& seq_lens,
                    const at::Tensor& ws_starts, c10::string_view format, const at::Tensor& out) {
  check_devices(kGatherOp, device_type(B),
                {{"out", out}, {"cache", cache}, {"block_table", block_table},
                 {"seq_starts", seq_starts}, {"seq_lens", seq_lens}, {"ws_starts", ws_starts}});
  const GatherKvParams p =
      gather_params(cache, block_table, seq_starts, seq_lens, ws_starts, format, out);
  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    if (concrete_sizes({cache, block_table, seq_starts, seq_lens, ws_starts, out})) {
      GatherKvParams m = p;
      m.cache = stand_in(cache);
      m.block_table = static_cast<const int32_t*>(stand_in(block_table));
      m.seq_starts = static_cast<const int32_t*>(stand_in(seq_starts));
      m.seq_lens = static_cast<const int32_t*>(stand_in(seq_lens));
      m.ws_starts = static_cast<const int32_t*>(stand_in(ws_starts));
      m.out = stand_in(out);
      throw_if_error(selkv::check_gather_kv_bf16(m));
    }
  } else if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::gather_kv_bf16(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_gather_kv_bf16(p));
    throw_if_error(selkv::ref::gather_kv_bf16(p));
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def(
      "write_kv_cache(Tensor latent, Tensor? rope, Tensor slot_mapping, Tensor(a!) cache, "
      "str format, str scale_mode) -> ()",
      tags);
  m.def(
      "convert_req_indices_to_slots(Tensor req_local_indices, Tensor req_id_per_token, "
      "Tensor block_table, int page_size, int num_blocks, Tensor(a!) out_slots, "
      "Tensor(b!)? valid_counts, bool compact) -> ()",
      tags);
  m.def(
      "gather_kv_bf16(Tensor cache, Tensor block_table, Tensor seq_starts, Tensor seq_lens, "
      "Tensor ws_starts, str format, Tensor(a!) out) -> ()",
      tags);
}

#define SELKV_REGISTER_CACHE_OPS(KEY, BACKEND)                                            \
  TORCH_LIBRARY_IMPL(selkv, KEY, m) {                                                     \
    using namespace ::selkv::torch_ext;                                                   \
    m.impl("write_kv_cache", TORCH_FN(write_kv_cache<BACKEND>));                          \
    m.impl("convert_req_indices_to_slots", TORCH_FN(convert_req_indices_to_slots<BACKEND>)); \
    m.impl("gather_kv_bf16", TORCH_FN(gather_kv_bf16<BACKEND>));                          \
  }

SELKV_REGISTER_CACHE_OPS(CUDA, Backend::kCuda)
SELKV_REGISTER_CACHE_OPS(CPU, Backend::kCpu)
SELKV_REGISTER_CACHE_OPS(Meta, Backend::kMeta)
