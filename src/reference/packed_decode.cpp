// CPU oracle of C6's decode: the packed buffer's validity bits become indices into its own
// records, then the C5 oracle (sparse_decode) runs unchanged; a buffer whose shape words are not
// the call's gives NaN rows (and no attention is computed).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/sm_scale.h"
#include "packed/packed_layout.h"
#include "reference/oracle.h"

namespace selkv::ref {

Status check_sparse_decode_packed_args(const SparseDecodePackedRefArgs& a) {
  constexpr const char* kOp = "selkv::ref::sparse_decode_packed";
  SELKV_CHECK_ARG(a.B >= 0 && a.S_q >= 0 && a.H >= 0, "B/S_q/H", "must be >= 0");
  SELKV_CHECK_ARG(a.K > 0 && a.K % 64 == 0, "K", "must be a positive multiple of 64, got ", a.K);
  SELKV_RETURN_IF_ERROR(::selkv::detail::check_sm_scale(kOp, a.sm_scale));
  if (int64_t(a.B) * a.S_q * a.H == 0) return Status::Ok();
  const size_t need = packed_kv_workspace_size(a.B, a.S_q, a.K);
  SELKV_CHECK_ARG(need > 0, "K", "B * S_q * K must be < 2^31 entries");
  SELKV_CHECK_ARG(a.packed_kv != nullptr, "packed_kv", "must not be null");
  SELKV_CHECK_ARG(a.packed_kv_bytes >= need, "packed_kv", "needs ", need, " bytes, got ", a.packed_kv_bytes);
  SELKV_CHECK_ARG(a.q != nullptr, "q", "must not be null");
  SELKV_CHECK_ARG(a.out != nullptr, "out", "must not be null");
  return Status::Ok();
}

void sparse_decode_packed(const SparseDecodePackedRefArgs& a) {
  if (!check_sparse_decode_packed_args(a).ok()) return;
  const int64_t rows = int64_t(a.B) * a.S_q;
  if (rows * a.H == 0) return;
  const int64_t entries = rows * a.K;
  // A buffer whose shape words are not this call's (packed for another shape, never packed, or
  // poisoned by a patch at another shape): every row NaN, as the kernels give it.
  packed::PackedShape have;
  std::memcpy(&have, a.packed_kv + packed::packed_shape_offset(rows, a.K), sizeof have);
  if (!packed::packed_shape_matches(have.lo, have.hi, a.B, a.S_q, a.K)) {
    for (int64_t i = 0; i < rows * a.H * fmt::kVDim; ++i) a.out[i] = NAN;
    if (a.lse != nullptr)
      for (int64_t i = 0; i < rows * a.H; ++i) a.lse[i] = NAN;
    return;
  }
  const uint8_t* words = a.packed_kv + packed::packed_validity_offset(rows, a.K);
  std::vector<int32_t> indices(size_t(entries), -1);
  for (int64_t e = 0; e < entries; ++e) {
    uint32_t w;
    std::memcpy(&w, words + 4 * (e / 32), 4);  // little endian, as the device writes it
    if ((w >> (e % 32)) & 1u) indices[size_t(e)] = int32_t(e);
  }
  SparseDecodeRefArgs d;
  d.q = a.q;
  d.B = a.B;
  d.S_q = a.S_q;
  d.H = a.H;
  d.cache.data = a.packed_kv;
  d.cache.num_blocks = entries / 64;
  d.cache.page_size = 64;
  d.cache.block_stride_bytes = int64_t(64) * fmt::kDsMlaRecordBytes;
  d.cache.format = KvFormat::kDsMlaFp8;
  d.indices = indices.data();
  d.K = a.K;
  d.topk_length = a.topk_length;
  d.sm_scale = a.sm_scale;
  d.attn_sink = a.attn_sink;
  d.out = a.out;
  d.lse = a.lse;
  d.empty_lse_pos_inf = a.empty_lse_pos_inf;
  d.threads = a.threads;
  sparse_decode(d);
}

}  // namespace selkv::ref
