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

// One CTA per (split row, 4 heads): column i merges entry i of the plan's split-row table (the
// scheduler wrote it from split_row_of_part, in part order), so no CTA is launched just to find
// that it has nothing to merge (the parts x H / 4 grid of before spent 11-21 us per call on those,
// ncu, session 6). Every load a CTA needs is issued at once: the partial lse of all splits (one
// float4 = 4 heads per split) into shared memory, and the partial rows kCombineBatch splits at a
// time, so a row split n ways costs ~ceil(n / kCombineBatch) L2 round trips instead of ~n. The merge arithmetic and its order (max,
// then w_i = exp(lse_i - max), sum and accumulation in split order) are fixed: deterministic.
__global__ void __launch_bounds__(kCombineThreads, 2)
decode_combine_kernel(const DecodeKernelParams p) {
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[0], ctl_now());
#endif
  extern __shared__ float4 s_lse[];  // [splits]: partial lse of the CTA's 4 heads (2 head pairs)
  // Split row blockIdx.x of the plan's table (metadata written by the scheduler kernel, which
  // completed before the decode kernel started, so it can be read before the dependency wait).
  // Entries are checked against the call's shape: a corrupt table gives wrong rows, never an
  // out-of-bounds partial, out or lse access.
  SplitRow sr;
  const int32_t entry = int32_t(blockIdx.x);
  if (entry < p.metadata[kMdSplitCount]) {
    const int4 e = *reinterpret_cast<const int4*>(p.metadata + kMdSplitRows + 4 * entry);
    const bool ok = e.x >= 0 && e.x < p.num_rows && e.y >= 0 && e.y < p.num_sm_parts && e.z >= 2 &&
                    e.z <= p.num_sm_parts - e.y && (e.w == 2 * e.y || e.w == 2 * e.y + 1);
    if (ok) sr.row = e.x, sr.first_part = e.y, sr.num_parts = e.z, sr.first_slot = e.w;
  }
  if (sr.num_parts == 0) {
    SELKV_CTL(ctl_finish(p);)
    return;
  }
  const int32_t n = sr.num_parts;
  // The CTA's 4 heads are head pairs 2y, 2y + 1 (partial_head_pair): thread (pair hl, column pair
  // cp) merges (h, 2cp), (h, 2cp + 1), (h + 8, 2cp), (h + 8, 2cp + 1), one float4 per split.
  const int hl = int(threadIdx.x) / 256, cp = int(threadIdx.x) % 256;
  const int hp = 2 * int(blockIdx.y) + hl;
  const int ha = (hp >> 3) * 16 + (hp & 7), hb = ha + 8;
  static_assert(partial_word(8, 0) == 2 && partial_word(1, 3) == 1024 + 5 && partial_lse_word(9) == 3);
  const int64_t split_stride = int64_t(p.num_heads) * 512;  // floats per accumulator slot
  auto slot = [&](int32_t i) -> int64_t { return i == 0 ? sr.first_slot : 2 * (sr.first_part + i); };
  const float* po = p.accum_out + int64_t(hp) * 1024 + 4 * cp;

  // Launched as a programmatic dependent of the decode kernel: wait for its completion (and the
  // visibility of its partials) before reading them.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#if SELKV_DECODE_TIMELINE
  if (threadIdx.x == 0) atomicMin(&g_ctl[1], ctl_now());
#endif

  // lse words 4y .. 4y + 3 of a slot: heads (pair 2y: ha, hb), (pair 2y + 1: ha + 1, hb + 1).
  for (int32_t i = int32_t(threadIdx.x); i < n; i += kCombineThreads)
    s_lse[i] = *reinterpret_cast<const float4*>(p.accum_lse + slot(i) * p.num_heads + 4 * int(blockIdx.y));
  float4 o[kCombineBatch];
  auto load_batch = [&](int32_t base) {
    #pragma unroll
    for (int j = 0; j < kCombineBatch; ++j)
      if (base + j < n) o[j] = *reinterpret_cast<const float4*>(po + slot(base + j) * split_stride);
  };
  load_batch(0);  // in flight with the lse loads
  __syncthreads();
  const float* lse_of = reinterpret_cast<const float*>(s_lse) + 2 * hl;  // split i: lse_of[4 i] (ha), [4 i + 1] (hb)

  float max_a = -INFINITY, max_b = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    max_a = fmaxf(max_a, lse_of[4 * i]);
    max_b = fmaxf(max_b, lse_of[4 * i + 1]);
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);  // (ha, c), (ha, c + 1), (hb, c), (hb, c + 1)
  float sum_a = 0.f, sum_b = 0.f;
  for (int32_t base = 0; base < n; base += kCombineBatch) {
    if (base != 0) load_batch(base);
    #pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      if (base + j < n) {
        // 0 for an empty split (lse = -inf), and for a head with nothing valid at all (max = -inf)
        const float wa = max_a == -INFINITY ? 0.f : expf(lse_of[4 * (base + j)] - max_a);
        const float wb = max_b == -INFINITY ? 0.f : expf(lse_of[4 * (base + j) + 1] - max_b);
        sum_a += wa;
        sum_b += wb;
        acc.x += wa * o[j].x; acc.y += wa * o[j].y; acc.z += wb * o[j].z; acc.w += wb * o[j].w;
      }
    }
  }
  auto finish = [&](float max_lse, float sum_w, int h, float& lse) -> float {
    lse = -INFINITY;
    if (max_lse == -INFINITY) return 0.f;
    lse = max_lse + logf(sum_w);
    float f = 1.f / sum_w;
    if (p.attn_sink != nullptr) f *= 1.f / (1.f + expf(p.attn_sink[h] - lse));
    return f;
  };
  float lse_a, lse_b;
  const float fa = finish(max_a, sum_a, ha, lse_a), fb = finish(max_b, sum_b, hb, lse_b);
  __nv_bfloat162 va = __floats2bfloat162_rn(acc.x * fa, acc.y * fa);
  __nv_bfloat162 vb = __floats2bfloat162_rn(acc.z * fb, acc.w * fb);
  const auto [b, s] = row_coord(sr.row, p.batch);
  uint16_t* orow = p.out + b * p.out_batch_stride + s * p.out_seq_stride + 2 * cp;
  *reinterpret_cast<uint32_t*>(orow + ha * p.out_head_stride) = *reinterpret_cast<uint32_t*>(&va);
  *reinterpret_cast<uint32_t*>(orow + hb * p.out_head_stride) = *reinterpret_cast<uint32_t*>(&vb);
  if (cp == 0) {
    float* lrow = p.lse + b * p.lse_batch_stride + s * p.lse_seq_stride;
    lrow[ha] = lse_a;
    lrow[hb] = lse_b;
  }
  SELKV_CTL(ctl_finish(p);)
}

}  // namespace

cudaError_t launch_decode_combine(const DecodeKernelParams& p, int32_t max_split_rows, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(max_split_rows > 0 ? max_split_rows : 1, p.num_heads / kHeadsPerCombineCta, 1);
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
  const cudaError_t err = cudaLaunchKernelEx(&cfg, decode_combine_kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace selkv::decode
