// SM90 FP8 sparse MLA decode kernel (C5). Design: docs/decode-design.md §2.
//
// One CTA = one 64-head group x one part of the split-KV schedule (a run of (row, 64-token
// block) items). WG0 produces dequantized bf16 KV tiles into a double-buffered smem ring; WG1 and
// WG2 consume them with wgmma (S = Q K^T split by tokens, O += P V split by d_v).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cutlass/arch/reg_reconfig.h>

#include "decode/sm90/config.h"
#include "sm90/common.cuh"

namespace selkv::decode::sm90 {

// ---- work iteration (identical in producer and consumers) -----------------------------------
struct RowWork {
  int32_t row;        // b * seq_q + s
  int32_t blk_begin;  // 64-token blocks [blk_begin, blk_end) of this row
  int32_t blk_end;
  bool split;         // row shared with other parts -> write a partial
  int32_t slot;       // accumulator slot when split
};

struct PartIter {
  const int32_t* prefix;
  int32_t g, g0, g1, r, part, max_blocks;

  // false when this part has no work (uniform over the CTA).
  __device__ __forceinline__ bool init(const int32_t* md, int32_t part_, int32_t max_blocks_) {
    const int32_t T = md[0], np = md[1], rows = md[2];
    part = part_;
    max_blocks = max_blocks_;
    if (part >= np || T <= 0 || rows <= 0) return false;
    prefix = md + kMdHeaderInts;
    g0 = part_begin(part, T, np);
    g1 = part_begin(part + 1, T, np);
    if (g0 >= g1) return false;
    g = g0;
    int32_t lo = 0, hi = rows - 1;  // last row with prefix[row] <= g0
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) >> 1;
      if (prefix[mid] <= g0) lo = mid; else hi = mid - 1;
    }
    r = lo;
    return true;
  }

  __device__ __forceinline__ bool next(RowWork& w) {
    if (g >= g1) return false;
    const int32_t rb = prefix[r], re = prefix[r + 1];
    const int32_t end = re < g1 ? re : g1;
    w.row = r;
    w.blk_begin = min(g - rb, max_blocks);  // clamped: never past K / 64, whatever the metadata
    w.blk_end = min(end - rb, max_blocks);
    w.split = !(rb >= g0 && re <= g1);
    w.slot = 2 * part + (rb <= g0 ? 0 : 1);  // first row of the part -> 2p, its last row -> 2p+1
    g = end;
    ++r;
    return true;
  }
};

// ---- small device helpers -------------------------------------------------------------------
using selkv::sm90::bf16x2_bits;  // src/sm90/common.cuh (shared with the C7 prefill)

// 4 FP8 E4M3 values (byte i = element i) -> 4 bf16 = bf16(float(e4m3) * scale), bit-exact with
// codec::dequant_e4m3 (e4m3 -> f16 is exact, f16 -> f32 is exact, one fp32 multiply, one RNE).
__device__ __forceinline__ uint2 dequant4(uint32_t w, float scale) {
  const __half2_raw h01 = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3);
  const __half2_raw h23 = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  const float2 f01 = __half22float2(__half2(h01));
  const float2 f23 = __half22float2(__half2(h23));
  return make_uint2(bf16x2_bits(f01.x * scale, f01.y * scale),
                    bf16x2_bits(f23.x * scale, f23.y * scale));
}

// ---- producer warpgroup ---------------------------------------------------------------------
// Token t of a block is handled by warp t % 4; lane j < 16 of warp w owns token w + 4j's index,
// validity and record offset, broadcast to the warp with shuffles. FP8 part: one token per warp
// per step, lane l converts elements [16l, 16l+16). RoPE part: 4 tokens per warp per step, lane
// l copies 16 bytes (8 bf16) of token (lane / 8).
template <bool kDynamic>
__device__ __forceinline__ void run_producer(const DecodeKernelParams& p, SharedStorage& ss,
                                             PartIter it) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  // smem element offsets (per thread, loop invariant): token warp + 4j lives at row group j / 2
  // with in-group row warp + 4 (j % 2); see k_tile_offset.
  int nope_off[2][2];
  CUTE_UNROLL
  for (int par = 0; par < 2; ++par) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) nope_off[par][h] = k_tile_offset(warp + 4 * par, lane * 16 + 8 * h);
  }
  const int rope_off = k_tile_offset(warp + 4 * (lane >> 3), kDimNope + (lane & 7) * 8);
  int buf = 0;
  uint32_t phase = 0;
  RowWork w;
  while (it.next(w)) {
    const int32_t b = w.row / p.seq_q, s = w.row - (w.row / p.seq_q) * p.seq_q;
    const int32_t* idx_row = p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride;
    int32_t len = p.topk;
    if constexpr (kDynamic) {
      len = p.topk_length[b];
      len = len < 0 ? 0 : (len > p.topk ? p.topk : len);
    }
    for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
      cutlass::arch::ClusterBarrier::wait(&ss.bar_empty[buf], phase ^ 1u);

      int64_t off = 0;
      int valid = 0;
      if (lane < 16) {
        const int t = warp + 4 * lane;
        const int32_t k = blk * kBlockN + t;
        bool in_range = true;
        if constexpr (kDynamic) in_range = k < len;  // tail: the index is not even loaded
        if (in_range) {
          const int32_t idx = __ldg(idx_row + k);
          if (idx >= 0 && int64_t(idx) < p.num_slots) {
            valid = 1;
            const uint32_t blk_id = uint32_t(idx) / uint32_t(p.page_size);
            const uint32_t in_page = uint32_t(idx) - blk_id * uint32_t(p.page_size);
            off = int64_t(blk_id) * p.block_stride_bytes +
                  int64_t(in_page) * fmt::kDsMlaRecordBytes;
          }
        }
        ss.kv_valid[buf][t] = uint8_t(valid);
      }

      bf16_t* sk = ss.k[buf];
      const uint8_t* cache = p.cache;

      // FP8 NoPE part: 16 tokens per warp, 4 loads in flight per lane.
      CUTE_UNROLL
      for (int j0 = 0; j0 < 16; j0 += 4) {
        uint4 raw[4];
        float sc[4];
        CUTE_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int64_t o = __shfl_sync(0xffffffffu, off, j0 + u);
          const int v = __shfl_sync(0xffffffffu, valid, j0 + u);
          raw[u] = make_uint4(0, 0, 0, 0);
          sc[u] = 0.f;
          if (v) {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(cache + o + fmt::kNopeOffset + lane * 16));
            sc[u] = __ldg(reinterpret_cast<const float*>(cache + o + fmt::kScaleOffset) + (lane >> 3));
          }
        }
        CUTE_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + u;  // token t = warp + 4 j
          const uint2 a = dequant4(raw[u].x, sc[u]);
          const uint2 bq = dequant4(raw[u].y, sc[u]);
          const uint2 c = dequant4(raw[u].z, sc[u]);
          const uint2 d = dequant4(raw[u].w, sc[u]);
          // Elements [16l, 16l+8) and [16l+8, 16l+16) are two 16-byte chunks, swizzled apart.
          bf16_t* row = sk + (j >> 1) * kKRowGroupStride;
          *reinterpret_cast<uint4*>(row + nope_off[j & 1][0]) = make_uint4(a.x, a.y, bq.x, bq.y);
          *reinterpret_cast<uint4*>(row + nope_off[j & 1][1]) = make_uint4(c.x, c.y, d.x, d.y);
        }
      }
      // RoPE part (bf16, copied as is).
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * i + (lane >> 3);
        const int c = lane & 7;
        const int64_t o = __shfl_sync(0xffffffffu, off, j);
        const int v = __shfl_sync(0xffffffffu, valid, j);
        uint4 data = make_uint4(0, 0, 0, 0);
        if (v) data = __ldg(reinterpret_cast<const uint4*>(cache + o + fmt::kRopeOffset + c * 16));
        // token warp + 4 (4i + lane/8) = (warp + 4 (lane/8)) + 16 i: two row groups per step of i
        *reinterpret_cast<uint4*>(sk + rope_off + 2 * i * kKRowGroupStride) = data;
      }
      // Generic-proxy smem writes -> visible to wgmma (async proxy), then publish.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_full[buf]);
      if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
    }
  }
}

// ---- consumer warpgroups --------------------------------------------------------------------
// Accumulator fragment of wgmma m64nNk16 (f32), value i of thread (warp w, lane l):
//   row = 16 w + l / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
template <int kNumHeads>
__device__ __forceinline__ void run_consumer(const DecodeKernelParams& p, SharedStorage& ss,
                                             PartIter it, int cw /* 0 or 1 */) {
  const int tid_wg = int(threadIdx.x) - 128 * (cw + 1);
  const int tid_c = int(threadIdx.x) - 128;  // 0..255 over both consumers
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;
  const int head_base = int(blockIdx.y) * kBlockM;
  const float sl2 = p.sm_scale_log2;
  constexpr float kNegInf = -INFINITY;

  TiledMmaQK mma_qk;
  TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p), SmemLayoutP{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 36) descriptors
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  static_assert(decltype(size(tOrO))::value == 128);

  int buf = 0;
  uint32_t phase = 0;
  uint32_t iter = 0;
  RowWork w;
  while (it.next(w)) {
    const int32_t b = w.row / p.seq_q, s = w.row - (w.row / p.seq_q) * p.seq_q;

    // Q [64 heads x 576] -> smem (previous row's wgmmas all completed: see the row-sum barrier).
    {
      const uint16_t* qrow = p.q + b * p.q_batch_stride + s * p.q_seq_stride;
      constexpr int kChunksPerHead = kDimQK / 8;  // 72 x 16 bytes
#pragma unroll 1
      for (int c0 = 0; c0 < kBlockM * kChunksPerHead; c0 += kNumConsumerThreads * 6) {
        uint4 v[6];
        CUTE_UNROLL
        for (int u = 0; u < 6; ++u) {
          const int c = c0 + u * kNumConsumerThreads + tid_c;
          const int h = c / kChunksPerHead, cc = c - (c / kChunksPerHead) * kChunksPerHead;
          v[u] = __ldg(reinterpret_cast<const uint4*>(qrow + int64_t(head_base + h) * p.q_head_stride + cc * 8));
        }
        CUTE_UNROLL
        for (int u = 0; u < 6; ++u) {
          const int c = c0 + u * kNumConsumerThreads + tid_c;
          const int h = c / kChunksPerHead, cc = c - (c / kChunksPerHead) * kChunksPerHead;
          *reinterpret_cast<uint4*>(ss.q + k_tile_offset(h, cc * 8)) = v[u];
        }
      }
      static_assert((kBlockM * kChunksPerHead) % (kNumConsumerThreads * 6) == 0);
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kQReady));
    }

    clear(tOrO);
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;

    for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
      cutlass::arch::ClusterBarrier::wait(&ss.bar_full[buf], phase);

      // S = Q K_cw^T over 576 dims, for this consumer's 32 tokens.
      Tensor sKh = make_tensor(make_smem_ptr(ss.k[buf] + cw * kKHalfTokenOffset), SmemLayoutKHalf{});
      Tensor tSrK = thr_qk.partition_fragment_B(sKh);  // (MMA, 1, 36)
      Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kTokensPerConsumer>>{});
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
        cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      // Mask invalid tokens, row maxima, exchange with the other consumer.
      float mx0 = kNegInf, mx1 = kNegInf;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        const int t = cw * kTokensPerConsumer + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
        if (!ss.kv_valid[buf][t]) tSrS(i) = kNegInf;
        if ((i >> 1) & 1) mx1 = fmaxf(mx1, tSrS(i)); else mx0 = fmaxf(mx0, tSrS(i));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const int par = iter & 1;
      if ((lane & 3) == 0) {
        ss.row_max[par][cw][r0] = mx0;
        ss.row_max[par][cw][r1] = mx1;
      }
      cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kMaxExchange));
      mx0 = fmaxf(mx0, ss.row_max[par][cw ^ 1][r0]);
      mx1 = fmaxf(mx1, ss.row_max[par][cw ^ 1][r1]);
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float mu0 = mn0 == kNegInf ? 0.f : mn0;  // nothing valid yet: keep exp2 finite
      const float mu1 = mn1 == kNegInf ? 0.f : mn1;
      const float sc0 = exp2f((m0 - mu0) * sl2), sc1 = exp2f((m1 - mu1) * sl2);
      const float base0 = mu0 * sl2, base1 = mu1 * sl2;
      m0 = mn0;
      m1 = mn1;

      // P = exp2(s * scale_log2 - m * scale_log2) -> bf16 into the shared P tile.
      float ps0 = 0.f, ps1 = 0.f;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        const bool hi = (i >> 1) & 1;
        const float pv = exp2f(fmaf(tSrS(i), sl2, hi ? -base1 : -base0));
        tSrS(i) = pv;
        if (hi) ps1 += pv; else ps0 += pv;
      }
      l0 = l0 * sc0 + ps0;
      l1 = l1 * sc1 + ps1;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); i += 2) {
        const int row = ((i >> 1) & 1) ? r1 : r0;
        const int col = cw * kTokensPerConsumer + 8 * (i >> 2) + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(ss.p + p_tile_offset(row, col)) = bf16x2_bits(tSrS(i), tSrS(i + 1));
      }
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kPReady));

      // O_cw += P V_cw (V = first 512 dims of the same KV tile, read MN-major).
      Tensor sVh = make_tensor(make_smem_ptr(ss.k[buf] + cw * kVHalfDimOffset), SmemLayoutVHalf{});
      Tensor tOrV = thr_pv.partition_fragment_B(sVh);  // (MMA, 1, 4)
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tOrP); ++kb) {
        cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb), tOrO);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);

      cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf]);
      if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
      ++iter;
    }

    // ---- epilogue: total row sums, lse, output ----
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if ((lane & 3) == 0) {
      ss.row_sum[cw][r0] = l0;
      ss.row_sum[cw][r1] = l1;
    }
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kRowSum));
    const float L0 = cw == 0 ? l0 + ss.row_sum[1][r0] : ss.row_sum[0][r0] + l0;
    const float L1 = cw == 0 ? l1 + ss.row_sum[1][r1] : ss.row_sum[0][r1] + l1;
    const bool any0 = L0 > 0.f, any1 = L1 > 0.f;
    const float lse0 = any0 ? m0 * p.sm_scale + logf(L0) : kNegInf;
    const float lse1 = any1 ? m1 * p.sm_scale + logf(L1) : kNegInf;
    float f0 = any0 ? 1.f / L0 : 0.f, f1 = any1 ? 1.f / L1 : 0.f;
    const int h0 = head_base + r0, h1 = head_base + r1;
    const int col0 = cw * kDimVPerConsumer + 2 * (lane & 3);

    if (w.split) {
      float* acc0 = p.accum_out + (int64_t(w.slot) * kNumHeads + h0) * kDimV + col0;
      float* acc1 = p.accum_out + (int64_t(w.slot) * kNumHeads + h1) * kDimV + col0;
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 4) {
        const int c = 8 * (i >> 2);
        *reinterpret_cast<float2*>(acc0 + c) = make_float2(tOrO(i) * f0, tOrO(i + 1) * f0);
        *reinterpret_cast<float2*>(acc1 + c) = make_float2(tOrO(i + 2) * f1, tOrO(i + 3) * f1);
      }
      if (cw == 0 && (lane & 3) == 0) {
        p.accum_lse[int64_t(w.slot) * kNumHeads + h0] = lse0;
        p.accum_lse[int64_t(w.slot) * kNumHeads + h1] = lse1;
      }
    } else {
      if (p.attn_sink != nullptr) {
        if (any0) f0 *= 1.f / (1.f + expf(p.attn_sink[h0] - lse0));
        if (any1) f1 *= 1.f / (1.f + expf(p.attn_sink[h1] - lse1));
      }
      uint16_t* orow = p.out + b * p.out_batch_stride + s * p.out_seq_stride;
      uint16_t* o0 = orow + int64_t(h0) * p.out_head_stride + col0;
      uint16_t* o1 = orow + int64_t(h1) * p.out_head_stride + col0;
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 4) {
        const int c = 8 * (i >> 2);
        *reinterpret_cast<uint32_t*>(o0 + c) = bf16x2_bits(tOrO(i) * f0, tOrO(i + 1) * f0);
        *reinterpret_cast<uint32_t*>(o1 + c) = bf16x2_bits(tOrO(i + 2) * f1, tOrO(i + 3) * f1);
      }
      if (cw == 0 && (lane & 3) == 0) {
        float* lrow = p.lse + b * p.lse_batch_stride + s * p.lse_seq_stride;
        lrow[h0] = lse0;
        lrow[h1] = lse1;
      }
    }
  }
}

// ---- kernel ---------------------------------------------------------------------------------
template <int kNumHeads, bool kDynamic>
__global__ void __launch_bounds__(kNumThreads, 1)
sparse_decode_sm90_kernel(const __grid_constant__ DecodeKernelParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  if ((cute::cast_smem_ptr_to_uint(smem_raw) & 1023u) != 0) __trap();  // swizzle needs 1 KB alignment
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);

  PartIter it;
  if (!it.init(p.metadata, int32_t(blockIdx.x), p.topk / kBlockN)) return;  // uniform

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int i = 0; i < kNumKBufs; ++i) {
      cutlass::arch::ClusterBarrier::init(&ss.bar_full[i], 128);
      cutlass::arch::ClusterBarrier::init(&ss.bar_empty[i], kNumConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    run_producer<kDynamic>(p, ss, it);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    run_consumer<kNumHeads>(p, ss, it, wg - 1);
  }
#else
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) __trap();  // built without sm_90a
#endif
}

// Host launch (explicitly instantiated in instantiations/*.cu).
template <int kNumHeads, bool kDynamic>
cudaError_t launch_sparse_decode_sm90(const DecodeKernelParams& p, cudaStream_t stream) {
  auto kernel = &sparse_decode_sm90_kernel<kNumHeads, kDynamic>;
  constexpr int kSmem = int(sizeof(SharedStorage));
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(p.num_sm_parts, kNumHeads / kBlockM);
  kernel<<<grid, kNumThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace selkv::decode::sm90
