// C1 launcher: validate, then a grid of persistent 8-warp CTAs: enough warps for
// kWriteTokensPerWarp tokens each, capped at one resident wave (the kernel is grid-stride).
#include "cache/cache_checks.h"
#include "cache/write_kv_cache.cuh"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/resident_ctas.h"
#include "selkv/cache_ops.h"

namespace selkv {
namespace {

template <class Fmt, ScaleMode kMode>
Status launch_write(const cache::WriteKvKernelParams& k, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::write_kv_cache";
  if constexpr (!Fmt::kScalesInRecord && kMode != ScaleMode::kPow2) {
    // UE8M0 scales hold powers of two only; check_write_kv_cache rejects this before here.
    return Status(StatusCode::kInvalidArgument, "selkv::write_kv_cache: scale_mode: model1_fp8 takes pow2 only");
  } else {
  int64_t wave = 0;
  SELKV_RETURN_IF_ERROR((detail::resident_ctas<cache::write_kv_cache_kernel<Fmt, kMode>>(
      cache::kWriteWarps * 32, 0, kOp, &wave)));
  constexpr int64_t kTokensPerCta = int64_t(cache::kWriteWarps) * cache::kWriteTokensPerWarp;
  const int64_t want = (k.num_tokens + kTokensPerCta - 1) / kTokensPerCta;
  const dim3 grid(unsigned(want < wave ? want : wave));
  cache::write_kv_cache_kernel<Fmt, kMode><<<grid, cache::kWriteWarps * 32, 0, stream>>>(k);
  return detail::launch_status(kOp);
  }
}

}  // namespace

Status write_kv_cache(const WriteKvCacheParams& p, cudaStream_t stream) {
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
  k.page = FastDivmod(uint32_t(p.page_size));

  return dispatch_format(p.format, [&](auto f) {
    return detail::dispatch_bool(p.scale_mode == ScaleMode::kPow2, [&](auto pow2) {
      constexpr ScaleMode kMode = decltype(pow2)::value ? ScaleMode::kPow2 : ScaleMode::kAmax;
      return launch_write<decltype(f), kMode>(k, stream);
    });
  });
}

}  // namespace selkv
