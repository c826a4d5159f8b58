// CPU oracle of strided C7 and of the composed prefill paths (src/prefill/composed_ref.h).
#include "prefill/composed_ref.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "formats/codec.h"
#include "reference/oracle.h"
#include "selkv/formats.h"

namespace selkv::ref {

Status sparse_mla_prefill_strided(const SparsePrefillParams& p) {
  SELKV_RETURN_IF_ERROR(check_sparse_mla_prefill(p));
  if (p.num_tokens == 0) return Status::Ok();
  const int64_t T = p.num_tokens;
  const int H = p.num_heads, D = p.d_qk, K = p.topk, V = fmt::kVDim;
  const auto* qs = static_cast<const uint16_t*>(p.q);
  std::vector<uint16_t> q(size_t(T) * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      std::memcpy(&q[(size_t(t) * H + h) * D], qs + t * p.q_token_stride + h * p.q_head_stride, size_t(D) * 2);
  std::vector<int32_t> idx(size_t(T) * K);
  for (int64_t t = 0; t < T && K > 0; ++t)
    std::memcpy(&idx[size_t(t) * K], p.indices + t * p.indices_token_stride, size_t(K) * 4);
  // kv: used in place when dense, else packed (only when something can be valid).
  const int64_t N = (p.kv != nullptr && K > 0) ? p.num_kv : 0;
  const auto* kvs = static_cast<const uint16_t*>(p.kv);
  std::vector<uint16_t> kv_dense;
  const uint16_t* kv = kvs;
  if (N > 0 && p.kv_row_stride != D) {
    kv_dense.resize(size_t(N) * D);
    for (int64_t n = 0; n < N; ++n) std::memcpy(&kv_dense[size_t(n) * D], kvs + n * p.kv_row_stride, size_t(D) * 2);
    kv = kv_dense.data();
  }
  std::vector<float> out(size_t(T) * H * V), ml(size_t(T) * H), lse(size_t(T) * H);
  SparsePrefillRefArgs a;
  a.q = q.data();
  a.T = int(T);
  a.H = H;
  a.d_qk = D;
  a.kv = N > 0 ? kv : nullptr;
  a.num_kv = N;
  a.indices = idx.data();
  a.K = K;
  a.topk_length = p.topk_length;
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.attn_sink;
  a.out = out.data();
  a.max_logits = ml.data();
  a.lse = lse.data();
  SELKV_RETURN_IF_ERROR(check_sparse_prefill_args(a));
  sparse_prefill(a);
  auto* os = static_cast<uint16_t*>(p.out);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const size_t r = size_t(t) * H + h;
      uint16_t* dst = os + t * p.out_token_stride + h * p.out_head_stride;
      for (int d = 0; d < V; ++d) dst[d] = codec::float_to_bf16(out[r * V + d]);
      if (p.max_logits) p.max_logits[t * p.max_logits_token_stride + h] = ml[r];
      if (p.lse) p.lse[t * p.lse_token_stride + h] = lse[r];
    }
  return Status::Ok();
}

Status dequant_sparse_mla_prefill(const DequantPrefillParams& p) {
  SELKV_RETURN_IF_ERROR(check_dequant_sparse_mla_prefill(p));
  const SparsePrefillParams& a = p.attn;
  if (a.num_tokens == 0) return Status::Ok();
  const KvFormat f = p.cache.format;
  const int D = fmt::dequant_dim(f);
  const int64_t P = p.cache.num_slots();
  const int64_t N = a.num_tokens * int64_t(a.topk);
  const int64_t rows = dequant_selected_workspace_rows(a.num_tokens, a.topk, P);
  const int64_t rows_bytes = (rows * D * 2 + 255) / 256 * 256;  // the layout of composed.h
  auto* ws = static_cast<uint8_t*>(p.workspace);
  int32_t* remapped = N > 0 ? reinterpret_cast<int32_t*>(ws + rows_bytes) : nullptr;
  DequantSelectedParams c4;
  c4.cache = p.cache;
  c4.indices = a.indices;
  c4.indices_row_stride = a.indices_token_stride;
  c4.topk_length = a.topk_length;
  c4.num_tokens = a.num_tokens;
  c4.topk = a.topk;
  c4.workspace = rows > 0 ? ws : nullptr;
  c4.workspace_rows = rows;
  c4.workspace_row_stride = D;
  c4.out_indices = remapped;
  c4.out_indices_row_stride = a.topk;
  SELKV_RETURN_IF_ERROR(dequant_selected(c4));
  SparsePrefillParams c7 = a;
  c7.kv = rows > 0 ? ws : nullptr;
  c7.kv_row_stride = D;
  c7.num_kv = rows;
  c7.indices = remapped;
  c7.indices_token_stride = a.topk;
  return sparse_mla_prefill_strided(c7);
}

Status gather_sparse_mla_prefill(const GatherPrefillParams& p) {
  SELKV_RETURN_IF_ERROR(check_gather_sparse_mla_prefill(p));
  if (p.attn.num_tokens == 0) return Status::Ok();
  const int D = fmt::dequant_dim(p.gather.format);
  void* ws = p.num_kv_rows > 0 ? p.workspace : nullptr;
  GatherKvParams c3 = p.gather;
  c3.out = ws;
  c3.out_row_stride = D;
  c3.out_rows = p.num_kv_rows;
  SELKV_RETURN_IF_ERROR(gather_kv_bf16(c3));
  SparsePrefillParams c7 = p.attn;
  c7.kv = ws;
  c7.kv_row_stride = D;
  c7.num_kv = p.num_kv_rows;
  return sparse_mla_prefill_strided(c7);
}

}  // namespace selkv::ref
