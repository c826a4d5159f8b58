// Micro-probe (H200): does the producer's end-of-round proxy fence wait for the thread's in-flight
// global loads? And what does a 16-byte st.async into the CTA's own shared memory cost next to
// st.shared? Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a fence_probe.cu
// Evidence for docs/perf-log.md (decode v4); not part of the library.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t clk() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint4 ld_generic(const void* p) {
  uint4 v;
  asm volatile("ld.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// mode 0: no load in flight at the fence; 1: one 16-byte DRAM load in flight; 2: 8 loads in flight;
// 3: same as 1 with the light fence (generic->async release, shared::cta).
__global__ void fence_kernel(const uint8_t* cold, uint64_t* out, int mode) {
  __shared__ uint4 s[1024];
  const int tid = threadIdx.x;
  const uint8_t* base = cold + (size_t(blockIdx.x) * blockDim.x + tid) * 4096;
  uint4 acc = make_uint4(0, 0, 0, 0);
  uint64_t total = 0;
  for (int it = 0; it < 16; ++it) {
    const uint8_t* p = base + size_t(it) * 132 * 128 * 4096;
    uint4 v[8];
    if (mode == 1 || mode == 3) v[0] = ld_generic(p);
    if (mode == 2) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = ld_generic(p + 512 * i);
    }
    s[tid] = make_uint4(it, tid, 0, 0);
    const uint64_t t0 = clk();
    if (mode == 3)
      asm volatile("fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;" ::: "memory");
    else
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const uint64_t t1 = clk();
    total += t1 - t0;
    if (mode == 1 || mode == 3) acc.x ^= v[0].x;
    if (mode == 2) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc.x ^= v[i].x;
    }
    __syncwarp();
  }
  s[tid + 128] = acc;
  out[blockIdx.x * blockDim.x + tid] = total / 16 + (s[(tid + 1) % 128 + 128].x == 0xdeadbeef);
}

// Store throughput: 128 threads write 64 KB into the CTA's own smem with st.shared (+ fence) or
// with st.async to the own CTA's shared::cluster address (completion on an mbarrier, no fence).
__global__ void store_kernel(uint64_t* out, int mode) {
  extern __shared__ __align__(1024) uint8_t sm[];
  __shared__ __align__(8) uint64_t bar;
  const int tid = threadIdx.x;
  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  uint32_t self;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(self) : "r"(smem_u32(sm)));
  uint32_t selfbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(selfbar) : "r"(smem_u32(&bar)));
  const int kBytes = 65536;
  uint64_t best = ~0ull;
  for (int rep = 0; rep < 8; ++rep) {
    if (tid == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar)), "r"(mode == 1 ? kBytes : 0));
    __syncthreads();
    const uint64_t t0 = clk();
    for (int off = tid * 16; off < kBytes; off += 128 * 16) {
      const uint4 v = make_uint4(off, rep, 1, 2);
      if (mode == 1) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1,%2,%3,%4}, [%5];" ::"r"(self + off),
                     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(selfbar) : "memory");
      } else {
        *reinterpret_cast<uint4*>(sm + off) = v;
      }
    }
    if (mode == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (tid == 0) {
      uint32_t done = 0;
      while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_u32(&bar)), "r"(uint32_t(rep & 1)) : "memory");
      }
    }
    __syncthreads();
    const uint64_t t1 = clk();
    best = (t1 - t0) < best ? (t1 - t0) : best;
  }
  if (tid == 0) out[blockIdx.x] = best;
}

int main() {
  const size_t bytes = size_t(132) * 128 * 4096 * 17;
  uint8_t* cold;
  uint64_t* out;
  cudaMalloc(&cold, bytes);
  cudaMemset(cold, 1, bytes);
  cudaMalloc(&out, 132 * 128 * sizeof(uint64_t));
  const char* names[4] = {"no load in flight", "1 DRAM load in flight", "8 DRAM loads in flight", "1 load, light fence"};
  for (int mode = 0; mode < 4; ++mode) {
    void* flush;
    cudaMalloc(&flush, 512 << 20);
    cudaMemset(flush, mode, 512 << 20);
    cudaFree(flush);
    fence_kernel<<<132, 128>>>(cold, out, mode);
    cudaDeviceSynchronize();
    std::vector<uint64_t> h(132 * 128);
    cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost);
    std::sort(h.begin(), h.end());
    printf("fence_probe: fence.proxy.async cycles, %-24s median %llu p90 %llu\n", names[mode],
           (unsigned long long)h[h.size() / 2], (unsigned long long)h[h.size() * 9 / 10]);
  }
  cudaFuncSetAttribute(store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  for (int mode = 0; mode < 2; ++mode) {
    store_kernel<<<132, 128, 65536>>>(out, mode);
    cudaError_t e = cudaDeviceSynchronize();
    std::vector<uint64_t> h(132);
    cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost);
    std::sort(h.begin(), h.end());
    printf("fence_probe: 64 KB smem fill by 128 threads, %-32s median %llu cycles (%s)\n",
           mode ? "st.async to own CTA + mbarrier" : "st.shared + fence.proxy.async", (unsigned long long)h[66],
           cudaGetErrorString(e));
  }
  return 0;
}
