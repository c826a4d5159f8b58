// torch op for C9 (include/selkv/merge.h): selkv::merge_attn_states.
// Out-variant: shards as lists of [T, H, D] / [T, H] tensors (any strides, shared by the shards,
// last dim dense), out [T, H, D], optional lse [T, H]. vLLM's [H, T] lse tensors are passed
// transposed (python/selkv/merge.py). CUDA runs the C++ API on the current stream, CPU the oracle
// on the same Params, Meta the C++ checks on stand-in pointers.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "op_utils.h"
#include "reference/oracle.h"
#include "selkv/merge.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {
namespace {

constexpr const char* kMergeOp = "selkv::merge_attn_states";

// The stride of a dim of size <= 1 carries no information; 0 keeps the C++ rules (alignment,
// aliasing, "same strides in every shard") from tripping on it.
int64_t stride_or_zero(const at::Tensor& t, int64_t d) { return t.size(d) <= 1 ? 0 : t.stride(d); }

MergeDtype merge_dtype(const at::Tensor& out) {
  switch (out.scalar_type()) {
    case at::kBFloat16: return MergeDtype::kBf16;
    case at::kHalf: return MergeDtype::kFp16;
    case at::kFloat: return MergeDtype::kFp32;
    default: break;
  }
  TORCH_CHECK(false, kMergeOp, ": out: expected dtype BFloat16, Half or Float, got ", out.scalar_type());
}

template <Backend B>
void merge_attn_states(at::TensorList outs, at::TensorList lses, const at::Tensor& out,
                       const std::optional<at::Tensor>& lse, bool pos_inf_is_empty) {
  constexpr const char* kOp = kMergeOp;
  const int64_t n = int64_t(outs.size());
  TORCH_CHECK(n >= 1 && n <= kMaxMergeShards, kOp, ": outs: expected 1 to ", kMaxMergeShards,
              " shards, got ", n);
  TORCH_CHECK(int64_t(lses.size()) == n, kOp, ": lses: expected ", n, " tensors (one per shard in outs), got ",
              lses.size());
  check_devices(kOp, device_type(B), {{"out", out}, {"lse", lse}});
  for (int64_t i = 0; i < n; ++i) check_devices(kOp, device_type(B), {{"out", out}, {"outs", outs[i]}, {"lses", lses[i]}});

  MergeAttnStatesParams p;
  p.dtype = merge_dtype(out);
  TensorArg(kOp, "out", out, "[T, H, D]").dims(3).inner_contiguous();
  const int64_t T = out.size(0), H = out.size(1), D = out.size(2);
  for (int64_t i = 0; i < n; ++i) {
    TensorArg(kOp, "outs", outs[i], "[T, H, D] like out")
        .dtype(out.scalar_type()).dims(3).size(0, T).size(1, H).size(2, D).inner_contiguous();
    TensorArg(kOp, "lses", lses[i], "[T, H]").dtype(at::kFloat).dims(2).size(0, T).size(1, H);
    for (int64_t d = 0; d < 2; ++d) {
      TORCH_CHECK(stride_or_zero(outs[i], d) == stride_or_zero(outs[0], d), kOp, ": outs: every shard needs the strides of outs[0] ",
                  outs[0].strides(), ", outs[", i, "] has ", outs[i].strides());
      TORCH_CHECK(stride_or_zero(lses[i], d) == stride_or_zero(lses[0], d), kOp, ": lses: every shard needs the strides of lses[0] ",
                  lses[0].strides(), ", lses[", i, "] has ", lses[i].strides());
    }
    p.outs[i] = data_or_null(outs[i]);
    p.lses[i] = static_cast<const float*>(data_or_null(lses[i]));
  }
  if (lse.has_value()) {
    TensorArg(kOp, "lse", *lse, "[T, H]").dtype(at::kFloat).dims(2).size(0, T).size(1, H);
    p.lse = static_cast<float*>(mutable_data_or_null(*lse));
    p.lse_token_stride = stride_or_zero(*lse, 0);
    p.lse_head_stride = stride_or_zero(*lse, 1);
  }
  p.num_shards = int32_t(n);
  p.num_tokens = T;
  p.num_heads = to_int32(kOp, "num_heads (out.size(1))", H);
  p.head_dim = to_int32(kOp, "head_dim (out.size(2))", D);
  p.outs_token_stride = stride_or_zero(outs[0], 0);
  p.outs_head_stride = stride_or_zero(outs[0], 1);
  p.lses_token_stride = stride_or_zero(lses[0], 0);
  p.lses_head_stride = stride_or_zero(lses[0], 1);
  p.out = mutable_data_or_null(out);
  p.out_token_stride = stride_or_zero(out, 0);
  p.out_head_stride = stride_or_zero(out, 1);
  p.pos_inf_is_empty = pos_inf_is_empty;

  if constexpr (B == Backend::kMeta) {
    MetaStandIns stand_in;  // the C++ checks on stand-in addresses (tensor_checks.h)
    MergeAttnStatesParams m = p;
    for (int64_t i = 0; i < n; ++i) {
      m.outs[i] = stand_in(outs[i]);
      m.lses[i] = static_cast<const float*>(stand_in(lses[i]));
    }
    m.out = stand_in(out);
    m.lse = static_cast<float*>(stand_in(lse));
    throw_if_error(selkv::check_merge_attn_states(m));
    return;
  }
  if constexpr (B == Backend::kCuda) {
    const CudaScope scope(out);
    throw_if_error(selkv::merge_attn_states(p, scope.stream()));
  } else if constexpr (B == Backend::kCpu) {
    throw_if_error(selkv::check_merge_attn_states(p));  // the CUDA run's rules, then the oracle
    throw_if_error(selkv::ref::merge_attn_states(p));
  }
}

}  // namespace
}  // namespace selkv::torch_ext

// ---- registration ------------------------------------------------------------------------------
TORCH_LIBRARY_FRAGMENT(selkv, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def(
      "merge_attn_states(Tensor[] outs, Tensor[] lses, Tensor(a!) out, Tensor(b!)? lse, "
      "bool pos_inf_is_empty) -> ()",
      tags);
}

#define SELKV_REGISTER_MERGE_OPS(KEY, BACKEND)                                    \
  TORCH_LIBRARY_IMPL(selkv, KEY, m) {                                             \
    using namespace ::selkv::torch_ext;                                           \
    m.impl("merge_attn_states", TORCH_FN(merge_attn_states<BACKEND>));            \
  }

SELKV_REGISTER_MERGE_OPS(CUDA, Backend::kCuda)
SELKV_REGISTER_MERGE_OPS(CPU, Backend::kCpu)
SELKV_REGISTER_MERGE_OPS(Meta, Backend::kMeta)
