// Oracle of C9 on the GPU op's Params (host pointers): strided, typed views around lse_merge.
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/codec.h"
#include "merge/merge_checks.h"
#include "reference/oracle.h"

namespace selkv::ref {
namespace {

float load_elem(const void* base, int64_t idx, MergeDtype d) {
  if (d == MergeDtype::kFp32) return static_cast<const float*>(base)[idx];
  const uint16_t h = static_cast<const uint16_t*>(base)[idx];
  return d == MergeDtype::kBf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h);
}

void store_elem(void* base, int64_t idx, MergeDtype d, float v) {
  if (d == MergeDtype::kFp32) {
    static_cast<float*>(base)[idx] = v;
    return;
  }
  static_cast<uint16_t*>(base)[idx] = d == MergeDtype::kBf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
}

}  // namespace

Status merge_attn_states(const MergeAttnStatesParams& p) {
  bool no_op = false;
  SELKV_RETURN_IF_ERROR(merge::check_merge_params("selkv::merge_attn_states", p, /*device=*/false, &no_op));
  if (no_op) return Status::Ok();
  const int n = p.num_shards;
  const int64_t T = p.num_tokens, H = p.num_heads, D = p.head_dim, rows = T * H;
  std::vector<float> outs(size_t(n) * rows * D), lses(size_t(n) * rows);
  for (int i = 0; i < n; ++i)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t r = t * H + h;
        lses[size_t(i) * rows + r] = p.lses[i][t * p.lses_token_stride + h * p.lses_head_stride];
        const int64_t off = t * p.outs_token_stride + h * p.outs_head_stride;
        for (int64_t c = 0; c < D; ++c) outs[(size_t(i) * rows + r) * D + c] = load_elem(p.outs[i], off + c, p.dtype);
      }
  std::vector<float> out(size_t(rows) * D), lse(rows);
  lse_merge(outs.data(), lses.data(), n, rows, int(D), out.data(), lse.data(), p.pos_inf_is_empty);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t r = t * H + h;
      const int64_t off = t * p.out_token_stride + h * p.out_head_stride;
      for (int64_t c = 0; c < D; ++c) store_elem(p.out, off + c, p.dtype, out[size_t(r) * D + c]);
      if (p.lse != nullptr) p.lse[t * p.lse_token_stride + h * p.lse_head_stride] = lse[r];
    }
  return Status::Ok();
}

}  // namespace selkv::ref
