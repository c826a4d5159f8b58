// Block ping-pong consumers of the SM90 decode (SELKV_DECODE_PINGPONG=1; UNMEASURED alternative to
// consumer.cuh's softmax WG + PV WG split; docs/decode-design.md §4 item 2).
//
// The blocks of a row are taken in pairs (2j, 2j + 1). Consumer A (WG1) owns the even block, B
// (WG2) the odd one: each computes S = Q K^T for all 64 heads x 64 tokens of its block, so both
// warpgroups issue S (the PV WG of the split idles most of a block). Per pair:
//   A: S_A -> masked row max, folded into the running max -> smem, arrive MaxA; sync MaxB.
//   B: S_B -> masked row max; sync MaxA; fold A's -> the pair max -> smem, arrive MaxB.
//   both: P = exp2(s * scale - pair max) (one max per pair, no rebase), O and l rescaled once;
//   own P in registers for O_half += P_own V_own[half] (RS wgmma), and published for the other
//   consumer over the RoPE columns of its own K tile (read only by its own S, done by then);
//   O_half += P_other V_other[half] (SS wgmma).
// A owns d_v [0, 256), B [256, 512); row sums are per consumer and added at the row end. The K
// ring, the producer, the H = 128 crossover, the Q load and the epilogue (store_row) are the
// split's. Each consumer warp releases each slot once (8 arrivals per CTA, as the split).
// A row with an odd block count in the part leaves B without a block in its last pair: B then
// skips its S and RS P V (its P is all zero) and still runs the exchange and the SS P V.
#pragma once

#include <cutlass/arch/barrier.h>

#include "decode/sm90/config.h"
#include "decode/sm90/consumer.cuh"
#include "decode/sm90/part_iter.cuh"
#include "sm90/common.cuh"
#include "sm90/wg_softmax.cuh"

namespace selkv::decode::sm90 {

// Own P (bf16x2 words of an m64n64 accumulator fragment, rows r0 / r0 + 8) into the RoPE columns
// of a K tile (p_in_k_offset). Conflict-free: the 32 lanes of one store cover 8 rows x 4 words of
// one 16-byte chunk column, at banks 4 * ((chunk ^ row) & 7) + lane % 4.
template <class FragW>
__device__ __forceinline__ void store_p_in_k(bf16_t* ktile, const FragW& w, int r0, int lane) {
  CUTE_UNROLL
  for (int j = 0; j < 16; ++j) {
    const int row = (j & 1) ? r0 + 8 : r0;
    const int col = 8 * (j >> 1) + 2 * (lane & 3);
    *reinterpret_cast<uint32_t*>(ktile + p_in_k_offset(row, col)) = w(j);
  }
}

__device__ __forceinline__ void pp_sync(PpBar b) {
  cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(b));
}
__device__ __forceinline__ void pp_arrive(PpBar b) {
  cutlass::arch::NamedBarrier::arrive(kNumConsumerThreads, uint32_t(b));
}

// kC = 0: consumer A (WG1, even blocks, d_v [0, 256)); kC = 1: consumer B (WG2, odd, [256, 512)).
template <int kNumHeads, int kC, bool kF16Partials, class Iter>
__device__ __forceinline__ void run_pingpong_consumer(const DecodeKernelParams& p, SharedStorage& ss, Iter it) {
  constexpr bool kA = kC == 0;
  const int tid_wg = int(threadIdx.x) - 128 * (kC + 1);
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;
  const float sl2 = p.sm_scale_log2;
  constexpr float kNegInf = -INFINITY;
  constexpr int kVOff = kC * kVHalfDimOffset;  // this consumer's d_v half inside a K tile

  TiledMmaQK mma_qk;
  TiledMmaPVrs mma_rs;
  TiledMmaPV mma_ss;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_rs = mma_rs.get_thread_slice(tid_wg);
  auto thr_ss = mma_ss.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 36) descriptors
  Tensor tOrO = partition_fragment_C(mma_rs, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  Tensor tOrP = make_tensor<bf16_t>(partition_shape_A(mma_rs, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tOrPw = recast<uint32_t>(tOrP);
  static_assert(decltype(size(tOrO))::value == 128);
  static_assert(decltype(size(tOrPw))::value == 16);

  // The other consumer's P, over the RoPE columns of its block's slot (SS A operand).
  auto other_p = [&](int buf) {
    Tensor sP = make_tensor(make_smem_ptr(ss.k[buf] + kRopeColOffset), SmemLayoutPInK{});
    return thr_ss.partition_fragment_A(sP);  // (MMA, 1, 4) descriptors
  };
  auto rescale_o = [&](float f0, float f1) {
    // Warp-uniform skip once the running maxima settle (a factor of exactly 1: same bits).
    if (__any_sync(0xffffffffu, f0 != 1.f || f1 != 1.f)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? f1 : f0;
    }
  };

  uint32_t seq = 0;  // blocks consumed so far: slot seq % 2, phase (seq / 2) % 2 (part's block order)
  RowWork w;
  while (it.next(w)) {
    load_q_tile(p, ss, w);
    clear(tOrO);
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
    const int32_t nblk = w.blk_end - w.blk_begin;
    for (int32_t j = 0; j < nblk; j += 2) {
      static_assert(kNumKBufs == 2, "slot / phase of a block from its sequence number");
      const bool has_b = j + 1 < nblk;
      const bool mine = kA || has_b;  // B has no block in a row's odd last pair
      const uint32_t seq_own = kA ? seq : seq + 1;
      const int own = int(seq_own & 1u), other = own ^ 1;  // A's and B's blocks are consecutive
      seq += has_b ? 2u : 1u;

      Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
      uint64_t valid = 0;  // no block: every column -inf, P = 0
      if (mine) {
        wait_kv_tile<kNumHeads>(ss, own, (seq_own >> 1) & 1u);
        issue_s_gemm(mma_qk, thr_qk, tSrQ, ss.k[own], tSrS);
        valid = *reinterpret_cast<const uint64_t*>(ss.kv_valid_bits[own]);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
      }
      float mx0, mx1;
      selkv::sm90::wg_mask_rowmax64(tSrS, valid, lane, mx0, mx1);
      // Pair max: A folds the running max into its block's and hands it to B, B adds its block's.
      float mn0, mn1;
      if constexpr (kA) {
        mn0 = fmaxf(m0, mx0);
        mn1 = fmaxf(m1, mx1);
        if ((lane & 3) == 0) {
          ss.m_x[r0] = mn0;
          ss.m_x[r1] = mn1;
        }
        pp_arrive(PpBar::kMaxA);
        pp_sync(PpBar::kMaxB);
        mn0 = ss.m_x[r0];
        mn1 = ss.m_x[r1];
      } else {
        pp_sync(PpBar::kMaxA);
        mn0 = fmaxf(ss.m_x[r0], mx0);  // A's value already holds the running max
        mn1 = fmaxf(ss.m_x[r1], mx1);
        __syncwarp();  // every lane has read m_x before lane 4q overwrites its rows
        if ((lane & 3) == 0) {
          ss.m_x[r0] = mn0;
          ss.m_x[r1] = mn1;
        }
        pp_arrive(PpBar::kMaxB);
      }
      const float2 sc = selkv::sm90::wg_online_softmax64(tSrS, sl2, m0, m1, mn0, mn1, l0, l1);
      m0 = mn0;
      m1 = mn1;
      rescale_o(sc.x, sc.y);

      if (mine) {
        selkv::sm90::pack_bf16_pairs64(tSrS, tOrPw);
        issue_pv_gemm(mma_rs, thr_rs, tOrP, ss.k[own] + kVOff, tOrO);  // O += P_own V_own[half]
        store_p_in_k(ss.k[own], tOrPw, r0, lane);  // reads the RS operand registers: allowed
        cutlass::arch::fence_view_async_shared();   // generic stores -> the other's SS wgmma
        pp_arrive(kA ? PpBar::kP0 : PpBar::kP1);
      }
      const bool theirs = kA ? has_b : true;  // A has an odd block to read only when B has one
      if (theirs) {
        pp_sync(kA ? PpBar::kP1 : PpBar::kP0);
        issue_pv_gemm(mma_ss, thr_ss, other_p(other), ss.k[other] + kVOff, tOrO);  // O += P_other V_other[half]
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      if (mine) release_kv_tile<kNumHeads>(ss, own, lane);
      if (theirs) release_kv_tile<kNumHeads>(ss, other, lane);
    }

    // Row end: the total row sums (both consumers' blocks, same final max) -> lse, out.
    l0 = selkv::sm90::quad_sum(l0);
    l1 = selkv::sm90::quad_sum(l1);
    if ((lane & 3) == 0) {
      ss.l_x[kC][r0] = l0;
      ss.l_x[kC][r1] = l1;
    }
    // Also orders every wgmma of this row (both consumers waited) before the next row's Q load;
    // l_x is rewritten only after the next row's kQReady, which both reach after this read.
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kRowSum));
    const RowStats st{m0, m1, ss.l_x[0][r0] + ss.l_x[1][r0], ss.l_x[0][r1] + ss.l_x[1][r1]};
    store_row<kNumHeads, kF16Partials>(p, w, kC, lane, r0, r1, st, tOrO);
  }
}

}  // namespace selkv::decode::sm90
