#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <type_traits>

#include "decode/combine.h"
#include "decode/partial_scale.h"
#include "decode/timeline_clock.cuh"
#include "sm90/device_ops.cuh"  // bf16x2_bits
#include "sm90/epilogue.cuh"     // sink_scale

namespace selkv::decode {
namespace {

constexpr int kHeadsPerCombineCta = 4;
constexpr int kCombineThreads = 128 * kHeadsPerCombineCta;  // 128 threads x 4 floats = 512 dims
// Three shapes, picked at launch from the plan's grid (shape only, never data): a grid that fits
// one CTA per SM keeps all 16 partial rows of a thread in flight at once (104 registers, one L2
// round trip for rows split up to 16 ways); a larger grid keeps 8 in flight at 2 CTAs / SM (64
// registers) so twice as many CTAs run at once; a large grid of rows split a few ways each takes
// the fat kernel below (docs/perf-log.md: combine shapes, combine fat shape).
struct CombineWide {
  static constexpr int kBatch = 16, kMinCtas = 1;
};
struct CombineNarrow {
  static constexpr int kBatch = 8, kMinCtas = 2;
};
#if SELKV_DECODE_TIMELINE
// Launch timeline (SELKV_DECODE_TIMELINE=1 builds only, see sm90/timeline.cuh): globaltimer ns of
// the first CTA entry and first return from griddepcontrol.wait (min over CTAs), then, max over
// CTAs (thread 0's path, the 4-heads kernel), the return from the wait, the splits' max lse (the
// lse loads and the first batch of partials issued; printed as last_lse_table), partials merged,
// merged row ready (attn_sink), and the end (the fat kernel has no stamps); printed by the last CTA, relative to the first entry,
// for launches SKIP .. SKIP + 5 of the process, as the decode's stamps.
enum CtlStamp { kCtlEntry, kCtlFirstAfterWait, kCtlEnd, kCtlLastAfterWait, kCtlLastLseTable, kCtlLastMerged,
                kCtlLastRowReady, kCtlStamps };
__device__ unsigned long long g_ctl[kCtlStamps] = {~0ull, ~0ull};
__device__ unsigned int g_ctl_done, g_ctl_prints;
// Thread 0 of the CTA folds the clock into stamp k (earliest over CTAs, or latest).
__device__ __forceinline__ void ctl_min(int k) {
  if (threadIdx.x == 0) atomicMin(&g_ctl[k], timeline_now());
}
__device__ __forceinline__ void ctl_max(int k) {
  if (threadIdx.x == 0) atomicMax(&g_ctl[k], timeline_now());
}
// Called by every CTA when done; the last one prints and resets.
__device__ __forceinline__ void ctl_finish(const DecodeKernelParams& p) {
  if (threadIdx.x != 0) return;
  atomicMax(&g_ctl[kCtlEnd], timeline_now());
  __threadfence();
  if (atomicAdd(&g_ctl_done, 1u) != gridDim.x * gridDim.y - 1) return;
  const unsigned launch = atomicAdd(&g_ctl_prints, 1u);
  if (timeline_prints_launch(launch)) {
    const unsigned long long t0 = g_ctl[kCtlEntry];
    auto us = [&](int k) { return g_ctl[k] >= t0 && g_ctl[k] != ~0ull ? double(g_ctl[k] - t0) * 1e-3 : -1.0; };
    printf("TIMELINE combine entry=%llu ns (us from it): first_after_wait %.2f last_after_wait %.2f last_lse_table %.2f "
           "last_merged %.2f last_row_ready %.2f last_end %.2f\n",
           t0, us(kCtlFirstAfterWait), us(kCtlLastAfterWait), us(kCtlLastLseTable), us(kCtlLastMerged),
           us(kCtlLastRowReady), us(kCtlEnd));
  }
  for (int k = 0; k < kCtlStamps; ++k) g_ctl[k] = (k == kCtlEntry || k == kCtlFirstAfterWait) ? ~0ull : 0ull;
  g_ctl_done = 0;
}
#define SELKV_CTL(...) __VA_ARGS__
#else
#define SELKV_CTL(...)
#endif

// sr = entry `entry` of the plan's split-row table (written by the scheduler kernel, which completed
// before the decode kernel started, so it can be read before the dependency wait), checked against
// the call's shape: a corrupt table gives wrong rows, never an out-of-bounds access. num_parts ==
// 0: nothing to merge. One copy for both kernels; a macro because the 4-heads kernel expands it
// inline to keep the SASS it was measured with (called through an inline function, ptxas
// rescheduled its prologue); the fat kernel calls load_split_row. Both are SASS-identical to the
// tested builds.
#define SELKV_COMBINE_SPLIT_ROW(p, entry_, sr)                                                             \
  do {                                                                                                     \
    const int32_t entry = (entry_);                                                                        \
    int32_t header[kMdHeaderInts];                                                                         \
    md_load_header((p).metadata, header);                                                                  \
    /* K2 = 0 for calls without an extra cache; the plan records K2 for both */                            \
    const int32_t k2_word = (p).metadata[md_extra_offset((p).num_rows, (p).batch)];                        \
    if (md_header_ok_extra(header, k2_word, (p).num_rows, (p).topk, (p).topk_extra, (p).min_blocks_per_part, \
                           (p).num_sm_parts)) {                                                            \
      if (entry < header[kMdSplitCount]) {                                                                 \
        const int4 e = *reinterpret_cast<const int4*>((p).metadata + kMdSplitRows + 4 * entry);            \
        const bool ok = e.x >= 0 && e.x < (p).num_rows && e.y >= 0 && e.y < (p).num_sm_parts && e.z >= 2 && \
                        e.z <= (p).num_sm_parts - e.y && (e.w == 2 * e.y || e.w == 2 * e.y + 1);           \
        if (ok) (sr).row = e.x, (sr).first_part = e.y, (sr).num_parts = e.z, (sr).first_slot = e.w;       \
      }                                                                                                    \
    } else if (!has_lengths(p)) {                                                                          \
      /* Stale or unwritten plan, fixed top-k: the decode kernel ran the closed-form schedule, whose */     \
      /* table this rebuilds. (Dynamic top-k: the decode kernel wrote NaN rows; nothing to merge.) */      \
      (sr) = nth_split_row(FixedSchedule((p).num_rows, (p).topk + (p).topk_extra, (p).min_blocks_per_part,   \
                                         (p).num_sm_parts),                                                \
                           entry);                                                                         \
    }                                                                                                      \
  } while (0)

__device__ __forceinline__ SplitRow load_split_row(const DecodeKernelParams& p, int32_t entry_index) {
  SplitRow sr;
  SELKV_COMBINE_SPLIT_ROW(p, entry_index, sr);
  return sr;
}

// fmaxf drops NaN; this keeps it: a split that saw a NaN makes the row NaN, never empty.
__device__ __forceinline__ float nan_sticky_max(float m, float x) {
  return (x != x || m != m) ? __int_as_float(0x7fffffff) : fmaxf(m, x);
}

// Head h's attn_sink logit, loaded before the dependency wait: attn_sink is the caller's input,
// complete before the decode kernel (an ordinary launch) began, not the decode kernel's output, so
// its load (a DRAM miss in a cold call) leaves the tail that follows the wait.
struct HeadSink {
  bool on;
  float logit;
};
__device__ __forceinline__ HeadSink load_head_sink(const DecodeKernelParams& p, int h) {
  return p.attn_sink != nullptr ? HeadSink{true, p.attn_sink[h]} : HeadSink{false, 0.f};
}

// The merged row's lse and the scale of its weighted sum (1 / sum, times the attn_sink factor);
// a row with no valid entry (max -inf): p.empty_lse and out 0.
struct MergedRow {
  float lse, f;
};
__device__ __forceinline__ MergedRow merged_row(const DecodeKernelParams& p, HeadSink sink, float max_lse, float sum_w) {
  float lse = p.empty_lse, f = 0.f;
  if (max_lse != -INFINITY) {
    lse = max_lse + logf(sum_w);
    f = 1.f / sum_w;
    if (sink.on) f *= selkv::sm90::sink_scale(sink.logit, lse);
  }
  return {lse, f};
}

// One CTA per (split row, 4 heads): column i merges entry i of the plan's split-row table (the
// scheduler wrote it from split_row_of_part, in part order), so no CTA is launched just to find
// that it has nothing to merge (docs/perf-log.md: combine grid). Every load a CTA needs is issued
// at once: each warp's partial lse and inverse scales of 32 splits (one per lane), and the partial
// rows kCombineBatch splits at a time, so a row split n ways costs ~ceil(n / kCombineBatch) L2 round
// trips instead of ~n. The merge arithmetic and its order (max,
// then w_i = exp(lse_i - max), sum and accumulation in split order) are fixed: deterministic.
// kF16Partials: the partials are fp16 with an inverse scale per (split, head, d_v half)
// (decode_params.h f16_partials_by_default), else fp32. Same element offsets either way.
template <class Shape, bool kF16Partials>
__global__ void __launch_bounds__(kCombineThreads, Shape::kMinCtas)
decode_combine_kernel(const DecodeKernelParams p) {
  constexpr int kCombineBatch = Shape::kBatch;
  SELKV_CTL(ctl_min(kCtlEntry);)
  // Split row blockIdx.x of the plan's table (metadata written by the scheduler kernel, which
  // completed before the decode kernel started, so it can be read before the dependency wait).
  // Entries are checked against the call's shape: a corrupt table gives wrong rows, never an
  // out-of-bounds partial, out or lse access.
  SplitRow sr;
  SELKV_COMBINE_SPLIT_ROW(p, int32_t(blockIdx.x), sr);
  if (sr.num_parts == 0) {
    SELKV_CTL(ctl_finish(p);)
    return;
  }
  const int32_t n = sr.num_parts;
  const int h0 = int(blockIdx.y) * kHeadsPerCombineCta;
  const int hl = int(threadIdx.x) / 128, h = h0 + hl;
  const int d = (int(threadIdx.x) % 128) * 4;
  const int64_t split_stride = partial_slot_elems(p.num_heads, kF16Partials);
  auto slot = [&](int32_t i) -> int64_t { return i == 0 ? sr.first_slot : 2 * (sr.first_part + i); };
  using Elem = std::conditional_t<kF16Partials, uint16_t, float>;
  const Elem* po = reinterpret_cast<const Elem*>(p.accum_out) + int64_t(h) * 512 + d;

  const HeadSink sink = load_head_sink(p, h);
  // Launched as a programmatic dependent of the decode kernel: wait for its completion (and the
  // visibility of its partials) before reading them.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  SELKV_CTL(ctl_min(kCtlFirstAfterWait); ctl_max(kCtlLastAfterWait);)

  // Warp scope: a warp merges 128 values of one head, all in one d_v half. Lane l holds split
  // 32 c + l's partial lse (and inverse scale) of chunk c of 32 splits, and the merge takes them by
  // shuffle: no table in shared memory, no barrier across the CTA's warps, one exp per split and
  // lane. Same arithmetic in the same order as a per-thread table.
  const int lane = int(threadIdx.x) % 32;
  [[maybe_unused]] const float* inv = p.accum_out + f16_inv_scales_offset(p.num_sm_parts, p.num_heads);
  auto lane_lse = [&](int32_t i) -> float { return i < n ? p.accum_lse[slot(i) * p.num_heads + h] : -INFINITY; };
  auto lane_inv = [&](int32_t i) -> float {
    if constexpr (kF16Partials) return i < n ? inv[(slot(i) * p.num_heads + h) * 2 + (d >> 8)] : 0.f;
    return 1.f;
  };
  float lse_c = lane_lse(lane), inv_c = lane_inv(lane);  // chunk 0, in flight with the partials
  using Chunk = std::conditional_t<kF16Partials, uint2, float4>;  // 4 values
  Chunk o[kCombineBatch];
  auto load_batch = [&](int32_t base) {
    #pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      if (base + j >= n) break;  // CTA-uniform
      o[j] = *reinterpret_cast<const Chunk*>(po + slot(base + j) * split_stride);
    }
  };
  auto value = [&](int j) -> float4 {
    if constexpr (kF16Partials) {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&o[j].x));
      const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&o[j].y));
      return make_float4(a.x, a.y, c.x, c.y);
    } else {
      return o[j];
    }
  };
  load_batch(0);
  // The max over splits (order-free: nan_sticky_max is exact and NaN-sticky).
  float max_lse = lse_c;
  for (int32_t c = 32; c < n; c += 32) max_lse = nan_sticky_max(max_lse, lane_lse(c + lane));
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) max_lse = nan_sticky_max(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, off));
  SELKV_CTL(ctl_max(kCtlLastLseTable);)

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum_w = 0.f;
  if (max_lse != -INFINITY) {
    static_assert(32 % kCombineBatch == 0, "a batch lies in one chunk of 32 splits");
    float w_c = expf(lse_c - max_lse);  // 0 for an empty split (lse = -inf) and past n
    for (int32_t base = 0; base < n; base += kCombineBatch) {
      if (base != 0) {
        load_batch(base);
        if ((base & 31) == 0) {  // next chunk of 32 splits (rows split more than 32 ways)
          w_c = expf(lane_lse(base + lane) - max_lse);
          inv_c = lane_inv(base + lane);
        }
      }
      // Merge steps in groups of kStepGroup: the group's weights (and inverse scales) by shuffle at
      // once, then its steps, predicated; the loop stops after the row's last split's group (n is
      // CTA-uniform). Shuffling the whole batch at once held 2 x kBatch more values live and
      // spilled the 64-register Narrow shape; one group a step serialized the shuffles.
      constexpr int kStepGroup = 4;
      static_assert(kCombineBatch % kStepGroup == 0);
      #pragma unroll
      for (int g = 0; g < kCombineBatch; g += kStepGroup) {
        if (base + g >= n) break;
        float wj[kStepGroup], isj[kStepGroup];
        #pragma unroll
        for (int j = 0; j < kStepGroup; ++j) {
          const int src = (int(base) + g + j) & 31;
          wj[j] = __shfl_sync(0xffffffffu, w_c, src);
          if constexpr (kF16Partials) isj[j] = __shfl_sync(0xffffffffu, inv_c, src);  // fp32 partials: no scale
        }
        #pragma unroll
        for (int j = 0; j < kStepGroup; ++j) {
          if (base + g + j < n) {
            const float w = wj[j];
            sum_w += w;
            float4 v = value(g + j);
            if constexpr (kF16Partials) v = make_float4(v.x * isj[j], v.y * isj[j], v.z * isj[j], v.w * isj[j]);
            acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
          }
        }
      }
    }
  }
  SELKV_CTL(ctl_max(kCtlLastMerged);)
  const auto [lse, f] = merged_row(p, sink, max_lse, sum_w);
  const uint2 packed =
      make_uint2(selkv::sm90::bf16x2_bits(acc.x * f, acc.y * f), selkv::sm90::bf16x2_bits(acc.z * f, acc.w * f));
  SELKV_CTL(ctl_max(kCtlLastRowReady);)
  const auto [b, s] = row_coord(sr.row, p.batch);
  uint16_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride + d;
  *reinterpret_cast<uint2*>(out) = packed;
  if (d == 0) p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse;
  SELKV_CTL(ctl_finish(p);)
}

// Large grids (more (split row, head group) CTAs than the SMs hold at once: a dynamic top-k batch
// whose rows are mostly split two or three ways): the 4-heads-per-CTA kernel pays its per-CTA
// work (split-row lookup, lse table, exp / log of the epilogue) for every 4 values a thread
// merges, and was instruction-bound there. Here a thread merges kFatDims consecutive d_v values
// of one head and a CTA kFatHeads heads. Same arithmetic, in the same order, as the kernel above.
constexpr int kFatThreads = 256, kFatDims = 16;
constexpr int kFatThreadsPerHead = 512 / kFatDims;                   // 32: one warp per head
constexpr int kFatHeads = kFatThreads / kFatThreadsPerHead;          // 8
constexpr int kFatMaxAvgSplits = 6;  // parts per split row at most, on average, for the fat kernel

template <bool kF16Partials>
__global__ void __launch_bounds__(kFatThreads, 4) decode_combine_fat_kernel(const DecodeKernelParams p) {
  constexpr int kBatch = kF16Partials ? 2 : 1;  // splits whose values are in flight at once (64 registers)
  // [splits][kFatHeads] partial lse, then with fp16 partials [splits][kFatHeads][2] inverse scales
  extern __shared__ float s_fat[];
  const SplitRow sr = load_split_row(p, int32_t(blockIdx.x));
  if (sr.num_parts == 0) return;
  const int32_t n = sr.num_parts;
  const int tid = int(threadIdx.x);
  const int h0 = int(blockIdx.y) * kFatHeads;
  const int hl = tid / kFatThreadsPerHead, h = h0 + hl;
  const int d = (tid % kFatThreadsPerHead) * kFatDims;
  const int64_t split_stride = partial_slot_elems(p.num_heads, kF16Partials);
  auto slot = [&](int32_t i) -> int64_t { return i == 0 ? sr.first_slot : 2 * (sr.first_part + i); };
  using Elem = std::conditional_t<kF16Partials, uint16_t, float>;
  using Chunk = std::conditional_t<kF16Partials, uint4, float4>;
  constexpr int kChunks = kFatDims * int(sizeof(Elem)) / 16;  // 16-byte loads per split: 2 (fp16) or 4
  const Elem* po = reinterpret_cast<const Elem*>(p.accum_out) + int64_t(h) * 512 + d;

  const HeadSink sink = load_head_sink(p, h);
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the decode kernel's partials are visible

  for (int32_t i = tid; i < n * kFatHeads; i += kFatThreads)
    s_fat[i] = p.accum_lse[slot(i / kFatHeads) * p.num_heads + h0 + i % kFatHeads];
  float* s_inv = s_fat + p.num_sm_parts * kFatHeads;
  if constexpr (kF16Partials) {
    const float* inv = p.accum_out + f16_inv_scales_offset(p.num_sm_parts, p.num_heads);
    for (int32_t k = tid; k < n * 2 * kFatHeads; k += kFatThreads)
      s_inv[k] = inv[(slot(k / (2 * kFatHeads)) * p.num_heads + h0) * 2 + k % (2 * kFatHeads)];
  }
  Chunk o[kBatch][kChunks];
  auto load_batch = [&](int32_t base) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (base + j < n) {
        const Chunk* src = reinterpret_cast<const Chunk*>(po + slot(base + j) * split_stride);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) o[j][c] = src[c];
      }
  };
  load_batch(0);  // in flight with the lse loads
  __syncthreads();

  float max_lse = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    const float x = s_fat[kFatHeads * i + hl];
    max_lse = nan_sticky_max(max_lse, x);
  }
  float acc[kFatDims];
#pragma unroll
  for (int e = 0; e < kFatDims; ++e) acc[e] = 0.f;
  float sum_w = 0.f;
  if (max_lse != -INFINITY) {
    for (int32_t base = 0; base < n; base += kBatch) {
      if (base != 0) load_batch(base);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (base + j < n) {
          const float w = expf(s_fat[kFatHeads * (base + j) + hl] - max_lse);  // 0 for an empty split
          sum_w += w;
          float is = 1.f;
          if constexpr (kF16Partials) is = s_inv[2 * kFatHeads * (base + j) + 2 * hl + (d >> 8)];
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            if constexpr (kF16Partials) {
              const uint32_t wd[4] = {o[j][c].x, o[j][c].y, o[j][c].z, o[j][c].w};
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&wd[q]));
                acc[8 * c + 2 * q] += w * (v.x * is);
                acc[8 * c + 2 * q + 1] += w * (v.y * is);
              }
            } else {
              acc[4 * c + 0] += w * o[j][c].x;
              acc[4 * c + 1] += w * o[j][c].y;
              acc[4 * c + 2] += w * o[j][c].z;
              acc[4 * c + 3] += w * o[j][c].w;
            }
          }
        }
      }
    }
  }
  const auto [lse, f] = merged_row(p, sink, max_lse, sum_w);
  uint32_t packed[kFatDims / 2];
#pragma unroll
  for (int e = 0; e < kFatDims / 2; ++e) packed[e] = selkv::sm90::bf16x2_bits(acc[2 * e] * f, acc[2 * e + 1] * f);
  const auto [b, s] = row_coord(sr.row, p.batch);
  uint16_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride + d;
#pragma unroll
  for (int e = 0; e < kFatDims / 8; ++e)
    reinterpret_cast<uint4*>(out)[e] = make_uint4(packed[4 * e], packed[4 * e + 1], packed[4 * e + 2], packed[4 * e + 3]);
  if (d == 0) p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse;
}

#undef SELKV_COMBINE_SPLIT_ROW

}  // namespace

cudaError_t launch_decode_combine(const DecodeKernelParams& p, int32_t max_split_rows, bool f16_partials,
                                  cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(max_split_rows > 0 ? max_split_rows : 1, p.num_heads / kHeadsPerCombineCta, 1);
  cfg.blockDim = dim3(kCombineThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;  // the 4-heads kernel keeps its splits' lse in registers
  cfg.stream = stream;
  // Programmatic dependent launch: the launch overlaps the decode kernel's tail (small batches
  // are latency-bound); correctness comes from griddepcontrol.wait in the kernel.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // Heads x parts = CTAs the decode grid had (H=128: 2 per cluster part): the SMs in use.
  const int64_t ctas = int64_t(cfg.gridDim.x) * cfg.gridDim.y;
  const bool wide = ctas <= int64_t(p.num_sm_parts) * (p.num_heads / kHeadsPerCta);
  // The fat kernel loads kBatch (2) splits at a time: for rows split more than ~6 ways on average
  // the narrow shape's 8 in flight win (docs/perf-log.md: combine fat shape).
  const bool fat = !wide && int64_t(cfg.gridDim.x) * kFatMaxAvgSplits >= p.num_sm_parts;
  cudaError_t err;
  if (!fat) {
    err = f16_partials ? (wide ? cudaLaunchKernelEx(&cfg, decode_combine_kernel<CombineWide, true>, p)
                               : cudaLaunchKernelEx(&cfg, decode_combine_kernel<CombineNarrow, true>, p))
                       : (wide ? cudaLaunchKernelEx(&cfg, decode_combine_kernel<CombineWide, false>, p)
                               : cudaLaunchKernelEx(&cfg, decode_combine_kernel<CombineNarrow, false>, p));
  } else {
    cfg.gridDim.y = unsigned(p.num_heads / kFatHeads);
    cfg.blockDim = dim3(kFatThreads, 1, 1);
    cfg.dynamicSmemBytes = size_t(p.num_sm_parts) * kFatHeads * sizeof(float) * (f16_partials ? 3 : 1);
    err = f16_partials ? cudaLaunchKernelEx(&cfg, decode_combine_fat_kernel<true>, p)
                       : cudaLaunchKernelEx(&cfg, decode_combine_fat_kernel<false>, p);
  }
  if (err != cudaSuccess) return err;
  SELKV_CTL(tl_enqueue_decode_print(stream);)  // timeline builds: the decode launch's print, after the combine
  return cudaGetLastError();
}

}  // namespace selkv::decode
