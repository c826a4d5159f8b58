// Device fills for the decode benchmark (see decode_fill.h).
#include <cuda_bf16.h>

#include <algorithm>

#include "bench_util.h"
#include "decode_fill.h"
#include "selkv/cache_ops.h"
#include "selkv/format_traits.h"

namespace selkv::bench {
namespace {

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One Box-Muller pair per two elements.
__global__ void normal_bf16_kernel(__nv_bfloat16* p, size_t n, float stddev, float clamp,
                                   uint64_t seed) {
  const size_t pairs = (n + 1) / 2;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < pairs;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix(seed ^ (0xd1b54a32d192ed03ull * (i + 1)));
    const float u1 = (float(uint32_t(r >> 40)) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
    const float u2 = float(uint32_t(r & 0xffffffu)) * (1.0f / 16777216.0f);    // [0, 1)
    const float rad = sqrtf(-2.0f * logf(u1)) * stddev;
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    float a = rad * c, b = rad * s;
    if (clamp > 0.f) {
      a = fminf(fmaxf(a, -clamp), clamp);
      b = fminf(fmaxf(b, -clamp), clamp);
    }
    p[2 * i] = __float2bfloat16(a);
    if (2 * i + 1 < n) p[2 * i + 1] = __float2bfloat16(b);
  }
}

__global__ void iota_i64_kernel(int64_t* p, size_t n, int64_t first) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = first + int64_t(i);
}

constexpr int kThreads = 256;

int grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return int(blocks == 0 ? 1 : blocks < 8192 ? blocks : 8192);
}

}  // namespace

void device_fill_normal_bf16(void* ptr, size_t count, float stddev, float clamp, uint64_t seed,
                             cudaStream_t stream) {
  if (count == 0) return;
  normal_bf16_kernel<<<grid_for((count + 1) / 2), kThreads, 0, stream>>>(
      static_cast<__nv_bfloat16*>(ptr), count, stddev, clamp, seed);
  SELKV_BENCH_CUDA(cudaGetLastError());
}

void device_fill_iota_i64(int64_t* ptr, size_t count, int64_t first, cudaStream_t stream) {
  if (count == 0) return;
  iota_i64_kernel<<<grid_for(count), kThreads, 0, stream>>>(ptr, count, first);
  SELKV_BENCH_CUDA(cudaGetLastError());
}

void device_write_random_cache(void* cache, int64_t num_blocks, int32_t page, int64_t block_stride,
                               KvFormat format, uint64_t seed, cudaStream_t st) {
  const int nope = format == KvFormat::kModel1Fp8 ? KvFormatTraits<KvFormat::kModel1Fp8>::kNopeDim : fmt::kNopeDim;
  const int rope = fmt::kRopeDim;
  const int64_t num_slots = num_blocks * page;
  const int64_t chunk = std::min<int64_t>(num_slots, int64_t(1) << 18);
  DeviceBuffer latent(size_t(chunk) * nope * 2), rope_buf(size_t(chunk) * rope * 2), slots(size_t(chunk) * 8);
  for (int64_t first = 0; first < num_slots; first += chunk) {
    const int64_t nt = std::min(chunk, num_slots - first);
    device_fill_normal_bf16(latent.get(), size_t(nt) * nope, 0.1f, 1.f, seed * 31 + uint64_t(first), st);
    device_fill_normal_bf16(rope_buf.get(), size_t(nt) * rope, 0.1f, 1.f, seed * 37 + uint64_t(first) + 1, st);
    device_fill_iota_i64(slots.as<int64_t>(), size_t(nt), first, st);
    WriteKvCacheParams w;
    w.latent = latent.get();
    w.latent_row_stride = nope;
    w.rope = rope_buf.get();
    w.rope_row_stride = rope;
    w.slot_mapping = slots.as<int64_t>();
    w.num_tokens = nt;
    w.cache = cache;
    w.num_blocks = num_blocks;
    w.page_size = page;
    w.block_stride_bytes = block_stride;
    w.format = format;
    w.scale_mode = ScaleMode::kPow2;
    throw_if_error(write_kv_cache(w, st));
  }
  SELKV_BENCH_CUDA(cudaStreamSynchronize(st));  // before the chunk buffers go away
}

}  // namespace selkv::bench
