// Micro-probe (H200): can the prefill gather its kv rows with 1-row TMA boxes (and multicast them to
// both CTAs of an H = 128 cluster) instead of cp.async? Two questions (docs/prefill-design.md §4):
//   1. correctness: a box of 64 columns x 1 row with SWIZZLE_128B landing at a 128-byte (not
//      1024-byte) aligned row of a 64 x 64 tile: is the 16-byte chunk c of row r at chunk c ^ (r & 7),
//      as the wgmma K-major SW128 layout wants? An invalid row as an out-of-bounds coordinate: zeros?
//   2. rate: time per 64-row block of D = 576 (9 tiles) for (a) cp.async by 128 threads (today's
//      producer), (b) 576 one-row TMA boxes from one thread, (c) 288 boxes per CTA multicast to
//      both CTAs of a cluster (each CTA then receives all 64 rows).
// Not part of the library. Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a
//   tma_row_probe.cu -o tma_row_probe -L/usr/local/cuda/lib64/stubs -lcuda      Run: ./tma_row_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "probe_ptx.cuh"


constexpr int kD = 576, kTiles = kD / 64, kRows = 64, kN = 32768, kBlocks = 64;
constexpr int kBlockBytes = kRows * kD * 2;  // 73,728

__device__ __forceinline__ void tma_row(uint32_t dst, const CUtensorMap* map, int col, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(map), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_row_mc(uint32_t dst, const CUtensorMap* map, int col, int row, uint64_t* bar,
                                           uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(map), "r"(col), "r"(row), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// Question 1: one CTA, one block: rows idx[0..63] (an index < 0 becomes row kN: out of bounds).
__global__ void layout_kernel(const __grid_constant__ CUtensorMap map, const int32_t* idx, uint16_t* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect(&bar, kBlockBytes);
    for (int r = 0; r < kRows; ++r)
      for (int tl = 0; tl < kTiles; ++tl)
        tma_row(smem_u32(smem + tl * 8192 + r * 128), &map, tl * 64, idx[r] < 0 ? kN : idx[r], &bar);
  }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < kBlockBytes / 2; i += blockDim.x) out[i] = reinterpret_cast<uint16_t*>(smem)[i];
}

// Question 2. mode 0: cp.async, 128 threads (thread g = tid / 8 copies chunk tid % 8 of rows g + 16 j);
// mode 1: one thread, 576 TMA rows; mode 2: cluster of 2, 288 multicast rows per CTA.
__global__ void rate_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* kv, const int32_t* idx, int mode,
                            uint64_t* ns_out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  uint32_t rank = 0;
  if (mode == 2) rank = cluster_rank();
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (mode == 2) cluster_sync(); else __syncthreads();
  const int tid = threadIdx.x, g = tid >> 3, e = tid & 7;
  const int32_t* my_idx = idx + size_t(blockIdx.x / (mode == 2 ? 2 : 1)) * kBlocks * kRows;
  const uint64_t t0 = gtime();
  for (int blk = 0; blk < kBlocks; ++blk) {
    const int32_t* bi = my_idx + blk * kRows;
    if (mode == 0) {
      const uint32_t base = smem_u32(smem);
      for (int j = 0; j < 4; ++j) {
        const int r = g + 16 * j;
        const uint16_t* row = kv + size_t(bi[r]) * kD + e * 8;
        for (int tl = 0; tl < kTiles; ++tl)
          cp_async16(base + tl * 8192 + r * 128 + ((e ^ (r & 7)) << 4), row + tl * 64, true);
      }
      asm volatile("cp.async.wait_all;" ::: "memory");
      __syncthreads();
    } else {
      if (tid == 0) {
        mbar_expect(&bar, kBlockBytes);
        if (mode == 1) {
          for (int r = 0; r < kRows; ++r)
            for (int tl = 0; tl < kTiles; ++tl) tma_row(smem_u32(smem + tl * 8192 + r * 128), &map, tl * 64, bi[r], &bar);
        } else {
          for (int r = 32 * int(rank); r < 32 * int(rank) + 32; ++r)
            for (int tl = 0; tl < kTiles; ++tl)
              tma_row_mc(smem_u32(smem + tl * 8192 + r * 128), &map, tl * 64, bi[r], &bar, uint16_t(3));
        }
      }
      mbar_wait(&bar, uint32_t(blk) & 1u);
      if (mode == 2) cluster_sync(); else __syncthreads();  // both CTAs' phases apart
    }
  }
  if (tid == 0) ns_out[blockIdx.x] = (gtime() - t0) / kBlocks;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<uint16_t> h_kv(size_t(kN) * kD);
  for (size_t r = 0; r < size_t(kN); ++r)
    for (int c = 0; c < kD; ++c) h_kv[r * kD + c] = uint16_t((r * 577 + c * 3 + 1) & 0xffff);
  uint16_t* kv = nullptr;
  CK(cudaMalloc(&kv, h_kv.size() * 2));
  CK(cudaMemcpy(kv, h_kv.data(), h_kv.size() * 2, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(kD), cuuint64_t(kN)};
  const cuuint64_t strides[1] = {cuuint64_t(kD) * 2};
  const cuuint32_t box[2] = {64, 1}, estride[2] = {1, 1};
  if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, kv, dims, strides, box, estride,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    return 1;
  }
  std::mt19937 rng(7);
  // ---- question 1
  std::vector<int32_t> h_idx(kRows);
  for (int r = 0; r < kRows; ++r) h_idx[r] = r == 5 || r == 42 ? -1 : int32_t(rng() % kN);
  int32_t* idx = nullptr;
  uint16_t* out = nullptr;
  CK(cudaMalloc(&idx, size_t(sms) * kBlocks * kRows * 4));
  CK(cudaMalloc(&out, kBlockBytes));
  CK(cudaMemcpy(idx, h_idx.data(), kRows * 4, cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(layout_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBlockBytes));
  layout_kernel<<<1, 128, kBlockBytes>>>(map, idx, out);
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> h_out(kBlockBytes / 2);
  CK(cudaMemcpy(h_out.data(), out, kBlockBytes, cudaMemcpyDeviceToHost));
  long bad_sw = 0, bad_plain = 0;
  for (int r = 0; r < kRows; ++r)
    for (int tl = 0; tl < kTiles; ++tl)
      for (int c = 0; c < 64; ++c) {
        const uint16_t want = h_idx[r] < 0 ? 0 : h_kv[size_t(h_idx[r]) * kD + tl * 64 + c];
        const size_t row0 = size_t(tl) * 4096 + size_t(r) * 64;
        if (h_out[row0 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)] != want) ++bad_sw;
        if (h_out[row0 + c] != want) ++bad_plain;
      }
  std::printf("layout: %ld mismatches against the SW128 pattern (chunk ^ row %% 8), %ld against no swizzle "
              "(of %d elements; rows 5 and 42 out of bounds, expected zero)\n",
              bad_sw, bad_plain, kRows * kD);
  // ---- question 2
  std::vector<int32_t> h_all(size_t(sms) * kBlocks * kRows);
  for (auto& v : h_all) v = int32_t(rng() % kN);
  CK(cudaMemcpy(idx, h_all.data(), h_all.size() * 4, cudaMemcpyHostToDevice));
  uint64_t* ns = nullptr;
  CK(cudaMalloc(&ns, size_t(sms) * 8));
  CK(cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBlockBytes));
  std::vector<uint64_t> h_ns(sms);
  const char* names[3] = {"cp.async, 128 threads", "TMA 1-row boxes, 1 thread", "TMA multicast, 2-CTA cluster"};
  for (int mode = 0; mode < 3; ++mode) {
    cudaLaunchConfig_t cfg{};
    cfg.blockDim = dim3(128, 1, 1);
    cfg.dynamicSmemBytes = kBlockBytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = mode == 2 ? 2 : 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(unsigned(sms & ~1), 1, 1);
    for (int rep = 0; rep < 3; ++rep) {
      CK(cudaLaunchKernelEx(&cfg, rate_kernel, map, static_cast<const uint16_t*>(kv), static_cast<const int32_t*>(idx),
                            mode, ns));
      CK(cudaDeviceSynchronize());
    }
    CK(cudaMemcpy(h_ns.data(), ns, size_t(sms) * 8, cudaMemcpyDeviceToHost));
    std::vector<uint64_t> v(h_ns.begin(), h_ns.begin() + (sms & ~1));
    std::sort(v.begin(), v.end());
    std::printf("%-30s %4d CTAs: per 64-row block median %6.0f ns, max %6.0f ns (L2 -> SM bytes per block %s)\n",
                names[mode], int(v.size()), double(v[v.size() / 2]), double(v.back()), mode == 2 ? "36 KB" : "72 KB");
  }
  return 0;
}
