#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>

#include "decode/combine.h"

namespace selkv::decode {
namespace {

constexpr int kHeadsPerCombineCta = 4;
constexpr int kCombineThreads = 128 * kHeadsPerCombineCta;  // 128 threads x 4 floats = 512 dims
constexpr int kCombineBatch = 8;  // partial rows in flight per thread (64 registers at 2 CTAs / SM)

#ifndef SELKV_DECODE_TIMELINE
#define SELKV_DECODE_TIMELINE 0
#endif
#if SELKV_DECODE_TIMELINE
// Launch timeline (probe builds only, see sm90/probe.cuh): absolute globaltimer ns of the first
// CTA entry, the first return from griddepcontrol.wait and the last CTA end, printed by the last
// CTA for the first launches of the process.
__device__ unsigned long long g_ctl[3] = {~0ull, ~0ull, 0ull};
__device__ unsigned int g_ctl_done, g_ctl_prints;
__device__ __forceinline__ unsigned long long ctl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
// Called by every CTA when done; the last one prints and resets.
__device__ __forceinline__ void ctl_finish(const DecodeKernelParams& p) {
  if (threadIdx.x != 0) return;
  atomicMax(&g_ctl[2], ctl_now());
  __threadfence();
  if (atomicAdd(&g_ctl_done, 1u) != gridDim.x * gridDim.y - 1) return;
  if (atomicAdd(&g_ctl_prints, 1u) < 6)
    printf("TIMELINE combine first_entry=%llu first_after_wait=%llu last_end=%llu ns\n", g_ctl[0], g_ctl[1], g_ctl[2]);
  g_ctl[0] = ~0ull;
  g_ctl[1] = ~0ull;
  g_ctl[2] = 0;
  g_ctl_done = 0;
}
#define SELKV_CTL(...) __VA_ARGS__
#else
#define SELKV_CTL(...)
#endif

// One CTA per (part q, 4 heads): it merges the row split by the boundary at the end of part q
// when q is that row's first part (split_row_of_part), else exits at once, so the grid is
// parts x H / 4 whatever the batch (at most one split row per part boundary). Every load a CTA
// needs is issued at once: the partial lse of all splits (one float4 = 4 heads per split) into
// shared memory, and the partial rows kCombineBatch splits at a time, so a row split n ways costs
// ~ceil(n / kCombineBatch) L2 round trips instead of ~n. The merge arithmetic and its order (max,
// then w_i = exp(lse_i - max), sum and accumulation in split order) are fixed: deterministic.
template <bool kDynamic>
__global__ void __launch_bounds__(kCombineThreads, 2)
decode_combine_kernel(const DecodeKernelParams p) {
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[0], ctl_now());
#endif
  extern __shared__ float4 s_lse[];  // [splits]: partial lse of the CTA's 4 heads
  // The schedule (fixed: closed form; dynamic: metadata written by an earlier kernel that had
  // completed before the decode kernel started) can be read before the dependency wait.
  // One thread derives the CTA's row (a few 64-bit divisions): the grid is parts x H / 4 CTAs
  // of 512 threads, most of which exit here, and every thread doing it cost 4-6 us per call
  // (ncu at b8c19f6: H128 B=2 12 -> 16 us when the divisions grew by two).
  __shared__ int32_t s_sr[4];
  if (threadIdx.x == 0) {
    const SplitRow t = split_row_of_part(make_schedule<kDynamic>(p), int32_t(blockIdx.x));
    s_sr[0] = t.row, s_sr[1] = t.first_part, s_sr[2] = t.num_parts, s_sr[3] = t.first_slot;
  }
  __syncthreads();
  SplitRow sr;
  sr.row = s_sr[0], sr.first_part = s_sr[1], sr.num_parts = s_sr[2], sr.first_slot = s_sr[3];
  if (sr.num_parts == 0) {
    SELKV_CTL(ctl_finish(p);)
    return;
  }
  const int32_t n = sr.num_parts;
  const int h0 = int(blockIdx.y) * kHeadsPerCombineCta;
  const int hl = int(threadIdx.x) / 128, h = h0 + hl;
  const int d = (int(threadIdx.x) % 128) * 4;
  const int64_t split_stride = int64_t(p.num_heads) * 512;  // floats per accumulator slot
  auto slot = [&](int32_t i) -> int64_t { return i == 0 ? sr.first_slot : 2 * (sr.first_part + i); };
  const float* po = p.accum_out + int64_t(h) * 512 + d;

  // Launched as a programmatic dependent of the decode kernel: wait for its completion (and the
  // visibility of its partials) before reading them.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[1], ctl_now());
#endif

  for (int32_t i = int32_t(threadIdx.x); i < n; i += kCombineThreads)
    s_lse[i] = *reinterpret_cast<const float4*>(p.accum_lse + slot(i) * p.num_heads + h0);
  float4 o[kCombineBatch];
  auto load_batch = [&](int32_t base) {
    #pragma unroll
    for (int j = 0; j < kCombineBatch; ++j)
      if (base + j < n) o[j] = *reinterpret_cast<const float4*>(po + slot(base + j) * split_stride);
  };
  load_batch(0);  // in flight with the lse loads
  __syncthreads();
  const float* lse_of = reinterpret_cast<const float*>(s_lse) + hl;  // split i: lse_of[4 * i]

  float max_lse = -INFINITY;
  for (int32_t i = 0; i < n; ++i) max_lse = fmaxf(max_lse, lse_of[4 * i]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum_w = 0.f;
  if (max_lse != -INFINITY) {
    for (int32_t base = 0; base < n; base += kCombineBatch) {
      if (base != 0) load_batch(base);
      #pragma unroll
      for (int j = 0; j < kCombineBatch; ++j) {
        if (base + j < n) {
          const float w = expf(lse_of[4 * (base + j)] - max_lse);  // 0 for an empty split (lse = -inf)
          sum_w += w;
          acc.x += w * o[j].x; acc.y += w * o[j].y; acc.z += w * o[j].z; acc.w += w * o[j].w;
        }
      }
    }
  }
  float lse = -INFINITY, f = 0.f;
  if (max_lse != -INFINITY) {
    lse = max_lse + logf(sum_w);
    f = 1.f / sum_w;
    if (p.attn_sink != nullptr) f *= 1.f / (1.f + expf(p.attn_sink[h] - lse));
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * f, acc.y * f);
  __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * f, acc.w * f);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  const auto [b, s] = row_coord(sr.row, p.batch);
  uint16_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride + d;
  *reinterpret_cast<uint2*>(out) = packed;
  if (d == 0) p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse;
  SELKV_CTL(ctl_finish(p);)
}

}  // namespace

cudaError_t launch_decode_combine(const DecodeKernelParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.num_sm_parts, p.num_heads / kHeadsPerCombineCta, 1);
  cfg.blockDim = dim3(kCombineThreads, 1, 1);
  cfg.dynamicSmemBytes = size_t(p.num_sm_parts) * sizeof(float4);  // a row has <= parts splits
  cfg.stream = stream;
  // Programmatic dependent launch: the launch overlaps the decode kernel's tail (small batches
  // are latency-bound); correctness comes from griddepcontrol.wait in the kernel.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = p.topk_length != nullptr ? cudaLaunchKernelEx(&cfg, decode_combine_kernel<true>, p)
                                                   : cudaLaunchKernelEx(&cfg, decode_combine_kernel<false>, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace selkv::decode
