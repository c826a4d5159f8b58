// SM90 bf16 sparse MLA prefill kernel (C7), the v3 block ping-pong. Design: docs/prefill-design.md §7.
//
// One CTA = one query token x one 64-head group (as v2). kv blocks of 64 selected rows are taken
// in pairs (2i, 2i + 1). WG0 gathers them with cp.async into two slots (slot b = block 2i + b),
// each split into an L half (dims 0-255) and an R half (dims 256-D) with separate full/empty
// mbarriers, so a half is refilled as soon as its last reader is done.
//
// Consumer A (WG1) owns the even block, B (WG2) the odd one. Each computes S = Q K^T for all
// 64 heads x 64 rows of its block (m64n64k16 SS: Q is read once per block) and accumulates O for
// its d_v half (A: 0-255, B: 256-511) from both blocks. Per pair:
//   A: mask, row max, online softmax on its block with the running max -> m_x, arrive MaxA;
//      O_A += P_A V_A[L] (RS wgmma: P straight from the accumulator registers); free slot0.L.
//   B: waits MaxA, folds A's max into its own (m_x), softmax, arrive MaxB; O_B += P_B V_B[R] (RS);
//      P_B -> smem, arrive P1; waits P0, O_B += P_A V_A[R] (SS); frees slot1.R, slot0.R.
//   A: waits MaxB, rebases its P by exp2(m_A - m_B) -> smem (P0), arrive P0, rescales O_A; waits P1,
//      O_A += P_B V_B[L] (SS); issues S of the next pair (L half first) while that runs; frees slot1.L.
// The two warpgroups' softmax phases interleave with the other's tensor work. No atomics, fixed
// order: deterministic. Invalid rows are zero-filled without a global read and masked to -inf.
// An odd number of blocks leaves B without a block in the last pair: it then skips its wgmmas.
//
// Persistent (v4): the grid is at most one CTA per SM and each CTA loops over (token, head group)
// tiles `blockIdx.x + i * gridDim.x`. The kv ring and its barrier phases run on across tiles, and
// the producer loads the next tile's Q as soon as both consumers have retired their last S of the
// current one (q_empty), so Q and the first kv blocks of tile i + 1 land while tile i finishes
// its P V and epilogue. out is written straight from the accumulators (quad transposes, 16-byte
// stores covering 64 contiguous bytes of 8 rows per warp instruction): no smem staging, so the
// Q tile is free for the prefetch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cutlass/arch/reg_reconfig.h>

#include "common/arch.h"

#include "prefill/sm90/config.h"
#include "sm90/common.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/wg_softmax.cuh"

namespace selkv::prefill::sm90 {

using selkv::sm90::bf16x2_bits;

__device__ __forceinline__ int32_t prefill_row_len(const PrefillKernelParams& p, int64_t t) {
  if (p.topk_length == nullptr) return p.topk;
  const int32_t l = __ldg(p.topk_length + t);
  return l < 0 ? 0 : (l > p.topk ? p.topk : l);
}

__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  cutlass::arch::ClusterBarrier::wait(b, parity);
}
__device__ __forceinline__ void nb_sync(Bar b) { selkv::sm90::named_bar_sync<256>(b); }
__device__ __forceinline__ void nb_arrive(Bar b) { selkv::sm90::named_bar_arrive<256>(b); }

// ---- producer -------------------------------------------------------------------------------
// Thread (g = tid / 8, e = tid % 8) copies 16-byte chunk e of every 64-column tile of rows
// g + 16 j (j < 4): 8 threads cover one 128-byte tile row, a warp 4 rows (coalesced 128 B
// segments). Rows g + 16 j share the swizzle phase g & 7.
template <int kD>
__device__ __forceinline__ void run_producer(const PrefillKernelParams& p, typename Config<kD>::SharedStorage& ss) {
  using C = Config<kD>;
  const int tid = int(threadIdx.x);
  const int g = tid >> 3, e = tid & 7;
  const int row_off = g * 64 + ((e ^ (g & 7)) << 3);  // + 1024 j for row g + 16 j
  const uint32_t sq = cute::cast_smem_ptr_to_uint(ss.q);
  // Q is read once: evict-first keeps it from displacing gathered kv rows in L2.
  const uint64_t q_pol = p.l2_hints ? selkv::sm90::l2_policy_evict_first() : selkv::sm90::l2_policy_evict_normal();
  // One copy form for every mode (a per-copy branch doubles the producer's code): the policy
  // register carries the mode. l2_hints == 2 (A/B): kv rows evict-last.
  const uint64_t kv_pol =
      p.l2_hints == 2 ? selkv::sm90::l2_policy_evict_last() : selkv::sm90::l2_policy_evict_normal();
  // Fills so far (across tiles) of Q, slot 0 and slot 1: the barrier parities.
  uint32_t nq = 0, n0 = 0, n1 = 0;

  for (int64_t tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t t = tile / p.head_groups;
    const int hg = int(tile - t * p.head_groups);
    const int32_t len = prefill_row_len(p, t);
    const int32_t nblk = (len + 63) / 64;
    if (nblk == 0) continue;  // the consumers read neither Q nor kv for this tile

    // Q [64 heads x D], once both consumers are done with the previous tile's Q.
    bar_wait(&ss.q_empty, (nq & 1u) ^ 1u);
    {
      const uint16_t* qb = p.q + t * p.q_token_stride + int64_t(hg) * 64 * p.q_head_stride + e * 8;
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        const uint16_t* qrow = qb + int64_t(g + 16 * j) * p.q_head_stride;
        CUTE_UNROLL
        for (int tl = 0; tl < C::kTiles; ++tl)
          selkv::sm90::cp_async_16_hint(sq + 2u * uint32_t(tl * kTileElems + row_off + 1024 * j), qrow + tl * 64,
                                        true, q_pol);
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(&ss.bar_q);
      ++nq;
    }

    const int32_t* idx_row = p.indices + t * p.indices_token_stride;
    const int32_t npairs = (nblk + 1) / 2;
    for (int32_t pr = 0; pr < npairs; ++pr) {
      const bool has1 = 2 * pr + 1 < nblk;
      const uint32_t e0 = ((n0 + uint32_t(pr)) & 1u) ^ 1u, e1 = ((n1 + uint32_t(pr)) & 1u) ^ 1u;
      int64_t off[2][4];
      bool val[2][4];
      CUTE_UNROLL
      for (int b = 0; b < 2; ++b) {
        CUTE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int32_t k = (2 * pr + b) * 64 + g + 16 * j;
          int32_t idx = -1;
          if (k < len) idx = __ldg(idx_row + k);  // k < len <= K; past topk_length: not loaded
          val[b][j] = idx >= 0 && int64_t(idx) < p.num_kv;
          off[b][j] = val[b][j] ? int64_t(idx) * p.kv_row_stride : 0;
        }
      }
      auto copy = [&](int b, int t0, int t1) {
        const uint32_t sk = cute::cast_smem_ptr_to_uint(ss.k[b]);
        CUTE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const uint16_t* row = p.kv + off[b][j] + e * 8;  // invalid: src-size 0, never read
          CUTE_UNROLL
          for (int tl = t0; tl < t1; ++tl) {
            const uint32_t dst = sk + 2u * uint32_t(tl * kTileElems + row_off + 1024 * j);
            selkv::sm90::cp_async_16_pf256_hint(dst, row + tl * 64, val[b][j], kv_pol);
          }
        }
      };
      bar_wait(&ss.empty[0][0], e0);
      copy(0, 0, kTilesL);
      cutlass::arch::cpasync_barrier_arrive_noinc(&ss.full[0][0]);
      if (has1) {
        bar_wait(&ss.empty[1][1], e1);
        copy(1, kTilesL, C::kTiles);
        cutlass::arch::cpasync_barrier_arrive_noinc(&ss.full[1][1]);
      }
      bar_wait(&ss.empty[0][1], e0);
      copy(0, kTilesL, C::kTiles);
      cutlass::arch::cpasync_barrier_arrive_noinc(&ss.full[0][1]);
      if (has1) {
        bar_wait(&ss.empty[1][0], e1);
        copy(1, 0, kTilesL);
        cutlass::arch::cpasync_barrier_arrive_noinc(&ss.full[1][0]);
      }
    }
    n0 += uint32_t(npairs);
    n1 += uint32_t(nblk / 2);
  }
  selkv::sm90::cp_async_wait_all();
}

// ---- consumers ------------------------------------------------------------------------------
template <int kD, int kC>
__device__ __forceinline__ void run_consumer(const PrefillKernelParams& p, typename Config<kD>::SharedStorage& ss) {
  using C = Config<kD>;
  constexpr bool kA = kC == 0;
  const int tid = int(threadIdx.x) - 128 * (kC + 1);
  const int warp = tid / 32, lane = tid % 32;
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
  const float sl2 = p.sm_scale_log2;
  constexpr float kNegInf = -INFINITY;

  typename C::TiledMmaQK mma_qk;
  typename C::TiledMmaPVrs mma_rs;
  typename C::TiledMmaPVss mma_ss;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_rs = mma_rs.get_thread_slice(tid);
  auto thr_ss = mma_ss.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename C::SmemLayoutQK{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k[kC]), typename C::SmemLayoutQK{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, D/16)
  Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, 1, D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<64>>{});
  static_assert(decltype(size(tSrS))::value == 32);

  // O half: d_v [256 kC, 256 kC + 256) = tiles 4 kC .. 4 kC + 3 of both slots.
  Tensor sVown = make_tensor(make_smem_ptr(ss.k[kC] + kC * kTilesL * kTileElems), typename C::SmemLayoutVHalf{});
  Tensor sVoth = make_tensor(make_smem_ptr(ss.k[kC ^ 1] + kC * kTilesL * kTileElems), typename C::SmemLayoutVHalf{});
  Tensor tOrVown = thr_rs.partition_fragment_B(sVown);  // (MMA, 1, 4)
  Tensor tOrVoth = thr_ss.partition_fragment_B(sVoth);
  bf16_t* p_mine = kA ? C::p0_ptr(ss) : ss.p1;   // where this consumer publishes its P
  bf16_t* p_other = kA ? ss.p1 : C::p0_ptr(ss);  // where the other consumer's P is
  Tensor sPoth = make_tensor(make_smem_ptr(p_other), typename C::SmemLayoutP{});
  Tensor tOrPoth = thr_ss.partition_fragment_A(sPoth);  // (MMA, 1, 4) descriptors
  Tensor tOrP = make_tensor<bf16_t>(partition_shape_A(mma_rs, Shape<Int<64>, Int<64>>{}));  // own P (A regs)
  Tensor tOrPw = recast<uint32_t>(tOrP);
  static_assert(decltype(size(tOrPw))::value == 16);
  Tensor tOrO = partition_fragment_C(mma_rs, Shape<Int<64>, Int<256>>{});
  static_assert(decltype(size(tOrO))::value == 128);
  uint32_t* p_mine_words = reinterpret_cast<uint32_t*>(p_mine);
  // O += P V over this consumer's d_v half, committed, not waited: from its own P in registers
  // (RS) or from the other consumer's P tile in smem (SS).
  auto issue_pv_own = [&] {
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < 4; ++kb) cute::gemm(mma_rs, tOrP(_, _, kb), tOrVown(_, _, kb), tOrO);
    warpgroup_commit_batch();
  };
  auto issue_pv_other = [&] {
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < 4; ++kb) cute::gemm(mma_ss, tOrPoth(_, _, kb), tOrVoth(_, _, kb), tOrO);
    warpgroup_commit_batch();
  };

  // S for this consumer's block of a pair: halves in arrival order (A: L then R, B: R then L).
  auto issue_s_half = [&](int half, uint32_t parity, bool first) {
    bar_wait(&ss.full[kC][half], parity);
    // cp.async (generic proxy) -> wgmma (async proxy). Required by the memory model, and it costs
    // nothing measurable (docs/perf-log.md: prefill proxy fence).
    cutlass::arch::fence_view_async_shared();
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    if (first) mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    if (half == 0) {
      CUTE_UNROLL
      for (int kb = 0; kb < kTilesL * 4; ++kb) {
        cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
    } else {
      CUTE_UNROLL
      for (int kb = kTilesL * 4; kb < C::kTiles * 4; ++kb) {
        cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
    }
  };
  // This consumer will issue no more S of the tile (its last one retired): Q may be refilled.
  auto release_q = [&] { cutlass::arch::ClusterBarrier::arrive(&ss.q_empty); };

  // Fills so far (across tiles) of Q, slot 0 and slot 1, as the producer counts them.
  uint32_t nq = 0, n0 = 0, n1 = 0, it = 0;
  for (int64_t tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x, ++it) {
    const int64_t t = tile / p.head_groups;
    const int hg = int(tile - t * p.head_groups);
    const int32_t len = prefill_row_len(p, t);
    const int32_t nblk = (len + 63) / 64;
    const int32_t npairs = (nblk + 1) / 2;
    const int32_t nodd = nblk / 2;  // pairs with an odd block (all but possibly the last)
    const int32_t* idx_row = p.indices + t * p.indices_token_stride;

    clear(tOrO);
    selkv::sm90::OnlineSoftmax2 sm;
    uint64_t vmask = 0;
    if (npairs > 0) {
      cutlass::arch::ClusterBarrier::wait(&ss.bar_q, nq & 1u);
      if constexpr (kA) {
        issue_s_half(0, n0 & 1u, true);
        issue_s_half(1, n0 & 1u, false);
        warpgroup_commit_batch();
        // The mask's index loads run under the S (issued first: they are not on its path).
        vmask = selkv::sm90::row_valid_mask64(idx_row, 0, len, p.num_kv, lane);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        if (npairs == 1) release_q();
      } else {
        if (nodd == 0) release_q();  // B has no block in this tile
      }
    }

    for (int32_t pr = 0; pr < npairs; ++pr) {
      const bool has1 = 2 * pr + 1 < nblk;
      if constexpr (kA) {
        // ---- A: softmax on the even block (S already in tSrS) ----
        const float2 mx = sm.rowmax(tSrS, vmask, lane);
        const float mn0 = fmaxf(sm.m0, mx.x), mn1 = fmaxf(sm.m1, mx.y);
        const float2 sc = sm.advance(tSrS, sl2, mn0, mn1);
        const float sc0 = sc.x, sc1 = sc.y;
        selkv::sm90::pack_bf16_pairs64(tSrS, tOrPw);
        if ((lane & 3) == 0) {
          ss.m_x[r0] = mn0;
          ss.m_x[r1] = mn1;
        }
        nb_arrive(Bar::kMaxA);
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;

        // O_A += P_A V_A[L]
        issue_pv_own();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        cutlass::arch::ClusterBarrier::arrive(&ss.empty[0][0]);

        // B's max -> rebase P_A for B, rescale O_A.
        nb_sync(Bar::kMaxB);
        const float mb0 = ss.m_x[r0], mb1 = ss.m_x[r1];
        const float mub0 = mb0 == kNegInf ? 0.f : mb0, mub1 = mb1 == kNegInf ? 0.f : mb1;
        const float f0 = mn0 == kNegInf ? 0.f : selkv::sm90::exp2_ftz((mn0 - mub0) * sl2);
        const float f1 = mn1 == kNegInf ? 0.f : selkv::sm90::exp2_ftz((mn1 - mub1) * sl2);
        selkv::sm90::pack_bf16_pairs64_scaled(tSrS, f0, f1, tOrPw);
        selkv::sm90::store_p_tile64(p_mine_words, tOrPw, r0, lane);
        cutlass::arch::fence_view_async_shared();
        nb_arrive(Bar::kP0);
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? f1 : f0;
        sm.l0 *= f0;
        sm.l1 *= f1;
        sm.m0 = mb0;
        sm.m1 = mb1;

        // O_A += P_B V_B[L]
        if (has1) {
          nb_sync(Bar::kP1);
          issue_pv_other();
        }
        if (pr + 1 < npairs) {
          // S of the next even block: L half overlaps the P V above.
          const uint32_t par = (n0 + uint32_t(pr) + 1u) & 1u;
          issue_s_half(0, par, true);
          warpgroup_commit_batch();
          vmask = selkv::sm90::row_valid_mask64(idx_row, (2 * pr + 2) * 64, len, p.num_kv, lane);
          warpgroup_wait<1>();  // P_B V_B[L] done (has1 is true here: only the last pair can lack it)
          warpgroup_fence_operand(tOrO);
          cutlass::arch::ClusterBarrier::arrive(&ss.empty[1][0]);
          issue_s_half(1, par, false);
          warpgroup_commit_batch();
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          if (pr + 2 == npairs) release_q();  // that was the tile's last even block
        } else {
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          if (has1) cutlass::arch::ClusterBarrier::arrive(&ss.empty[1][0]);
        }
      } else {
        // ---- B: S on the odd block ----
        if (has1) {
          const uint32_t par = (n1 + uint32_t(pr)) & 1u;
          issue_s_half(1, par, true);
          issue_s_half(0, par, false);
          warpgroup_commit_batch();
          vmask = selkv::sm90::row_valid_mask64(idx_row, (2 * pr + 1) * 64, len, p.num_kv, lane);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          if (pr + 1 == nodd) release_q();  // the tile's last odd block
        } else {
          vmask = 0;  // no odd block: every column -inf, P = 0
        }
        const float2 mx = sm.rowmax(tSrS, vmask, lane);
        nb_sync(Bar::kMaxA);
        const float ma0 = ss.m_x[r0], ma1 = ss.m_x[r1];
        const float mn0 = fmaxf(ma0, mx.x), mn1 = fmaxf(ma1, mx.y);  // ma >= m (A folded the running max)
        __syncwarp();
        if ((lane & 3) == 0) {
          ss.m_x[r0] = mn0;
          ss.m_x[r1] = mn1;
        }
        nb_arrive(Bar::kMaxB);
        const float2 sc = sm.advance(tSrS, sl2, mn0, mn1);
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc.y : sc.x;
        if (has1) {
          // O_B += P_B V_B[R]; publish P_B for A.
          selkv::sm90::pack_bf16_pairs64(tSrS, tOrPw);
          issue_pv_own();
          selkv::sm90::store_p_tile64(p_mine_words, tOrPw, r0, lane);
        }
        // O_B += P_A V_A[R]
        nb_sync(Bar::kP0);
        issue_pv_other();
        if (has1) {
          cutlass::arch::fence_view_async_shared();
          nb_arrive(Bar::kP1);
          warpgroup_wait<1>();
          warpgroup_fence_operand(tOrP);
          cutlass::arch::ClusterBarrier::arrive(&ss.empty[1][1]);
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        cutlass::arch::ClusterBarrier::arrive(&ss.empty[0][1]);
      }
    }

    // ---- epilogue: total row sums, lse, max_logits, output ----
    // l_x alternates by tile: after this tile's kLSum a consumer may reach the next tile's write
    // while the other still reads this one's.
    const int lb = int(it & 1u);
    sm.finish();
    if ((lane & 3) == 0) {
      ss.l_x[lb][kC][r0] = sm.l0;
      ss.l_x[lb][kC][r1] = sm.l1;
    }
    nb_sync(Bar::kLSum);
    const float L0 = ss.l_x[lb][0][r0] + ss.l_x[lb][1][r0];
    const float L1 = ss.l_x[lb][0][r1] + ss.l_x[lb][1][r1];
    // An empty row gives out 0, lse and max_logits -inf; a NaN that reached the softmax makes the
    // row's out, lse and max_logits NaN (never an empty row, DESIGN §2).
    const selkv::sm90::RowResult2 rr = selkv::sm90::row_results<false>(sm.m0, L0, sm.m1, L1, p.sm_scale);
    const bool any0 = rr.any0, any1 = rr.any1;
    float f0 = rr.f0, f1 = rr.f1;
    const int h0 = hg * 64 + r0, h1 = hg * 64 + r1;
    const float lse0 = rr.lse0, lse1 = rr.lse1;
    if (p.attn_sink != nullptr) {
      if (any0) f0 *= selkv::sm90::sink_scale(__ldg(p.attn_sink + h0), lse0);
      if (any1) f1 *= selkv::sm90::sink_scale(__ldg(p.attn_sink + h1), lse1);
    }

    // out from the accumulators, whole-sector 16-byte stores (store_o_rows256).
    {
      const int q4 = lane & 3;
      uint16_t* o0 = p.out + t * p.out_token_stride + int64_t(h0) * p.out_head_stride + kC * 256 + q4 * 8;
      uint16_t* o1 = o0 + 8 * p.out_head_stride;
      // out is written once: evict-first so the stream does not displace gathered kv rows in L2.
      const uint64_t pol = p.l2_hints ? selkv::sm90::l2_policy_evict_first() : selkv::sm90::l2_policy_evict_normal();
      selkv::sm90::store_o_rows256(
          tOrO, f0, f1, q4, o0, o1, [](float x, float y, float f) { return bf16x2_bits(x * f, y * f); },
          [pol](uint16_t* d, uint4 v) { selkv::sm90::st_global_16_hint(d, v, pol); });
    }
    if (kA && (lane & 3) == 0) {
      if (p.lse != nullptr) {
        float* lrow = p.lse + t * p.lse_token_stride;
        lrow[h0] = lse0;
        lrow[h1] = lse1;
      }
      if (p.max_logits != nullptr) {
        float* mrow = p.max_logits + t * p.max_logits_token_stride;
        mrow[h0] = any0 ? (L0 != L0 ? L0 : sm.m0 * p.sm_scale) : kNegInf;
        mrow[h1] = any1 ? (L1 != L1 ? L1 : sm.m1 * p.sm_scale) : kNegInf;
      }
    }
    n0 += uint32_t(npairs);
    n1 += uint32_t(nodd);
    if (npairs > 0) ++nq;
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

  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&ss.bar_q, 128);
    cutlass::arch::ClusterBarrier::init(&ss.q_empty, 256);
    CUTE_UNROLL
    for (int b = 0; b < 2; ++b)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        cutlass::arch::ClusterBarrier::init(&ss.full[b][h], 128);
        cutlass::arch::ClusterBarrier::init(&ss.empty[b][h], 128);
      }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    run_producer<kD>(p, ss);
  } else if (wg == 1) {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    run_consumer<kD, 0>(p, ss);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    run_consumer<kD, 1>(p, ss);
  }
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) __trap();  // built without sm_90a
#endif
}

template <int kD>
cudaError_t launch_sparse_prefill_sm90(const PrefillKernelParams& p, int64_t grid, cudaStream_t stream) {
  auto kernel = &sparse_prefill_sm90_kernel<kD>;
  constexpr int kSmem = int(sizeof(typename Config<kD>::SharedStorage));
  cudaError_t err = selkv::detail::set_max_dynamic_smem_once<&sparse_prefill_sm90_kernel<kD>>(kSmem);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(unsigned(grid)), kNumThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace selkv::prefill::sm90
