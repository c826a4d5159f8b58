// C1 launcher: validate, then one 8-warp CTA per 8 tokens (T = 16384 -> 2048 CTAs, enough to
// fill 132 SMs twice over).
#include "cache/cache_checks.h"
#include "cache/write_kv_cache.cuh"
#include "common/cuda_check.h"
#include "selkv/cache_ops.h"

namespace selkv {

Status write_kv_cache(const WriteKvCacheParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::write_kv_cache";
  cache::Work work;
  SELKV_RETURN_IF_ERROR(cache::check_write_kv_cache(p, &work));
  if (work == cache::Work::kNone) return Status::Ok();

  cache::WriteKvKernelParams k;
  k.latent = static_cast<const uint8_t*>(p.latent);
  k.latent_row_bytes = p.latent_row_stride * 2;
  k.rope = static_cast<const uint8_t*>(p.rope);
  k.rope_row_bytes = p.rope_row_stride * 2;
  k.slot_mapping = p.slot_mapping;
  k.num_tokens = p.num_tokens;
  k.cache = static_cast<uint8_t*>(p.cache);
  k.num_slots = p.num_blocks * p.page_size;
  k.block_stride_bytes = p.block_stride_bytes;
  k.page_size = p.page_size;
  k.page = cache::FastDivmod(uint32_t(p.page_size));

  const dim3 grid(unsigned((p.num_tokens + cache::kWriteWarps - 1) / cache::kWriteWarps));
  const dim3 block(cache::kWriteWarps * 32);
  const bool rope = fmt::has_rope(p.format);
  const bool pow2 = p.scale_mode == ScaleMode::kPow2;
  if (rope && pow2) {
    cache::write_kv_cache_kernel<true, ScaleMode::kPow2><<<grid, block, 0, stream>>>(k);
  } else if (rope) {
    cache::write_kv_cache_kernel<true, ScaleMode::kAmax><<<grid, block, 0, stream>>>(k);
  } else if (pow2) {
    cache::write_kv_cache_kernel<false, ScaleMode::kPow2><<<grid, block, 0, stream>>>(k);
  } else {
    cache::write_kv_cache_kernel<false, ScaleMode::kAmax><<<grid, block, 0, stream>>>(k);
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
