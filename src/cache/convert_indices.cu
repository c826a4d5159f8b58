// C2 launcher: validate; rows of up to 2048 entries with int4 access take the persistent
// convert_rows_kernel (one resident wave of CTAs walking rows), the rest one CTA per row.
// topk == 0 only zero-fills valid_counts, as the oracle does.
#include <cstdint>

#include "cache/cache_checks.h"
#include "cache/convert_indices.cuh"
#include "common/cuda_check.h"
#include "common/resident_ctas.h"
#include "selkv/cache_ops.h"

namespace selkv {
namespace {

static_assert(int64_t(cache::kMaxConvertTopk) + cache::kConvChunk + cache::kConvThreads <= INT32_MAX,
              "the kernels' int32 row offsets reach topk + one chunk");

// Fast path: persistent CTAs, one resident wave at most (the kernel walks rows grid-stride).
template <bool kCount, bool kCompact>
Status launch_rows(const cache::ConvertKernelParams& k, int64_t rows, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::convert_req_indices_to_slots";
  int64_t wave = 0;
  SELKV_RETURN_IF_ERROR((detail::resident_ctas<cache::convert_rows_kernel<kCount, kCompact>>(
      cache::kConvThreads, 0, kOp, &wave)));
  const dim3 grid(static_cast<unsigned>(rows < wave ? rows : wave));
  cache::convert_rows_kernel<kCount, kCompact><<<grid, cache::kConvThreads, 0, stream>>>(k, rows);
  return detail::launch_status(kOp);
}

}  // namespace

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
  k.page = FastDivmod(uint32_t(p.page_size));
  k.out = p.out_slots;
  k.out_stride = p.out_row_stride;
  k.valid_counts = p.valid_counts;
  k.compact = p.compact;
  k.token_seq_lens = p.token_seq_lens;

  const auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const bool vec = a16(p.req_local_indices) && a16(p.out_slots) && p.indices_row_stride % 4 == 0 &&
                   p.out_row_stride % 4 == 0 && p.topk % 4 == 0;
  if (vec && p.topk <= cache::kConvChunk) {
    const bool count = p.valid_counts != nullptr;
    if (p.compact) {
      return count ? launch_rows<true, true>(k, p.num_tokens, stream)
                   : launch_rows<false, true>(k, p.num_tokens, stream);
    }
    return count ? launch_rows<true, false>(k, p.num_tokens, stream)
                 : launch_rows<false, false>(k, p.num_tokens, stream);
  }
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  if (vec) {
    cache::convert_indices_kernel<true><<<grid, cache::kConvThreads, 0, stream>>>(k);
  } else {
    cache::convert_indices_kernel<false><<<grid, cache::kConvThreads, 0, stream>>>(k);
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
