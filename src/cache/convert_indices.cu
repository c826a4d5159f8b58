// C2 launcher: validate, then one CTA per row (T = 4096 rows -> 4096 CTAs). topk == 0 only
// zero-fills valid_counts, as the oracle does.
#include <cstdint>

#include "cache/cache_checks.h"
#include "cache/convert_indices.cuh"
#include "common/cuda_check.h"
#include "selkv/cache_ops.h"

namespace selkv {

Status convert_req_indices_to_slots(const ConvertIndicesParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::convert_req_indices_to_slots";
  cache::Work work;
  SELKV_RETURN_IF_ERROR(cache::check_convert_indices(p, &work));
  if (work == cache::Work::kNone) {
    if (p.num_tokens > 0 && p.valid_counts != nullptr) {
      SELKV_CUDA_RETURN(cudaMemsetAsync(p.valid_counts, 0, size_t(p.num_tokens) * sizeof(int32_t),
                                        stream),
                        kOp);
    }
    return Status::Ok();
  }

  cache::ConvertKernelParams k;
  k.in = p.req_local_indices;
  k.in_stride = p.indices_row_stride;
  k.req_id = p.req_id_per_token;
  k.block_table = p.block_table;
  k.bt_stride = p.block_table_row_stride;
  k.num_reqs = p.block_table != nullptr ? p.num_reqs : 0;  // no table: every entry is -1
  k.max_blocks = p.max_blocks_per_req;
  k.topk = p.topk;
  k.page_size = p.page_size;
  k.num_blocks = p.num_blocks;
  k.page = cache::FastDivmod(uint32_t(p.page_size));
  k.out = p.out_slots;
  k.out_stride = p.out_row_stride;
  k.valid_counts = p.valid_counts;
  k.compact = p.compact;

  const auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const bool vec = a16(p.req_local_indices) && a16(p.out_slots) && p.indices_row_stride % 4 == 0 &&
                   p.out_row_stride % 4 == 0 && p.topk % 4 == 0;
  const dim3 grid(unsigned(p.num_tokens));
  if (vec) {
    cache::convert_indices_kernel<true><<<grid, cache::kConvThreads, 0, stream>>>(k);
  } else {
    cache::convert_indices_kernel<false><<<grid, cache::kConvThreads, 0, stream>>>(k);
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
