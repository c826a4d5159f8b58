// Device-side random fills for large benchmark buffers (ceiling measurements).
#include <cuda_bf16.h>

#include "bench_util.h"

extern "C" int selkv_bench_icache_sweep(void* sink, cudaStream_t stream);  // icache_sweep.cu

namespace selkv::bench {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_bytes_kernel(uint64_t* p, size_t words, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = mix64(seed + 0x9e3779b97f4a7c15ull * (i + 1));
  }
}

__global__ void fill_tail_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = uint8_t(mix64(seed ^ (i + 7)));
}

__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ull * (i + 1));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
}

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

int grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return int(blocks < kMaxBlocks ? (blocks ? blocks : 1) : kMaxBlocks);
}

// Reads every 16-byte word once; the sink is written only for an impossible value, so the
// loads cannot be optimized away and the kernel writes nothing in practice.
__global__ void read_sweep_kernel(const uint4* p, size_t n, uint4* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u && threadIdx.x == 1023) sink[0] = make_uint4(acc, 0, 0, 0);
}

}  // namespace

void device_icache_sweep(void* sink, cudaStream_t stream) {
  SELKV_BENCH_CUDA(cudaError_t(selkv_bench_icache_sweep(sink, stream)));
}

void device_read_sweep(const void* ptr, size_t bytes, void* sink, cudaStream_t stream) {
  const size_t n = bytes / 16;
  if (n) read_sweep_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint4*>(ptr), n, static_cast<uint4*>(sink));
  SELKV_BENCH_CUDA(cudaGetLastError());
}

void device_fill_random_bytes(void* ptr, size_t bytes, uint64_t seed, cudaStream_t stream) {
  const size_t words = bytes / 8;
  if (words) fill_bytes_kernel<<<grid_for(words), kThreads, 0, stream>>>(static_cast<uint64_t*>(ptr), words, seed);
  if (bytes % 8)
    fill_tail_kernel<<<1, 32, 0, stream>>>(static_cast<uint8_t*>(ptr) + words * 8, bytes % 8, seed);
  SELKV_BENCH_CUDA(cudaGetLastError());
}

void device_fill_random_bf16(void* ptr, size_t count, uint64_t seed, cudaStream_t stream) {
  if (count) fill_bf16_kernel<<<grid_for(count), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(ptr), count, seed);
  SELKV_BENCH_CUDA(cudaGetLastError());
}

}  // namespace selkv::bench
