#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>

#include "decode/combine.h"

namespace selkv::decode {
namespace {

constexpr int kHeadsPerCombineCta = 4;
constexpr int kCombineThreads = 128 * kHeadsPerCombineCta;  // 128 threads x 4 floats = 512 dims

#ifndef SELKV_DECODE_TIMELINE
#define SELKV_DECODE_TIMELINE 0
#endif
#if SELKV_DECODE_TIMELINE
// Launch timeline (probe builds only, see sm90/probe.cuh): absolute globaltimer ns of the first
// CTA entry, the first return from griddepcontrol.wait and the last CTA end, printed by the last
// CTA for small launches.
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
  if (p.num_rows <= 4 && atomicAdd(&g_ctl_prints, 1u) < 6)
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

__global__ void __launch_bounds__(kCombineThreads)
decode_combine_kernel(const DecodeKernelParams p) {
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[0], ctl_now());
#endif
  const int32_t* md = p.metadata;
  const int32_t T = md[0], np = md[1];
  const int32_t* prefix = md + kMdHeaderInts;
  const int32_t r = blockIdx.x;
  const int32_t first_part = part_of(prefix[r], T, np);
  const int32_t last_part = part_of(prefix[r + 1] - 1, T, np);
  if (first_part == last_part) {  // not split: written by the decode kernel
    SELKV_CTL(ctl_finish(p);)
    return;
  }
  const int32_t n_splits = last_part - first_part + 1;
  // Launched as a programmatic dependent of the decode kernel: wait for its completion (and the
  // visibility of its partials) before reading them. The metadata above was written by an earlier
  // kernel that had completed before the decode kernel started.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[1], ctl_now());
#endif

  const int h = blockIdx.y * kHeadsPerCombineCta + threadIdx.x / 128;
  const int d = (threadIdx.x % 128) * 4;
  const int32_t b = r / p.seq_q, s = r % p.seq_q;

  // slot of part q for row r: 2q if q starts inside row r, else 2q+1 (its last row).
  auto slot_of = [&](int32_t q) {
    return 2 * q + (part_begin(q, T, np) >= prefix[r] ? 0 : 1);
  };
  float max_lse = -INFINITY;
  for (int32_t i = 0; i < n_splits; ++i) {
    const float l = p.accum_lse[int64_t(slot_of(first_part + i)) * p.num_heads + h];
    max_lse = fmaxf(max_lse, l);
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum_w = 0.f;
  if (max_lse != -INFINITY) {
    for (int32_t i = 0; i < n_splits; ++i) {
      const int64_t slot = slot_of(first_part + i);
      const float l = p.accum_lse[slot * p.num_heads + h];
      const float w = expf(l - max_lse);  // 0 for an empty split (lse = -inf)
      sum_w += w;
      const float4 o = *reinterpret_cast<const float4*>(
          p.accum_out + (slot * p.num_heads + h) * 512 + d);
      acc.x += w * o.x; acc.y += w * o.y; acc.z += w * o.z; acc.w += w * o.w;
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
  uint16_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride + d;
  *reinterpret_cast<uint2*>(out) = packed;
  if (d == 0) p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse;
  SELKV_CTL(ctl_finish(p);)
}

}  // namespace

cudaError_t launch_decode_combine(const DecodeKernelParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.num_rows, p.num_heads / kHeadsPerCombineCta, 1);
  cfg.blockDim = dim3(kCombineThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  // Programmatic dependent launch: the launch overlaps the decode kernel's tail (small batches
  // are latency-bound); correctness comes from griddepcontrol.wait in the kernel.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, decode_combine_kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace selkv::decode
