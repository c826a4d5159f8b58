// Consumer warpgroups of the SM90 decode: the softmax WG (S, online softmax, P, O[:, 0:256]) and
// the PV WG (O[:, 256:512]); row epilogue (docs/decode-design.md §2).
#pragma once

#include <cutlass/arch/barrier.h>

#include "decode/partial_scale.h"
#include "decode/sm90/config.h"
#include "decode/sm90/part_iter.cuh"
#include "decode/sm90/primitives.cuh"
#include "decode/sm90/timeline.cuh"
#include "packed/packed_layout.h"
#include "sm90/common.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/wg_softmax.cuh"

namespace selkv::decode::sm90 {

// ---- consumer warpgroups --------------------------------------------------------------------
// v4 split (FlashMLA's public SM90 design, written our own way): WG1 ("softmax WG") computes
// S = Q K^T for all 64 tokens of a block (wgmma m64n64k16: Q is read from smem once per block,
// not once per consumer), owns the whole online softmax (no row-max exchange), keeps P in
// registers as the A operand of its O_0 += P V_0 (RS wgmma, d_v [0, 256)) and publishes P (bf16
// tile) and the per-row rescale factor to WG2 ("PV WG"), which only does O_1 = O_1 * scale +
// P V_1 (SS wgmma, d_v [256, 512)). WG2's PV of block i overlaps WG1's S of block i + 1.
//
// Accumulator fragment of wgmma m64nNk16 (f32), value i of thread (warp w, lane l):
//   row = 16 w + l / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
// The A-operand register fragment of m64n256k16 (RS) for k-block kb holds, in the same order,
// accumulator values [8 kb, 8 kb + 8) of S, so P goes to registers with a flat copy.

// Named barriers among the 256 threads of the two consumer warpgroups.
__device__ __forceinline__ void consumers_sync(NamedBar b) { selkv::sm90::named_bar_sync<kNumConsumerThreads>(b); }
__device__ __forceinline__ void consumers_arrive(NamedBar b) { selkv::sm90::named_bar_arrive<kNumConsumerThreads>(b); }

// Shared per-row state of the epilogue (both consumer warpgroups of one row).
struct RowStats {
  float m0, m1, l0, l1;
};

// Warp scope: the warp's 16 accumulator rows, packed by `pack`, into its staging area at `stage`.
// stmatrix k writes column chunks 2k and 2k + 1 of both row halves: matrix m = (half m & 1, chunk
// 2k + (m >> 1)), accumulator values 8k + 2m and 8k + 2m + 1.
template <typename TensorO, typename Pack>
__device__ __forceinline__ void stage_rows16(uint32_t stage, int lane, const TensorO& tOrO, Pack pack) {
  const int m = lane >> 3, j = 8 * (m & 1) + (lane & 7);
  // Chunk 2k + (m >> 1) = 8 (k / 4) + 2 (k % 4) + (m >> 1), and the swizzle flips only its low 3
  // bits: four row addresses, then immediates.
  uint32_t row_addr[4];
  CUTE_UNROLL
  for (int b = 0; b < 4; ++b) row_addr[b] = stage + uint32_t(stage_row_offset(j, 2 * b + (m >> 1)));
  CUTE_UNROLL
  for (int k = 0; k < 16; ++k) {
    const int i = 8 * k;
    stsm_x4(row_addr[k % 4] + uint32_t(128 * (k / 4)), pack(tOrO(i), tOrO(i + 1)), pack(tOrO(i + 2), tOrO(i + 3)),
            pack(tOrO(i + 4), tOrO(i + 5)), pack(tOrO(i + 6), tOrO(i + 7)));
  }
}

// fp16 partial of rows r0, r1 (unnormalized O, so the 128 multiplies by 1 / sum are not in the
// epilogue: the inverse scale carries them, decode/partial_scale.h) staged by warp scope. Returns
// the inverse scales: `f` as is where a row's |max| rounds into [2^-13, 65504] (or the row is
// empty); otherwise the warp scales by f16_partial_scale first (rare: data far from unit scale).
// Why: the epilogue's code is fetched cold at a launch's end, and this path is ~160 instructions
// shorter than an abs-max pass and a scaling pass in fp32 (docs/perf-log.md: short split epilogue).
// The max is taken from a first packing (3-input fp16 max, VHMNMX), which leaves O intact, so
// the values die as they are staged (no spills).
template <typename TensorO>
__device__ __forceinline__ float2 stage_f16_partial(uint32_t stage, int lane, TensorO& tOrO, bool any0, bool any1,
                                                    float f0, float f1) {
  auto as_h2 = [](uint32_t u) { return *reinterpret_cast<const __half2*>(&u); };
  auto as_u32 = [](__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); };
  __half2 mx0 = __float2half2_rn(0.f), mx1 = mx0;  // |max| of the fp16 values, two lanes each
  CUTE_UNROLL
  for (int i = 0; i < size(tOrO); i += 8) {  // one VHMNMX per row and 4 values
    mx0 = __hmax2(mx0, __hmax2(__habs2(as_h2(f16x2_bits(tOrO(i), tOrO(i + 1)))),
                               __habs2(as_h2(f16x2_bits(tOrO(i + 4), tOrO(i + 5))))));
    mx1 = __hmax2(mx1, __hmax2(__habs2(as_h2(f16x2_bits(tOrO(i + 2), tOrO(i + 3)))),
                               __habs2(as_h2(f16x2_bits(tOrO(i + 6), tOrO(i + 7))))));
  }
  __half2 mx = __hmax2(__lows2half2(mx0, mx1), __highs2half2(mx0, mx1));  // (row r0, row r1)
  mx = __hmax2(mx, as_h2(__shfl_xor_sync(0xffffffffu, as_u32(mx), 1)));
  mx = __hmax2(mx, as_h2(__shfl_xor_sync(0xffffffffu, as_u32(mx), 2)));
  const uint32_t mb = as_u32(mx);
  // fp16 bits of 2^-13 and +inf: below, values near fp16's subnormals lose bits; at inf, overflow.
  auto fits = [](uint32_t h) { return h >= 0x0800u && h < 0x7c00u; };
  const bool ok = (!any0 || fits(mb & 0xffffu)) && (!any1 || fits(mb >> 16));
  float2 inv = make_float2(f0, f1);
  if (__any_sync(0xffffffffu, !ok)) [[unlikely]] {
    float m0 = 0.f, m1 = 0.f;
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); i += 4) {
      m0 = fmaxf(m0, fmaxf(fabsf(tOrO(i)), fabsf(tOrO(i + 1))));
      m1 = fmaxf(m1, fmaxf(fabsf(tOrO(i + 2)), fabsf(tOrO(i + 3))));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    const PartialScale s0 = f16_partial_scale(m0), s1 = f16_partial_scale(m1);
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? s1.scale : s0.scale;
    inv = make_float2(s0.inv * f0, s1.inv * f1);
  }
  stage_rows16(stage, lane, tOrO, [](float a, float b) { return f16x2_bits(a, b); });
  return inv;
}

// Epilogue of one row for consumer `cw` (owns d_v [256 cw, 256 cw + 256)): bf16 out + lse
// (unsplit, normalized) or the partial + partial lse (split: fp16 O with its inverse scale when
// kF16Partials, else normalized fp32).
template <int kNumHeads, bool kF16Partials, typename TensorO>
__device__ __forceinline__ void store_row(const DecodeKernelParams& p, const RowWork& w, uint32_t stage_base, int cw,
                                          int lane, int r0, int r1, const RowStats& st, TensorO& tOrO) {
  const auto [b, s] = row_coord(w.row, p.batch);
  const int head_base = int(blockIdx.x) * kBlockM;
  // An empty row gives out 0 and lse -inf (the final lse: p.empty_lse, below); a NaN that reached
  // the softmax keeps the row NaN (DESIGN §2).
  const selkv::sm90::RowResult2 rr = selkv::sm90::row_results</*kLseFirst=*/true, /*kFastMath=*/true>(
      st.m0, st.l0, st.m1, st.l1, p.sm_scale);
  const bool any0 = rr.any0, any1 = rr.any1;
  const float lse0 = rr.lse0, lse1 = rr.lse1;
  float f0 = rr.f0, f1 = rr.f1;
  const int h0 = head_base + r0, h1 = head_base + r1;
  // Lane q of a quad holds word q (columns 2q, 2q + 1) of every 8-column chunk of rows r0 and r1.
  const int q4 = lane & 3;
  if (w.split) {
    if constexpr (!kF16Partials) {
      // fp32 partial: 8-byte stores of the accumulator pairs. The fp32 epilogue is bound by the
      // write bandwidth of all CTAs finishing at once; a head-pair layout with 16-byte stores was
      // slower (docs/perf-log.md: decode fp32 partial stores).
      float* slot = p.accum_out + int64_t(w.slot) * partial_slot_elems(kNumHeads, false) + cw * kDimVPerConsumer + 2 * q4;
      float* acc0 = slot + h0 * kDimV;
      float* acc1 = slot + h1 * kDimV;
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 4) {
        const int c = 8 * (i >> 2);
        *reinterpret_cast<float2*>(acc0 + c) = make_float2(tOrO(i) * f0, tOrO(i + 1) * f0);
        *reinterpret_cast<float2*>(acc1 + c) = make_float2(tOrO(i + 2) * f1, tOrO(i + 3) * f1);
      }
    }
    if (cw == 0 && (lane & 3) == 0) {
      p.accum_lse[int64_t(w.slot) * kNumHeads + h0] = lse0;
      p.accum_lse[int64_t(w.slot) * kNumHeads + h1] = lse1;
    }
  }
  SELKV_TL(const bool tl_lead = (r0 | (lane & 3)) == 0;)  // lane 0 of the WG's first warp
  SELKV_TL(if (tl_lead) tl_stamp(12 + 3 * cw);)
  if (kF16Partials || !w.split) {
    if (!w.split && p.attn_sink != nullptr) {
      if (any0) f0 *= selkv::sm90::sink_scale(p.attn_sink[h0], lse0);
      if (any1) f1 *= selkv::sm90::sink_scale(p.attn_sink[h1], lse1);
    }
    // 16-bit rows (bf16 out, or the scaled fp16 partial into its slot, [H, 512] contiguous) go
    // through shared memory: each warp's 16 rows by stmatrix into the free Q tile, then 512
    // contiguous bytes per store. Why: shorter code than a select per word and a quad transpose in
    // registers; the epilogue runs once per row, so a launch's end fetches it cold and every CTA
    // waits on that fetch (docs/perf-log.md: staged epilogue).
    const bool to_slot = kF16Partials && w.split;
    uint16_t* orow = to_slot ? reinterpret_cast<uint16_t*>(p.accum_out) + int64_t(w.slot) * partial_slot_elems(kNumHeads, true)
                             : p.out + b * p.out_batch_stride + s * p.out_seq_stride;
    const int64_t hs = to_slot ? int64_t(kDimV) : p.out_head_stride;
    const int warp_wg = r0 >> 4;
    const uint32_t stage = stage_base + uint32_t(cw * kStageBytesPerConsumer + warp_wg * kStageBytesPerWarp);
    if (to_slot) {
      const float2 inv = stage_f16_partial(stage, lane, tOrO, any0, any1, f0, f1);
      if (q4 == 0) {
        float* inv_out = p.accum_out + f16_inv_scales_offset(p.num_sm_parts, kNumHeads);
        inv_out[(int64_t(w.slot) * kNumHeads + h0) * 2 + cw] = inv.x;
        inv_out[(int64_t(w.slot) * kNumHeads + h1) * 2 + cw] = inv.y;
      }
    } else {
      // Scaled once, packed by one short stmatrix sequence (not a select per word).
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? f1 : f0;
      stage_rows16(stage, lane, tOrO, [](float a, float b) { return bf16x2_bits(a, b); });
    }
    __syncwarp();
    SELKV_TL(if (tl_lead) tl_stamp(13 + 3 * cw);)
    uint16_t* dst = orow + int64_t(head_base + 16 * warp_wg) * hs + cw * kDimVPerConsumer + lane * 8;
#pragma unroll 4
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<uint4*>(dst + j * hs) = lds_128(stage + uint32_t(stage_row_offset(j, lane)));
    }
    SELKV_TL(if (tl_lead) tl_stamp(14 + 3 * cw);)
    if (cw == 0 && (lane & 3) == 0 && !to_slot) {
      float* lrow = p.lse + b * p.lse_batch_stride + s * p.lse_seq_stride;
      lrow[h0] = any0 ? lse0 : p.empty_lse;
      lrow[h1] = any1 ? lse1 : p.empty_lse;
    }
  }
}

// Q [64 heads x kDimQK] of row `w` -> smem by both consumer warpgroups (256 threads, 18 (576) / 16
// (512) cp.async of 16 bytes each, all in flight at once: one DRAM latency per row, no registers),
// waited. The caller guarantees every wgmma of the previous row has completed (the row-end barrier);
// the Q tile is also the previous row's epilogue staging (store_row), so the load first waits until
// both warpgroups have read theirs (kStageFree).
template <class L>
__device__ __forceinline__ void load_q_tile(const DecodeKernelParams& p, typename L::SharedStorage& ss,
                                            const RowWork& w) {
  consumers_sync(NamedBar::kStageFree);
  const int tid = int(threadIdx.x) - 128;
  const int head_base = int(blockIdx.x) * kBlockM;
  const auto [b, s] = row_coord(w.row, p.batch);
  const uint16_t* qrow = p.q + b * p.q_batch_stride + s * p.q_seq_stride;
  const uint32_t sq = smem_u32(ss.q);
  constexpr int kChunksPerHead = L::kDimQK / 8;  // 72 / 64 x 16 bytes
  constexpr int kIters = kBlockM * kChunksPerHead / kNumConsumerThreads;
  static_assert(kBlockM * kChunksPerHead % kNumConsumerThreads == 0);
#pragma unroll 1  // asynchronous copies: a rolled loop still has them all in flight, in few registers
  for (int u = 0; u < kIters; ++u) {
    const int c = u * kNumConsumerThreads + tid;
    const int h = c / kChunksPerHead, cc = c - (c / kChunksPerHead) * kChunksPerHead;
    selkv::sm90::cp_async_16(sq + 2u * uint32_t(L::k_tile_offset(h, cc * 8)),
                             qrow + int64_t(head_base + h) * p.q_head_stride + cc * 8, true);
  }
  selkv::sm90::cp_async_wait_all();
  cutlass::arch::fence_view_async_shared();  // cp.async writes are generic proxy; wgmma reads async
  consumers_sync(NamedBar::kQReady);
}

// S = Q K^T for the 64 tokens of the K tile `ktile` (wgmma m64n64k16 SS over all kDimQK dims),
// committed, not waited: the caller waits and fences tSrS.
template <class L, class TiledMma, class ThrMma, class FragQ, class FragS>
__device__ __forceinline__ void issue_s_gemm(TiledMma& mma, const ThrMma& thr, const FragQ& tSrQ, bf16_t* ktile,
                                             FragS& tSrS) {
  Tensor sK = make_tensor(make_smem_ptr(ktile), typename L::SmemLayoutK{});
  Tensor tSrK = thr.partition_fragment_B(sK);  // (MMA, 1, kDimQK / 16)
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
    cute::gemm(mma, tSrQ(_, _, kb), tSrK(_, _, kb), tSrS);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// O += P V_half for one block, committed, not waited: `v_half` is the V half's first element in
// the K tile (read MN-major); P is a register fragment (RS) or smem descriptors (SS).
template <class L, class TiledMma, class ThrMma, class FragP, class FragO>
__device__ __forceinline__ void issue_pv_gemm(TiledMma& mma, const ThrMma& thr, const FragP& tOrP, bf16_t* v_half,
                                              FragO& tOrO) {
  Tensor sV = make_tensor(make_smem_ptr(v_half), typename L::SmemLayoutVHalf{});
  Tensor tOrV = thr.partition_fragment_B(sV);  // (MMA, 1, 4)
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma, tOrP(_, _, kb), tOrV(_, _, kb), tOrO);
  warpgroup_commit_batch();
}
// The same, waited (the split's softmax WG with P in registers, the PV WG with P in smem).
template <class L, class TiledMma, class ThrMma, class FragP, class FragO>
__device__ __forceinline__ void pv_gemm_wait(TiledMma& mma, const ThrMma& thr, const FragP& tOrP, bf16_t* v_half,
                                             FragO& tOrO) {
  issue_pv_gemm<L>(mma, thr, tOrP, v_half, tOrO);
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
}

// Wait until block `buf` (phase) is complete in this CTA: the local producer's part (bar_full),
// and in a 2-CTA cluster (H = 128) the peer's part (bar_remote). `tl_lead` (timeline build only)
// stamps each of the two.
template <int kNumHeads, class SS>
__device__ __forceinline__ void wait_kv_tile(SS& ss, int buf, uint32_t phase, [[maybe_unused]] bool tl_lead = false) {
  cutlass::arch::ClusterBarrier::wait(&ss.bar_full[buf], phase);
  SELKV_TL(if (tl_lead) tl_stamp(21);)
  if constexpr (DecodeTraits<kNumHeads>::kCluster == 2) cutlass::arch::ClusterBarrier::wait(&ss.bar_remote[buf], phase);
  SELKV_TL(if (tl_lead) tl_stamp(22);)
}

// Return buffer `buf` to the producer(s): one arrival per consumer warp, on this CTA's and
// (2-CTA cluster, H = 128) the peer's empty barrier (the peer's producer writes half of this tile).
template <int kNumHeads, class SS>
__device__ __forceinline__ void release_kv_tile(SS& ss, int buf, int lane) {
  __syncwarp();
  if constexpr (DecodeTraits<kNumHeads>::kCluster == 2) {
    cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf], 0u, uint32_t(lane == 0));
    cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf], 1u, uint32_t(lane == 0));
  } else {
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf]);
  }
}

// Where a consumer warpgroup is in the K tile ring (both walk the same blocks in the same order).
struct KvRing {
  int buf = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
  }
};

// WG1's blocks of row `w`: S, softmax, P, O_0 += P V_0; then the row's sums and maxima -> smem
// for WG2 and the row-end barrier, which also orders every wgmma of this row before the next
// row's Q load. Returns the row's statistics.
// `shape_words` (packed decode; null otherwise): the packed buffer's shape words, loaded at the
// row's start and compared at its end (long landed by then: no wait); a buffer whose words are
// not this call's shape makes every row's sums NaN, so out and lse come out NaN, split rows
// included.
template <class L, int kNumHeads, class FragO>
__device__ __forceinline__ RowStats softmax_wg_row(const DecodeKernelParams& p, typename L::SharedStorage& ss,
                                                   const RowWork& w, KvRing& ring, FragO& tOrO, int tid_wg, int lane,
                                                   int r0, int r1, const uint64_t* shape_words, bool& tl_first) {
  const int warp_wg = tid_wg / 32;
  const uint64_t shape_lo = shape_words != nullptr ? shape_words[0] : 0u;
  const uint64_t shape_hi = shape_words != nullptr ? shape_words[1] : 0u;
  const float sl2 = p.sm_scale_log2;

  TiledMmaQK mma_qk;
  TiledMmaPVrs mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename L::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, kDimQK / 16) descriptors
  Tensor tOrP = make_tensor<bf16_t>(partition_shape_A(mma_pv, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  static_assert(decltype(size(tOrP))::value == 32);
  selkv::sm90::OnlineSoftmax2 sm;
  // The P tile's stmatrix addresses (see the stores below), once a row: left to itself ptxas
  // recomputes them every block in the one-copy build (kEitherWg; 20 instructions a block).
  uint32_t p_addr[4];
  {
    const int m = lane >> 3;
    const int srow = warp_wg * 16 + 8 * (m & 1) + (lane & 7);
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      p_addr[k] = smem_u32(ss.p + p_tile_offset(srow, 8 * (2 * k + (m >> 1))));
      asm volatile("mov.b32 %0, %0;" : "+r"(p_addr[k]));  // opaque: computed here, kept in a register
    }
  }

  for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
    wait_kv_tile<kNumHeads>(ss, ring.buf, ring.phase, tl_first && tid_wg == 0);

    // S = Q K^T over kDimQK dims for the block's 64 tokens.
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    issue_s_gemm<L>(mma_qk, thr_qk, tSrQ, ss.k[ring.buf], tSrS);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    SELKV_TL(if (tid_wg == 0 && tl_first) { tl_stamp(4); tl_first = false; })

    // Mask invalid tokens (bit t of the block's mask = token t), row maxima over the quad.
    const float2 mx = sm.rowmax(tSrS, *reinterpret_cast<const uint64_t*>(ss.kv_valid_bits[ring.buf]), lane);
    // P = exp2(s * scale_log2 - m * scale_log2): row sums in fp32, P in bf16 registers.
    const float2 sc = sm.advance(tSrS, sl2, fmaxf(sm.m0, mx.x), fmaxf(sm.m1, mx.y));
    const float sc0 = sc.x, sc1 = sc.y;
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); i += 2) {
      const uint32_t v = bf16x2_bits(tSrS(i), tSrS(i + 1));
      *reinterpret_cast<uint32_t*>(&tOrP(i)) = v;
    }

    // Publish P and the rescale factors to WG2 (after it has finished with the previous ones).
    if (blk != w.blk_begin) consumers_sync(NamedBar::kPFree);
    // P tile by stmatrix: 4 instructions per thread instead of 16 four-byte stores (docs/perf-log.md:
    // decode P tile). The u32 at tOrP(i) is (row half (i >> 1) & 1, column block i >> 2); store k
    // writes column blocks 2k and 2k + 1 as matrices m = (half m & 1, block 2k + (m >> 1)), i.e.
    // tOrP(8k + 2m).
    {
      auto u32_at = [&](int i) { return *reinterpret_cast<const uint32_t*>(&tOrP(i)); };
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k)
        stsm_x4(p_addr[k], u32_at(8 * k), u32_at(8 * k + 2), u32_at(8 * k + 4), u32_at(8 * k + 6));
    }
    if ((lane & 3) == 0) {
      ss.row_scale[r0] = sc0;
      ss.row_scale[r1] = sc1;
    }
    cutlass::arch::fence_view_async_shared();  // P tile: generic stores -> WG2's wgmma
    consumers_arrive(NamedBar::kPReady);
    // Once the running maxima settle the factors are exactly 1, and at the row's first block O is
    // the cleared +0 (the factor is 0): skip the 128 multiplies (warp-uniform test; multiplying
    // would give the same bits).
    if (__any_sync(0xffffffffu, (sc0 != 1.f || sc1 != 1.f) && blk != w.blk_begin)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
    }

    // O_0 += P V_0 (V = first 512 dims of the same KV tile, read MN-major).
    pv_gemm_wait<L>(mma_pv, thr_pv, tOrP, ss.k[ring.buf], tOrO);

    release_kv_tile<kNumHeads>(ss, ring.buf, lane);
    ring.advance();
  }

  sm.finish();
  if (shape_words != nullptr && !packed::packed_shape_matches(shape_lo, shape_hi, p.batch, p.seq_q, p.topk))
    sm.l0 = sm.l1 = __uint_as_float(0x7fc00000u);  // NaN
  if ((lane & 3) == 0) {
    ss.row_sum[r0] = sm.l0;
    ss.row_sum[r1] = sm.l1;
    ss.row_max[r0] = sm.m0;
    ss.row_max[r1] = sm.m1;
  }
  consumers_sync(NamedBar::kRowSum);
  // WG2 reads row_sum / row_max right after kRowSum; WG1 rewrites them only after the next
  // row's kQReady barrier, which WG2 reaches after that read.
  SELKV_TL(if (tid_wg == 0) tl_stamp(6);)  // overwritten per row: the last row's remains
  return RowStats{sm.m0, sm.m1, sm.l0, sm.l1};
}

// WG2's blocks of row `w`: O_1 = O_1 * scale + P V_1; then the row-end barrier and the row's
// statistics from WG1.
template <class L, int kNumHeads, class FragO>
__device__ __forceinline__ RowStats pv_wg_row(typename L::SharedStorage& ss, const RowWork& w, KvRing& ring,
                                              FragO& tOrO, int tid_wg, int lane, int r0, int r1) {
  TiledMmaPV mma_pv;
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sP = make_tensor(make_smem_ptr(ss.p), SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4) descriptors

  for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
    consumers_sync(NamedBar::kPReady);
    // WG1 waited for this tile before publishing P; waiting here too is free and keeps the
    // async-proxy visibility chain explicit (producer fence -> mbarrier -> this thread).
    wait_kv_tile<kNumHeads>(ss, ring.buf, ring.phase);
    const float sc0 = ss.row_scale[r0], sc1 = ss.row_scale[r1];
    if (__any_sync(0xffffffffu, (sc0 != 1.f || sc1 != 1.f) && blk != w.blk_begin)) {  // as WG1's
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
    }

    pv_gemm_wait<L>(mma_pv, thr_pv, tOrP, ss.k[ring.buf] + kVHalfDimOffset, tOrO);

    release_kv_tile<kNumHeads>(ss, ring.buf, lane);
    if (blk + 1 != w.blk_end) consumers_arrive(NamedBar::kPFree);
    ring.advance();
  }
  consumers_sync(NamedBar::kRowSum);
  return RowStats{ss.row_max[r0], ss.row_max[r1], ss.row_sum[r0], ss.row_sum[r1]};
}

// The consumer warpgroups: cw = 0 the softmax WG (WG1), cw = 1 the PV WG (WG2), which owns
// d_v [256 cw, 256 cw + 256) of O. Only the block loops differ, so the row walk, the Q load and
// the row epilogue are one source. kWg = kEitherWg (Regs::kOneConsumerCopy) makes them one copy
// of the code run by both warpgroups: the second to reach a row's epilogue finds it in the
// instruction cache (a launch ends on that epilogue, fetched cold; docs/perf-log.md: one
// consumer function). kWg = 0 / 1 compiles a copy per warpgroup, each at its own register count.
// Registers of the one copy: ptxas holds code reachable from both warpgroups to the count of the
// path into it with the fewest, so the shared code runs at Regs::kShared in both; each block loop
// runs at its warpgroup's own count. WG2 drops to kPvWg before its loop and WG1 then rises to
// kSoftmaxWg (setmaxnreg.inc waits for the registers); after the row-end barrier WG1 drops back
// first. Neither wait can close a cycle: a drop never waits.
inline constexpr int kEitherWg = -1;
template <class L, int kNumHeads, bool kF16Partials, class Regs, int kWg, class Iter>
__device__ __forceinline__ void run_consumer_wg(const DecodeKernelParams& p, typename L::SharedStorage& ss, Iter it,
                                                const uint64_t* shape_words) {
  constexpr bool kOneCopy = kWg == kEitherWg;
  const int cw = kOneCopy ? int(threadIdx.x) / 128 - 1 : kWg;  // warpgroup-uniform
  const int tid_wg = int(threadIdx.x) % 128;
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;

  Tensor tOrO = partition_fragment_C(TiledMmaPV{}, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  static_assert(decltype(size(tOrO))::value == 128);
  KvRing ring;
  RowWork w;
  bool tl_first = true;
  selkv::sm90::mbar_wait<true>(smem_u32(&ss.bar_first_loads), 0u);  // see run_producer
  while (it.next(w)) {
    load_q_tile<L>(p, ss, w);
    SELKV_TL(if (cw == 0 && tid_wg == 0 && tl_first) tl_stamp(3);)
    clear(tOrO);
    RowStats st;
    if (cw == 0) {
      if constexpr (kOneCopy) cutlass::arch::warpgroup_reg_alloc<Regs::kSoftmaxWg>();
      st = softmax_wg_row<L, kNumHeads>(p, ss, w, ring, tOrO, tid_wg, lane, r0, r1, shape_words, tl_first);
      if constexpr (kOneCopy) cutlass::arch::warpgroup_reg_dealloc<Regs::kShared>();
    } else {
      if constexpr (kOneCopy) cutlass::arch::warpgroup_reg_dealloc<Regs::kPvWg>();
      st = pv_wg_row<L, kNumHeads>(ss, w, ring, tOrO, tid_wg, lane, r0, r1);
      if constexpr (kOneCopy) cutlass::arch::warpgroup_reg_alloc<Regs::kShared>();
    }
    store_row<kNumHeads, kF16Partials>(p, w, smem_u32(ss.q), cw, lane, r0, r1, st, tOrO);
  }
  SELKV_TL(if (tid_wg == 0) {
    if (cw == 0) {
      tl_stamp(5);
      tl_finish(p);
    } else {
      tl_stamp(10);
    }
  })
}

}  // namespace selkv::decode::sm90
