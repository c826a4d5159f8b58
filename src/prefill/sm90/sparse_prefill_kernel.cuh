// SM90 bf16 sparse MLA prefill kernel (C7). Design: docs/prefill-design.md §2.
//
// One CTA = one query token x one 64-head group (grid.x = T * H / 64, the head groups of a token
// adjacent so they share its kv rows in L2). WG0 gathers Q once and then 64 selected kv rows per
// step with cp.async into a double-buffered, 128B-swizzled smem ring (invalid rows zero-filled
// without a global read); completion is signalled on mbarriers by cp.async.mbarrier.arrive.noinc,
// so several steps stay in flight without the producer waiting on its own copies. WG1 and WG2
// consume with wgmma exactly as the C5 decode does: S = Q K^T split by kv rows (32 each), online
// softmax with a row-max exchange, P through smem, O += P V split by d_v (256 each).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cutlass/arch/reg_reconfig.h>

#include "prefill/sm90/config.h"
#include "sm90/common.cuh"

namespace selkv::prefill::sm90 {

using selkv::sm90::bf16x2_bits;
using selkv::sm90::cp_async_16;
using selkv::sm90::kmajor_sw128_offset;

// Entries [0, len) of a row are candidates: K, or clamp(topk_length[t], 0, K).
__device__ __forceinline__ int32_t row_len(const PrefillKernelParams& p, int64_t t) {
  if (p.topk_length == nullptr) return p.topk;
  const int32_t l = __ldg(p.topk_length + t);
  return l < 0 ? 0 : (l > p.topk ? p.topk : l);
}

// ---- producer warpgroup ---------------------------------------------------------------------
// Row r of a tile (a head for Q, a kv row for K) is copied by warp r % 4; lane j < 16 of warp w
// owns row w + 4j's index and validity, broadcast by shuffle. Lane l copies 16-byte chunks l,
// l + 32, l + 64 (< D/8) of the row: each warp-wide cp.async covers 512 contiguous bytes.
template <int kD>
__device__ __forceinline__ void run_producer(const PrefillKernelParams& p,
                                             typename Config<kD>::SharedStorage& ss, int64_t t,
                                             int hg, int32_t len, int32_t nblk) {
  using C = Config<kD>;
  constexpr int kChunkIters = (C::kChunks + 31) / 32;  // 3 (576) or 2 (512)
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

  // Q [64 heads x D] once.
  {
    const uint16_t* qbase = p.q + t * p.q_token_stride + int64_t(hg) * kBlockM * p.q_head_stride;
    const uint32_t sq = cute::cast_smem_ptr_to_uint(ss.q);
    CUTE_UNROLL
    for (int j = 0; j < kBlockM / 4; ++j) {
      const int h = warp + 4 * j;
      const uint16_t* qrow = qbase + int64_t(h) * p.q_head_stride;
      CUTE_UNROLL
      for (int c = 0; c < kChunkIters; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk < C::kChunks)
          cp_async_16(sq + 2u * uint32_t(kmajor_sw128_offset<kD>(h, chunk * 8)), qrow + chunk * 8, true);
      }
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(&ss.bar_q);
  }

  const int32_t* idx_row = p.indices + t * p.indices_token_stride;
  int buf = 0;
  uint32_t phase = 0;
  for (int32_t blk = 0; blk < nblk; ++blk) {
    int64_t off = 0;  // element offset of the row in kv
    int valid = 0;
    if (lane < 16) {
      const int32_t k = blk * kBlockN + warp + 4 * lane;
      if (k < len) {  // past topk_length: not even loaded
        const int32_t idx = __ldg(idx_row + k);
        if (idx >= 0 && int64_t(idx) < p.num_kv) {
          valid = 1;
          off = int64_t(idx) * p.kv_row_stride;
        }
      }
    }
    cutlass::arch::ClusterBarrier::wait(&ss.bar_empty[buf], phase ^ 1u);
    const uint32_t sk = cute::cast_smem_ptr_to_uint(ss.k[buf]);
    CUTE_UNROLL
    for (int j = 0; j < kBlockN / 4; ++j) {
      const int r = warp + 4 * j;
      const int64_t o = __shfl_sync(0xffffffffu, off, j);
      const bool v = __shfl_sync(0xffffffffu, valid, j) != 0;
      const uint16_t* row = p.kv + o;  // o = 0 for invalid rows: never read (src-size 0)
      CUTE_UNROLL
      for (int c = 0; c < kChunkIters; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk < C::kChunks)
          cp_async_16(sk + 2u * uint32_t(kmajor_sw128_offset<kD>(r, chunk * 8)), row + chunk * 8, v);
      }
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(&ss.bar_full[buf]);
    if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
  }
  selkv::sm90::cp_async_wait_all();
}

// ---- consumer warpgroups --------------------------------------------------------------------
template <int kD>
__device__ __forceinline__ void run_consumer(const PrefillKernelParams& p,
                                             typename Config<kD>::SharedStorage& ss, int64_t t,
                                             int hg, int32_t len, int32_t nblk, int cw) {
  using C = Config<kD>;
  const int tid_wg = int(threadIdx.x) - 128 * (cw + 1);
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;
  const float sl2 = p.sm_scale_log2;
  constexpr float kNegInf = -INFINITY;

  typename C::TiledMmaQK mma_qk;
  typename C::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename C::SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p), typename C::SmemLayoutP{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, D/16) descriptors
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  static_assert(decltype(size(tOrO))::value == 128);

  clear(tOrO);
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
  const int32_t* idx_row = p.indices + t * p.indices_token_stride;
  if (nblk > 0) cutlass::arch::ClusterBarrier::wait(&ss.bar_q, 0u);

  int buf = 0;
  uint32_t phase = 0;
  for (int32_t blk = 0; blk < nblk; ++blk) {
    // Validity of this consumer's 32 kv rows (bit i: row 32 cw + i), from the indices (L1-hot:
    // the producer just read them). Same rule as the producer's.
    uint32_t vmask;
    {
      const int32_t k = blk * kBlockN + cw * kTokensPerConsumer + lane;
      bool v = false;
      if (k < len) {
        const int32_t idx = __ldg(idx_row + k);
        v = idx >= 0 && int64_t(idx) < p.num_kv;
      }
      vmask = __ballot_sync(0xffffffffu, v);
    }
    cutlass::arch::ClusterBarrier::wait(&ss.bar_full[buf], phase);
    cutlass::arch::fence_view_async_shared();  // cp.async (generic proxy) data -> wgmma (async proxy)

    // S = Q K_cw^T over D dims, for this consumer's 32 kv rows.
    Tensor sKh = make_tensor(make_smem_ptr(ss.k[buf] + cw * C::kKHalfTokenOffset), typename C::SmemLayoutKHalf{});
    Tensor tSrK = thr_qk.partition_fragment_B(sKh);
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

    // Mask invalid rows, row maxima, exchange with the other consumer.
    float mx0 = kNegInf, mx1 = kNegInf;
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
      if (!((vmask >> col) & 1u)) tSrS(i) = kNegInf;
      if ((i >> 1) & 1) mx1 = fmaxf(mx1, tSrS(i)); else mx0 = fmaxf(mx0, tSrS(i));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const int par = blk & 1;
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
      const int off = row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);  // SmemLayoutP
      *reinterpret_cast<uint32_t*>(ss.p + off) = bf16x2_bits(tSrS(i), tSrS(i + 1));
    }
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kPReady));

    // O_cw += P V_cw (V = first 512 dims of the same kv tile, read MN-major).
    Tensor sVh = make_tensor(make_smem_ptr(ss.k[buf] + cw * C::kVHalfDimOffset), typename C::SmemLayoutVHalf{});
    Tensor tOrV = thr_pv.partition_fragment_B(sVh);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb), tOrO);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);

    cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf]);
    if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
  }

  // ---- epilogue: total row sums, lse, max_logits, output ----
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
  const float f0 = any0 ? 1.f / L0 : 0.f, f1 = any1 ? 1.f / L1 : 0.f;
  const int h0 = hg * kBlockM + r0, h1 = hg * kBlockM + r1;

  // out through smem so that every global store is a full 16-byte, row-contiguous chunk (a warp
  // instruction writes 512 contiguous bytes of one head row). The fragment gives each thread 4-byte
  // pieces of 8 rows x 16 bytes per instruction (16 of 32 bytes per sector used). Staging: each
  // consumer warp owns 16 rows x 256 dv = 8 KB of the Q tile, free here: the kRowSum barrier is
  // passed by both consumer warpgroups only after their last warpgroup_wait<0>, so no wgmma still
  // reads Q, and the producer's only Q writes completed before bar_q (no Q write when nblk == 0).
  // Warp-private region, so __syncwarp orders the stores before the loads. Row rl (0..15) of the
  // region is 512 bytes = 32 16-byte chunks; logical chunk j (dv 8j..8j+7) sits at position
  // j ^ (rl & 7). Store (STS.32): fixed j, lane (rr = lane / 4, q = lane % 4) hits bank
  // 4 * ((j ^ rr) & 7) + q: 32 distinct banks. Load (LDS.128): row rl, lane reads logical chunk
  // lane at position lane ^ (rl & 7); each 8-lane phase covers one aligned 128-byte span: 4
  // wavefronts, the minimum. The values are bit-identical to the direct stores (same
  // bf16x2_bits(tOrO * f) words, only their route differs).
  static_assert(sizeof(ss.q) >= size_t(kNumConsumerThreads / 32) * 16 * kDimVPerConsumer * 2,
                "epilogue staging needs 8 warps x 16 rows x 256 bf16 in the Q tile");
  {
    constexpr int kWarpWords = 16 * kDimVPerConsumer / 2;  // 16 rows x 256 bf16 = 8 KB per warp
    uint32_t* stage = reinterpret_cast<uint32_t*>(ss.q) + (cw * 4 + warp_wg) * kWarpWords;
    const int rr = lane >> 2, q4 = lane & 3;
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); i += 4) {
      const int j = i >> 2;  // 16-byte chunk: dv 8j..8j+7 of this consumer's half
      const int pos = (j ^ rr) * 4 + q4;  // word in row; rows rr and rr + 8 share the swizzle
      stage[rr * 128 + pos] = bf16x2_bits(tOrO(i) * f0, tOrO(i + 1) * f0);
      stage[(rr + 8) * 128 + pos] = bf16x2_bits(tOrO(i + 2) * f1, tOrO(i + 3) * f1);
    }
    __syncwarp();
    uint16_t* obase = p.out + t * p.out_token_stride +
                      int64_t(hg * kBlockM + warp_wg * 16) * p.out_head_stride +
                      cw * kDimVPerConsumer + lane * 8;  // 16 B aligned: out 16 B, strides % 8 (validated)
    CUTE_UNROLL
    for (int rl = 0; rl < 16; ++rl) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + rl * 128 + (lane ^ (rl & 7)) * 4);
      *reinterpret_cast<uint4*>(obase + int64_t(rl) * p.out_head_stride) = v;
    }
  }
  if (cw == 0 && (lane & 3) == 0) {
    if (p.lse != nullptr) {
      float* lrow = p.lse + t * p.lse_token_stride;
      lrow[h0] = any0 ? m0 * p.sm_scale + logf(L0) : kNegInf;
      lrow[h1] = any1 ? m1 * p.sm_scale + logf(L1) : kNegInf;
    }
    if (p.max_logits != nullptr) {
      float* mrow = p.max_logits + t * p.max_logits_token_stride;
      mrow[h0] = any0 ? m0 * p.sm_scale : kNegInf;
      mrow[h1] = any1 ? m1 * p.sm_scale : kNegInf;
    }
  }
}

// ---- kernel ---------------------------------------------------------------------------------
template <int kD>
__global__ void __launch_bounds__(kNumThreads, 1)
sparse_prefill_sm90_kernel(const __grid_constant__ PrefillKernelParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Config<kD>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  if ((cute::cast_smem_ptr_to_uint(smem_raw) & 1023u) != 0) __trap();  // swizzle needs 1 KB alignment
  auto& ss = *reinterpret_cast<typename C::SharedStorage*>(smem_raw);

  const int64_t t = int64_t(blockIdx.x) / p.head_groups;
  const int hg = int(int64_t(blockIdx.x) - t * p.head_groups);
  const int32_t len = row_len(p, t);
  const int32_t nblk = (len + kBlockN - 1) / kBlockN;

  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&ss.bar_q, kNumProducerThreads);
    CUTE_UNROLL
    for (int i = 0; i < kNumKBufs; ++i) {
      cutlass::arch::ClusterBarrier::init(&ss.bar_full[i], kNumProducerThreads);
      cutlass::arch::ClusterBarrier::init(&ss.bar_empty[i], kNumConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (nblk > 0) run_producer<kD>(p, ss, t, hg, len, nblk);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    run_consumer<kD>(p, ss, t, hg, len, nblk, wg - 1);
  }
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) __trap();  // built without sm_90a
#endif
}

// Host launch (explicitly instantiated in instantiations/*.cu).
template <int kD>
cudaError_t launch_sparse_prefill_sm90(const PrefillKernelParams& p, cudaStream_t stream) {
  auto kernel = &sparse_prefill_sm90_kernel<kD>;
  constexpr int kSmem = int(sizeof(typename Config<kD>::SharedStorage));
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const int64_t ctas = p.num_tokens * p.head_groups;
  kernel<<<dim3(unsigned(ctas)), kNumThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace selkv::prefill::sm90
