// C3 launcher: validate, size the grid and the per-warp chunk from out_rows (capped at one
// resident wave; the kernel is grid-stride), dynamic shared memory = the per-request prefix
// (+ starts and workspace offsets for up to kGatherSmemReqs requests).
#include <cstdint>

#include "cache/cache_checks.h"
#include "cache/gather_kv.cuh"
#include "common/cuda_check.h"
#include "common/resident_ctas.h"
#include "selkv/cache_ops.h"

namespace selkv {
namespace {

constexpr const char* kOp = "selkv::gather_kv_bf16";

template <class Fmt>
Status launch_gather(cache::GatherKernelParams k, const GatherKvParams& p, cudaStream_t stream) {
  // Resident CTAs on the current device at the worst-case smem size.
  int64_t wave = 0;
  SELKV_RETURN_IF_ERROR(detail::resident_ctas<cache::gather_kv_kernel<Fmt>>(
      cache::kGatherThreads, cache::gather_smem_bytes(cache::kMaxGatherReqs), kOp, &wave));
  // Enough warps for kGatherBatch tokens each, capped at one resident wave; past that, each warp
  // takes chunks of up to kGatherMaxChunk tokens (one per lane) per round.
  constexpr int64_t kCtaTokens = int64_t(cache::kGatherWarps) * cache::kGatherBatch;
  const int64_t want = (p.out_rows + kCtaTokens - 1) / kCtaTokens;
  const int64_t ctas = want < wave ? want : wave;
  const int64_t warps = ctas * cache::kGatherWarps;
  int64_t chunk = (p.out_rows + warps - 1) / warps;
  chunk = (chunk + cache::kGatherBatch - 1) / cache::kGatherBatch * cache::kGatherBatch;
  k.chunk = int32_t(chunk < cache::kGatherMaxChunk ? chunk : cache::kGatherMaxChunk);
  const dim3 grid(static_cast<unsigned>(ctas));
  const size_t smem = cache::gather_smem_bytes(p.num_reqs);
  cache::gather_kv_kernel<Fmt><<<grid, cache::kGatherThreads, smem, stream>>>(k);
  return detail::launch_status(kOp);
}

}  // namespace

Status gather_kv_bf16(const GatherKvParams& p, cudaStream_t stream) {
  cache::Work work;
  SELKV_RETURN_IF_ERROR(cache::check_gather_kv(p, &work));
  if (work == cache::Work::kNone) return Status::Ok();

  cache::GatherKernelParams k;
  k.cache = static_cast<const uint8_t*>(p.cache);
  k.num_blocks = p.num_blocks;
  k.page_size = p.page_size;
  k.block_stride_bytes = p.block_stride_bytes;
  k.page = FastDivmod(uint32_t(p.page_size));
  k.block_table = p.block_table;
  k.bt_stride = p.block_table_row_stride;
  k.max_blocks = p.block_table != nullptr ? p.max_blocks_per_req : 0;
  k.seq_starts = p.seq_starts;
  k.seq_lens = p.seq_lens;
  k.ws_starts = p.ws_starts;
  k.num_reqs = p.num_reqs;
  k.out = static_cast<uint8_t*>(p.out);
  k.out_row_bytes = p.out_row_stride * 2;
  k.out_rows = p.out_rows;

  return dispatch_format(p.format, [&](auto f) { return launch_gather<decltype(f)>(k, p, stream); });
}

}  // namespace selkv
