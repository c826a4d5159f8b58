// C4 launcher: validate, pick the mode from the shapes (host, no sync), size a grid-stride grid.
#include <cstdint>

#include "cache/dequant_selected.cuh"
#include "common/cuda_check.h"
#include "selkv/dequant.h"

namespace selkv {
namespace {

// SM count of the current device, cached per device (attribute queries are capture-safe).
Status device_sms(int* sms) {
  constexpr const char* kOp = "selkv::dequant_selected_kv";
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), kOp);
  if (dev < kMaxDevices && cached[dev] > 0) {
    *sms = cached[dev];
    return Status::Ok();
  }
  int n = 0;
  SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), kOp);
  if (dev < kMaxDevices) cached[dev] = n;
  *sms = n;
  return Status::Ok();
}

template <bool kRope, bool kSelected>
void launch(const cache::DequantSelectedKernelParams& k, unsigned grid, cudaStream_t stream) {
  cache::dequant_selected_kernel<kRope, kSelected><<<grid, cache::kDequantThreads, 0, stream>>>(k);
}

}  // namespace

Status dequant_selected_kv(const DequantSelectedParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::dequant_selected_kv";
  SELKV_RETURN_IF_ERROR(check_dequant_selected(p));
  const int64_t P = p.cache.num_slots();
  const int64_t N = p.num_tokens * int64_t(p.topk);
  const bool selected = dequant_selected_mode(p.num_tokens, p.topk, P) == DequantMode::kSelected;
  const int64_t rows = dequant_selected_workspace_rows(p.num_tokens, p.topk, P);
  if (N == 0) return Status::Ok();  // nothing to remap; rows = 0 too

  cache::DequantSelectedKernelParams k;
  k.cache = static_cast<const uint8_t*>(p.cache.data);
  k.num_slots = P;
  k.block_stride_bytes = p.cache.block_stride_bytes;
  k.page = cache::FastDivmod(uint32_t(p.cache.page_size));
  k.indices = p.indices;
  k.idx_stride = p.indices_row_stride;
  k.topk_length = p.topk_length;
  k.num_tokens = p.num_tokens;
  k.topk = p.topk;
  k.kdiv = cache::FastDivmod(uint32_t(p.topk));
  k.ws = static_cast<uint8_t*>(p.workspace);
  k.ws_row_bytes = p.workspace_row_stride * 2;
  k.rows = rows;
  k.num_entries = N;
  k.out_idx = p.out_indices;
  k.out_stride = p.out_indices_row_stride;

  int sms = 0;
  SELKV_RETURN_IF_ERROR(device_sms(&sms));
  // Row phase: one step = 32 rows per CTA; full pool also covers N index entries (4 per thread).
  int64_t want = (rows + cache::kDequantRowsPerStep - 1) / cache::kDequantRowsPerStep;
  if (!selected) {
    const int64_t idx_ctas = (N + 4 * cache::kDequantThreads - 1) / (4 * cache::kDequantThreads);
    if (idx_ctas > want) want = idx_ctas;
  }
  const int64_t cap = int64_t(sms) * 8;  // 8 CTAs of 256 threads per SM: one resident wave
  const unsigned grid = unsigned(want < cap ? (want > 0 ? want : 1) : cap);
  const bool rope = fmt::has_rope(p.cache.format);
  if (rope) {
    selected ? launch<true, true>(k, grid, stream) : launch<true, false>(k, grid, stream);
  } else {
    selected ? launch<false, true>(k, grid, stream) : launch<false, false>(k, grid, stream);
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
