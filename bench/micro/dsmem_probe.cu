// Micro-probe (H200): how fast is a shared -> peer-shared bulk copy inside a 2-CTA cluster, next to
// writing the same bytes to global memory from every SM at once? Evidence for two designs (not part
// of the library):
//   - the prefill's H = 128 cluster (each CTA forwards 16-20 KB per slot half in 4 KB chunks,
//     branch wip/prefill-cluster);
//   - a decode split-K reduction through DSMEM instead of fp32 partials (128 KB of O per CTA,
//     written to L2 in ~3.5 us when all CTAs end together; docs/gpu-runs.md).
// Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dsmem_probe.cu -o dsmem_probe
// Run:   ./dsmem_probe            (prints one line per mode and size: median / max over CTAs)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_ptx.cuh"


constexpr int kThreads = 128;
constexpr int kRegion = 96 * 1024;  // source and destination regions of the dynamic smem
constexpr int kReps = 8;

__device__ __forceinline__ void bulk_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "r"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// mode 0: both CTAs of a cluster copy `bytes` to each other in `chunk`-byte bulk copies and wait for
// the peer's bytes (a cluster barrier between repetitions keeps the phases apart); mode 1: the
// cluster barrier alone (baseline); mode 2: every CTA writes `bytes` to global with 16-byte stores
// and a fence (the decode's fp32 partial epilogue, all SMs at once).
__global__ void probe_kernel(int mode, uint32_t bytes, uint32_t chunk, uint4* gout, uint64_t* ns_out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  const uint32_t rank = cluster_rank(), peer = rank ^ 1u;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  uint4* fill = reinterpret_cast<uint4*>(smem);
  for (uint32_t i = threadIdx.x; i < 2 * kRegion / 16; i += blockDim.x) fill[i] = make_uint4(i, rank, 0, 0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  cluster_sync();
  const uint32_t src = smem_u32(smem), dst = mapa(smem_u32(smem + kRegion), peer), pbar = mapa(smem_u32(&bar), peer);
  uint64_t total = 0;
  for (int r = 0; r < kReps; ++r) {
    cluster_sync();
    const uint64_t t0 = gtime();
    if (mode == 0) {
      if (threadIdx.x == 0) {
        mbar_expect(&bar, bytes);
        for (uint32_t off = 0; off < bytes; off += chunk) bulk_to_peer(dst + off, src + off, chunk, pbar);
        mbar_wait(&bar, uint32_t(r) & 1u);
      }
      __syncthreads();
    } else if (mode == 2) {
      uint4* g = gout + size_t(blockIdx.x) * (bytes / 16);
      for (uint32_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) g[i] = make_uint4(i, r, 0, 0);
      __threadfence();
      __syncthreads();
    }
    total += gtime() - t0;
  }
  if (threadIdx.x == 0) ns_out[blockIdx.x] = total / kReps;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem = 2 * kRegion;
  CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  cfg.gridDim = dim3(unsigned(sms), 1, 1);
  CK(cudaOccupancyMaxActiveClusters(&clusters, probe_kernel, &cfg));
  const int grid = 2 * clusters;
  cfg.gridDim = dim3(unsigned(grid), 1, 1);
  std::printf("SMs %d, resident 2-CTA clusters %d (grid %d)\n", sms, clusters, grid);
  uint4* gout = nullptr;
  uint64_t* ns = nullptr;
  CK(cudaMalloc(&gout, size_t(grid) * kRegion));
  CK(cudaMalloc(&ns, size_t(grid) * sizeof(uint64_t)));
  std::vector<uint64_t> h(grid);
  struct Case { int mode; uint32_t bytes, chunk; const char* what; };
  const Case cases[] = {
      {1, 0, 0, "cluster barrier only (baseline)"},
      {0, 4096, 4096, "DSMEM bulk, both ways"},       {0, 16384, 4096, "DSMEM bulk, both ways"},
      {0, 20480, 4096, "DSMEM bulk, both ways"},      {0, 16384, 16384, "DSMEM bulk, both ways"},
      {0, 65536, 4096, "DSMEM bulk, both ways"},      {0, 65536, 65536, "DSMEM bulk, both ways"},
      {0, 98304, 98304, "DSMEM bulk, both ways"},     {2, 16384, 0, "global 16-byte stores, all SMs"},
      {2, 65536, 0, "global 16-byte stores, all SMs"}, {2, 98304, 0, "global 16-byte stores, all SMs"},
  };
  for (const Case& c : cases) {
    for (int warm = 0; warm < 2; ++warm) {
      CK(cudaLaunchKernelEx(&cfg, probe_kernel, c.mode, c.bytes, c.chunk, gout, ns));
      CK(cudaDeviceSynchronize());
    }
    CK(cudaMemcpy(h.data(), ns, size_t(grid) * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    std::sort(h.begin(), h.end());
    const double med = double(h[h.size() / 2]), mx = double(h.back());
    std::printf("%-34s bytes %6u chunk %6u: median %8.0f ns  max %8.0f ns  (%.1f GB/s per CTA at the median)\n", c.what,
                c.bytes, c.chunk, med, mx, c.bytes ? c.bytes / med : 0.0);
  }
  return 0;
}
