// C8 SM90 page-4 kernel (selkv/qsa.h; group plan layout src/qsa/qsa_group_layout.h). One CTA serves a group
// of rows_per_cta consecutive query rows and one kv head: the (row, head) pairs of the group are
// the M dimension (64) of the warpgroup MMA tiles, and every selected 4-token
// block is loaded once for all rows of the group that selected it.
//
// Warp roles. The rows' selections were merged before the launch: the group plan (qsa_plan,
// layout src/qsa/qsa_group_layout.h) lists the group's distinct blocks in order with a
// row-membership word per token. A reader warp copies kP4Blocks of them at a time into a ring of
// kP4Ring tile descriptors (cp.async, published when the copies land), so it runs ahead of the
// loads. A load warp copies the K and V rows of the tile's tokens that some row uses into a stage
// with cp.async (16 bytes per lane: the copies of one token issue in one instruction), never a
// token no row uses. The consumer warpgroup computes S = Q K^T with wgmma (Q and K from shared
// memory, fp32 accumulation), replaces the scores of tokens a row did not select with -inf (a
// select, so garbage K never leaks), runs the fp32 online softmax and accumulates P V (wgmma, P
// from registers).
//
// What it does not serve exactly, it flags: a row the plan marks bad, every row of a group whose
// plan entry or header does not match the call or that holds a block outside [0, num_pages) x
// [0, P) gets NaN in its out and lse, and so does a pair whose out is not finite in T (a non-finite V of a
// token only other rows selected reaches it as 0 * NaN). The fix-up pass of the simple kernel
// (QsaSimpleParams::only_nonfinite) recomputes exactly every (row, kv head) with a NaN in element
// 0 of one of its heads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/arch.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_page4.h"
#include "qsa/qsa_device_util.cuh"  // Elem<T>
#include "qsa/qsa_wgmma.cuh"
#include "sm90/device_ops.cuh"  // exp2_ftz, cp.async copies and groups

namespace selkv::qsa {

inline constexpr int kP4ConsumerWarps = kQsaPage4Pairs / 16;
inline constexpr int kP4ConsumerThreads = kP4ConsumerWarps * 32;
// Load warps: one warp's address math and copy issue bound the page-4 pipeline (ncu, no-compute
// build: the load warp never waited on a barrier while the consumers starved), so kP4LoadWarps
// warps split each tile's blocks. 4 would leave the consumers too few registers (docs/perf-log.md:
// page-4 load warps).
inline constexpr int kP4LoadWarps = 3;
inline constexpr int kP4ReadWarp = kP4ConsumerWarps, kP4LoadWarp = kP4ConsumerWarps + 1;  // the first load warp
inline constexpr int kP4LoadThreads = 32 * kP4LoadWarps;
inline constexpr int kP4Threads = kP4ConsumerThreads + 32 + kP4LoadThreads;  // + the reader and load warps
// 8 blocks (32 tokens) a tile: the K / V stages hold 128 tokens in all (D 256: that fills the shared
// memory), so 4 stages (docs/perf-log.md: page-4 tile size).
inline constexpr int kP4Blocks = 8;                          // blocks of one tile
inline constexpr int kP4Tokens = 4 * kP4Blocks;
inline constexpr int kP4Stages = 128 / kP4Tokens;           // K / V stages
inline constexpr int kP4Ring = 2 * kP4Stages;               // tile descriptors the reader may run ahead
inline constexpr int kP4Chunks = kP4Tokens / 16;            // 16-token MMA chunks of a tile
static_assert(kP4Tokens == 32, "page-4 tile: S is one m64n32k16 accumulator");

// Shared memory of one CTA. Q and every K and V tile are 128-byte-swizzled panel tiles (qsa_wgmma.cuh),
// the layout wgmma reads, 1024-byte aligned. A tile descriptor (ring entry): the tile's tokens'
// row-membership words and each block's page and slot base, as the group plan holds them.
template <int D>
struct P4Layout {
  static constexpr int kQ = 0;                                   // [64 pairs x D]
  static constexpr int kTileBytes = kP4Tokens * D * 2;           // one K or V tile [kP4Tokens x D]
  static constexpr int kPanelBytes = kP4Tokens * 128;            // 64 columns of a K or V tile
  static constexpr int kK = kQ + kQsaPage4Pairs * D * 2;         // stage s: kK + s * kStageBytes
  static constexpr int kV = kK + kTileBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kTokw = kK + kP4Stages * kStageBytes;    // [ring][tokens] u32 row-membership words
  static constexpr int kBlkPb = kTokw + kP4Ring * kP4Tokens * 4;  // [ring][blocks] int2 page, slot base
  static constexpr int kCorrupt = kBlkPb + kP4Ring * kP4Blocks * 8;  // u32: a block outside the cache was listed
  // kv_full[stage], kv_empty[stage], ring_full[ring], ring_empty[ring]
  static constexpr int kBars = (kCorrupt + 4 + 7) / 8 * 8;
  static constexpr int kKvFull = kBars, kKvEmpty = kKvFull + 8 * kP4Stages;
  static constexpr int kRingFull = kKvEmpty + 8 * kP4Stages, kRingEmpty = kRingFull + 8 * kP4Ring;
  static constexpr int kBytes = kRingEmpty + 8 * kP4Ring;
  static_assert(kK % 1024 == 0 && kTileBytes % 1024 == 0, "swizzled tiles start 1024-byte aligned");
};

// The group's entry of the plan, checked against the call: a plan of another call, or an entry
// that is not where this group's blocks are, serves no block and flags every row.
struct P4Group {
  int64_t first = 0;   // index of the group's first block in the plan
  int32_t count = 0;   // its blocks
  uint32_t bad = 0;    // rows the fix-up computes
};

__device__ __forceinline__ P4Group p4_group(const QsaPage4Params& p, int32_t grp, int32_t rows) {
  const int32_t* md = p.md;
  const int64_t R = p.num_rows, K = p.max_blocks, C = group_capacity(K);
  const int64_t groups = (R + p.rows_per_cta - 1) / p.rows_per_cta;
  P4Group pg;
  pg.bad = rows >= 32 ? ~0u : (1u << rows) - 1u;
  if (md[0] != kGroupMagic || md[1] != p.num_rows || md[2] != p.max_blocks || md[3] != p.rows_per_cta ||
      md[4] != int32_t(groups))
    return pg;
  const int4 e = *reinterpret_cast<const int4*>(md + group_table_offset() + 4 * int64_t(grp));
  if (int64_t(e.x) != int64_t(grp) * p.rows_per_cta * C || e.y < 0 || int64_t(e.y) > rows * C) return pg;
  pg.first = e.x;
  pg.count = e.y;
  pg.bad = uint32_t(e.z);
  return pg;
}

// The reader warp: tile t's descriptor is the group's blocks [8 t, 8 t + 8) of the plan. Lanes
// 0-7 copy one block's token words each (16 bytes, zero-filled past the count, so the consumers'
// words of unused slots are 0), lanes 8-15 its page and slot base (8 bytes); every lane's
// arrival on ring_full completes when its copies land, so the reader never waits for them.
template <int D>
__device__ __forceinline__ void p4_read(const QsaPage4Params& p, uint8_t* smem, const P4Group& pg) {
  using L = P4Layout<D>;
  const int lane = int(threadIdx.x) % 32;
  const int64_t R = p.num_rows, K = p.max_blocks;
  const uint4* tokw = reinterpret_cast<const uint4*>(p.md + group_tokw_offset(R, K)) + pg.first;
  const int2* pb = reinterpret_cast<const int2*>(p.md + group_blocks_offset(R)) + pg.first;
  const uint32_t ring_full = sm90::smem_addr(smem + L::kRingFull), ring_empty = sm90::smem_addr(smem + L::kRingEmpty);
  const int tiles = (pg.count + kP4Blocks - 1) / kP4Blocks;
  for (int t = 0; t < tiles; ++t) {
    const int e = t % kP4Ring;
    sm90::mbar_wait(ring_empty + 8u * uint32_t(e), (uint32_t(t / kP4Ring) & 1u) ^ 1u);  // its last tile is done
    const int k = kP4Blocks * t + (lane % kP4Blocks);
    if (lane < kP4Blocks) {
      sm90::cp_async_16(sm90::smem_addr(smem + L::kTokw) + uint32_t((e * kP4Tokens + 4 * lane) * 4), tokw + k,
                               k < pg.count);
    } else if (lane < 2 * kP4Blocks && k < pg.count) {
      sm90::cp_async_8(sm90::smem_addr(smem + L::kBlkPb) + uint32_t((e * kP4Blocks + lane - kP4Blocks) * 8), pb + k);
    }
    sm90::cp_async_arrive(ring_full + 8u * uint32_t(e));
  }
}

// The load warp: for each tile descriptor, copies the used tokens' K and V rows into the stage.
// Lane l copies 16-byte chunk l % (D / 8) of token rows; a block's page and slot base are read
// once (shared-memory broadcasts) and its four rows issue back to back, so consecutive blocks'
// copies overlap (no per-token shuffles on the critical path).
template <int D>
__device__ __forceinline__ void p4_load(const QsaPage4Params& p, uint8_t* smem, int32_t kvh, const P4Group& pg,
                                        int load_warp) {
  using L = P4Layout<D>;
  constexpr int kChunks = D / 8;              // 16-byte chunks of a row: 32 (D 256) or 16 (D 128)
  constexpr int kRowsPerCopy = 32 / kChunks;  // token rows one warp-wide copy covers: 1 or 2
  const int lane = int(threadIdx.x) % 32;
  const int c = lane % kChunks, sub = lane / kChunks;
  const int64_t kpage = p.io.k_page_stride * 2, kslot = p.io.k_slot_stride * 2;
  const int64_t vpage = p.io.v_page_stride * 2, vslot = p.io.v_slot_stride * 2;
  // This lane's chunk of its first row (row `sub` of a block), and the later rows' offsets: one
  // 64-bit address per block and cache, then an add per row.
  const char* kbase = static_cast<const char*>(p.io.k) + int64_t(kvh) * p.io.k_head_stride * 2 + c * 16 + sub * kslot;
  const char* vbase = static_cast<const char*>(p.io.v) + int64_t(kvh) * p.io.v_head_stride * 2 + c * 16 + sub * vslot;
  int64_t krow[4 / kRowsPerCopy], vrow[4 / kRowsPerCopy];
  // Where this lane's chunk of row i = j * kRowsPerCopy + sub of a block lands in the swizzled tile,
  // past the block's first row: token 4 b + i has swizzle phase 4 (b % 2) + i.
  uint32_t dst[2][4 / kRowsPerCopy];
#pragma unroll
  for (int j = 0; j < 4 / kRowsPerCopy; ++j) {
    const int i = j * kRowsPerCopy + sub;
    krow[j] = j * kRowsPerCopy * kslot, vrow[j] = j * kRowsPerCopy * vslot;
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) dst[odd][j] = wg::sw128_offset(kP4Tokens, 4 * odd + i, c);
  }
  const uint32_t ring_full = sm90::smem_addr(smem + L::kRingFull), ring_empty = sm90::smem_addr(smem + L::kRingEmpty);
  const uint32_t kv_full = sm90::smem_addr(smem + L::kKvFull), kv_empty = sm90::smem_addr(smem + L::kKvEmpty);
  const int tiles = (pg.count + kP4Blocks - 1) / kP4Blocks;
  uint32_t corrupt = 0u;
  for (int t = 0; t < tiles; ++t) {
    const int e = t % kP4Ring, s = t % kP4Stages;
    sm90::mbar_wait(ring_full + 8u * uint32_t(e), uint32_t(t / kP4Ring) & 1u);
    const int nb = pg.count - kP4Blocks * t < kP4Blocks ? pg.count - kP4Blocks * t : kP4Blocks;
    const uint32_t* tokw = reinterpret_cast<const uint32_t*>(smem + L::kTokw) + e * kP4Tokens;
    const int2* blk_pb = reinterpret_cast<const int2*>(smem + L::kBlkPb) + e * kP4Blocks;
    sm90::mbar_wait(kv_empty + 8u * uint32_t(s), (uint32_t(t / kP4Stages) & 1u) ^ 1u);
    const uint32_t kst = sm90::smem_addr(smem + L::kK + s * L::kStageBytes);
    const uint32_t vst = kst + uint32_t(L::kTileBytes);
#pragma unroll 4
    for (int b = load_warp; b < nb; b += kP4LoadWarps) {  // this warp's blocks of the tile
      uint4 w = *reinterpret_cast<const uint4*>(tokw + 4 * b);
      const int2 pbe = blk_pb[b];
      const int64_t page = pbe.x, base = pbe.y;
      // DESIGN §2 on the plan too: a block outside the cache is never read, and flags the group.
      if (page < 0 || page >= p.num_pages || base < 0 || base % 4 != 0 || base >= p.page_size) {
        corrupt = 1u;
        w = make_uint4(0u, 0u, 0u, 0u);
      }
      uint64_t kb = reinterpret_cast<uint64_t>(kbase + page * kpage + base * kslot);
      uint64_t vb = reinterpret_cast<uint64_t>(vbase + page * vpage + base * vslot);
      // Opaque to the optimizer: otherwise it re-forms a 64-bit (base + i) * stride product per row.
      asm("" : "+l"(kb), "+l"(vb));
      const uint32_t pair_base = uint32_t((b / 2) * 8 * 128);  // blocks 2 k and 2 k + 1: rows 8 k .. 8 k + 7
#pragma unroll
      for (int j = 0; j < 4 / kRowsPerCopy; ++j) {
        const int i = j * kRowsPerCopy + sub;
        const uint32_t used = i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
        if (used != 0u) {
          const uint32_t row = pair_base + ((b & 1) != 0 ? dst[1][j] : dst[0][j]);
          sm90::cp_async_16(kst + row, reinterpret_cast<const void*>(kb + uint64_t(krow[j])), true);
          sm90::cp_async_16(vst + row, reinterpret_cast<const void*>(vb + uint64_t(vrow[j])), true);
        }
      }
    }
    if (corrupt != 0u && lane == 0) *reinterpret_cast<volatile uint32_t*>(smem + L::kCorrupt) = 1u;
    sm90::mbar_arrive(ring_empty + 8u * uint32_t(e));   // done with the descriptor
    sm90::cp_async_arrive(kv_full + 8u * uint32_t(s));  // the stage is full once this lane's copies land
  }
  // The consumers read the flag after this barrier (named barrier 2: consumers + the load warps).
  asm volatile("bar.arrive 2, %0;\n" ::"n"(kP4ConsumerThreads + kP4LoadThreads) : "memory");
}

template <typename T, int D>
__global__ void __launch_bounds__(kP4Threads, 1) qsa_page4_kernel(const QsaPage4Params p) {
  using L = P4Layout<D>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const float kNegInf = -__int_as_float(0x7F800000);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int32_t grp = int32_t(blockIdx.x / unsigned(p.num_kv_heads));
  const int32_t kvh = int32_t(blockIdx.x - unsigned(grp) * unsigned(p.num_kv_heads));
  const int32_t row0 = grp * p.rows_per_cta;
  const int32_t rows = min(p.rows_per_cta, p.num_rows - row0);
  const int G = p.group;
  const int pairs = rows * G;
  const P4Group pg = p4_group(p, grp, rows);
  const int tiles = (pg.count + kP4Blocks - 1) / kP4Blocks;

  // V rows of tokens no row uses are never loaded; they must hold finite values (P = 0 there), so
  // every V tile starts zeroed. Later they hold other tokens' V: finite, or flagged (see above).
  for (int i = int(threadIdx.x); i < kP4Stages * (L::kTileBytes / 16); i += kP4Threads) {
    const int s = i / (L::kTileBytes / 16), rem = i % (L::kTileBytes / 16);
    *reinterpret_cast<uint4*>(smem + L::kV + s * L::kStageBytes + rem * 16) = make_uint4(0, 0, 0, 0);
  }
  const uint32_t kv_full = sm90::smem_addr(smem + L::kKvFull), kv_empty = sm90::smem_addr(smem + L::kKvEmpty);
  const uint32_t ring_full = sm90::smem_addr(smem + L::kRingFull), ring_empty = sm90::smem_addr(smem + L::kRingEmpty);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kP4Stages; ++s) {
      sm90::mbar_init(kv_full + 8u * uint32_t(s), kP4LoadThreads);  // the load warps' lanes, once their copies land
      sm90::mbar_init(kv_empty + 8u * uint32_t(s), uint32_t(kP4ConsumerThreads));
    }
    for (int e = 0; e < kP4Ring; ++e) {
      sm90::mbar_init(ring_full + 8u * uint32_t(e), 32);                               // the reader warp's lanes
      sm90::mbar_init(ring_empty + 8u * uint32_t(e), uint32_t(kP4ConsumerThreads + kP4LoadThreads));  // consumers + load warps
    }
    *reinterpret_cast<uint32_t*>(smem + L::kCorrupt) = 0u;
    sm90::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == kP4ReadWarp) {
    p4_read<D>(p, smem, pg);
    return;
  }
  if (warp >= kP4LoadWarp) {
    p4_load<D>(p, smem, kvh, pg, warp - kP4LoadWarp);
    return;
  }

  // ---- consumers: one warpgroup; warp w holds pairs [16 w, 16 w + 16) of the MMA tiles' 64 rows,
  // pair = row_in_group * G + head ----
  const int tid = int(threadIdx.x);
  // Q with cp.async: every copy of the thread in flight at once (pairs past the group's: zeros).
  for (int i = tid; i < kQsaPage4Pairs * (D / 8); i += kP4ConsumerThreads) {
    const int pr = i / (D / 8), c = i % (D / 8);
    const T* src = static_cast<const T*>(p.io.q);
    if (pr < pairs) {
      const int64_t row = row0 + pr / G, head = int64_t(kvh) * G + pr % G;
      src += row * p.io.q_row_stride + head * p.io.q_head_stride + c * 8;
    }
    sm90::cp_async_16(sm90::smem_addr(smem + L::kQ + wg::sw128_offset(kQsaPage4Pairs, pr, c)), src, pr < pairs);
  }
  sm90::cp_async_wait_all();
  sm90::fence_proxy_async();  // Q and the V tiles' zeros (generic proxy) before wgmma reads them
  asm volatile("bar.sync 1, %0;\n" ::"n"(kP4ConsumerThreads) : "memory");

  const bool active = warp * 16 < pairs;
  const int pair0 = warp * 16 + lane / 4, pair1 = pair0 + 8;
  const uint32_t bit0 = pair0 < pairs ? 1u << (pair0 / G) : 0u;
  const uint32_t bit1 = pair1 < pairs ? 1u << (pair1 / G) : 0u;
  // Descriptors of Q and of stage 0's K and V tiles; the others are a 32-bit add away.
  const wg::Desc q_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kQ), 16, 1024);
  const wg::Desc k_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kK), 16, 1024);
  const wg::Desc v_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kV), L::kPanelBytes, 1024);

  float o[D / 8][4];  // the m64nDk16 accumulator fragment: o[i] holds columns 8 i + 2 (lane % 4) + {0, 1}
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;  // rows lane / 4 and lane / 4 + 8 of the warp

  float sc[2 * kP4Chunks][4];          // S of one tile (the m64n32k16 accumulator fragment)
  uint32_t pa[kP4Chunks][4], pb[kP4Chunks][4];  // P of alternate tiles (P V of one runs while the next is made)
  float a0 = 1.f, a1 = 1.f;               // the rescale of O the last softmax asked for

  // S = Q K^T of tile t (64 pairs x kP4Tokens tokens) once its stage landed, committed, not waited:
  // D / 16 steps of 16 columns, 32 bytes into a panel each.
  auto issue_s = [&](int t) {
    const int s = t % kP4Stages, e = t % kP4Ring;
    sm90::mbar_wait(ring_full + 8u * uint32_t(e), uint32_t(t / kP4Ring) & 1u);
    sm90::mbar_wait(kv_full + 8u * uint32_t(s), uint32_t(t / kP4Stages) & 1u);
    sm90::fence_proxy_async();  // the stage's cp.async rows before wgmma reads them
    const wg::Desc kd = wg::desc_advance(k_desc, uint32_t(s * L::kStageBytes));
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col = uint32_t((kk % 4) * 32);
      wg::ss_m64n32k16<T>(&sc[0][0], wg::desc_advance(q_desc, uint32_t((kk / 4) * kQsaPage4Pairs * 128) + col),
                          wg::desc_advance(kd, uint32_t((kk / 4) * L::kPanelBytes) + col), kk > 0);
    }
    wg::commit();
  };
  // O += P V of tile t: per 16-token step, D / 64 MMAs of 64 columns (one V panel each); committed.
  auto issue_pv = [&](int t, uint32_t (&pt)[kP4Chunks][4]) {
    const wg::Desc vd = wg::desc_advance(v_desc, uint32_t((t % kP4Stages) * L::kStageBytes));
    wg::fence();
#pragma unroll
    for (int kc = 0; kc < kP4Chunks; ++kc) {
#pragma unroll
      for (int n = 0; n < D / 64; ++n)
        wg::rs_m64n64k16_mn<T>(&o[8 * n][0], pt[kc], wg::desc_advance(vd, uint32_t(n * L::kPanelBytes + kc * 16 * 128)));
    }
    wg::commit();
  };
  // The online softmax of tile t's scores (sc, landed) into P (out); a0 / a1: O's rescale.
  auto softmax = [&](int t, uint32_t (&out)[kP4Chunks][4]) {
    const uint32_t* tokw = reinterpret_cast<const uint32_t*>(smem + L::kTokw) + (t % kP4Ring) * kP4Tokens;
    // Membership: token 8 j + 2 (lane % 4) + e of the tile for the thread's two rows. The masked
    // raw scores go to x (sc stays as the wgmma wrote it: it is the next S's input); the scale
    // (> 0, check_sm_scale) is applied to the max once and folded into each exponent's FFMA.
    const float scale = p.io.scale_log2;
    float x[2 * kP4Chunks][4];
    float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
    for (int j = 0; j < 2 * kP4Chunks; ++j) {
      const uint2 w = *reinterpret_cast<const uint2*>(tokw + 8 * j + 2 * (lane % 4));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t tw = e == 0 ? w.x : w.y;
        const bool in0 = (tw & bit0) != 0u, in1 = (tw & bit1) != 0u;
        x[j][e] = in0 ? sc[j][e] : kNegInf;
        x[j][2 + e] = in1 ? sc[j][2 + e] : kNegInf;
        mx0 = fmaxf(mx0, x[j][e]);
        mx1 = fmaxf(mx1, x[j][2 + e]);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(~0u, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(~0u, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(~0u, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(~0u, mx1, 2));
    // Rounding is monotonic: the scaled max is the max of the scaled scores, bit for bit.
    const float n0 = fmaxf(m0, mx0 * scale), n1 = fmaxf(m1, mx1 * scale);
    // A row still without a member keeps m = -inf, P = 0 (exp2(-inf - 0)) and O = 0.
    a0 = n0 == kNegInf ? 1.f : sm90::exp2_ftz(m0 - n0);
    a1 = n1 == kNegInf ? 1.f : sm90::exp2_ftz(m1 - n1);
    const float b0 = n0 == kNegInf ? 0.f : n0, b1 = n1 == kNegInf ? 0.f : n1;
    m0 = n0;
    m1 = n1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 2 * kP4Chunks; ++j) {
      const float p00 = sm90::exp2_ftz(fmaf(x[j][0], scale, -b0)), p01 = sm90::exp2_ftz(fmaf(x[j][1], scale, -b0));
      const float p10 = sm90::exp2_ftz(fmaf(x[j][2], scale, -b1)), p11 = sm90::exp2_ftz(fmaf(x[j][3], scale, -b1));
      sum0 += p00 + p01;
      sum1 += p10 + p11;
      out[j / 2][(j % 2) * 2 + 0] = Elem<T>::pack(p00, p01);
      out[j / 2][(j % 2) * 2 + 1] = Elem<T>::pack(p10, p11);
    }
    l0 = l0 * a0 + sum0;
    l1 = l1 * a1 + sum1;
  };

  // Software pipeline of one warpgroup: S of tile t + 1 and P V of tile t are in flight together,
  // and the softmax of t + 1 runs under P V of t; O takes t + 1's rescale once P V of t retired.
  if (tiles > 0) {
    issue_s(0);
    wg::wait<0>();
    wg::fence_regs<8 * kP4Chunks>(&sc[0][0]);
    softmax(0, pa);  // O = 0: nothing to rescale
  }
  // Retires P V of tile t (P in pt) and frees its stage and descriptor.
  auto retire_pv = [&](int t, uint32_t (&pt)[kP4Chunks][4]) {
    wg::wait<0>();
    wg::fence_regs<D / 2>(&o[0][0]);
    wg::fence_regs<4 * kP4Chunks>(&pt[0][0]);
    sm90::mbar_arrive(kv_empty + 8u * uint32_t(t % kP4Stages));
    sm90::mbar_arrive(ring_empty + 8u * uint32_t(t % kP4Ring));
  };
  // One step: S of t + 1 and P V of t (P in cur) in flight, the softmax of t + 1 into next under
  // P V, then O's rescale. Every step commits the same two groups, so the compiler sees which one
  // wait<1> retires; P alternates between two register sets (a copy would let the compiler give
  // both one set, and then it serializes the wgmmas).
  auto step = [&](int t, uint32_t (&cur)[kP4Chunks][4], uint32_t (&next)[kP4Chunks][4]) {
    issue_s(t + 1);
    issue_pv(t, cur);
    wg::wait<1>();  // S of t + 1 (committed first) retired; P V of t may still run
    wg::fence_regs<8 * kP4Chunks>(&sc[0][0]);
    softmax(t + 1, next);
    retire_pv(t, cur);
    // Once the rows' maxima settle, a tile rarely raises them: a = 1 exactly for every row of
    // the warp, and the D / 2 multiplications by 1 are skipped (same bits).
    if (__any_sync(~0u, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[i][0] *= a0;
        o[i][1] *= a0;
        o[i][2] *= a1;
        o[i][3] *= a1;
      }
    }
    // O and P are the next P V's inputs: defined here, not moved under the next S's wgmmas.
    wg::fence_regs<D / 2>(&o[0][0]);
    wg::fence_regs<4 * kP4Chunks>(&next[0][0]);
  };
  int t = 0;
  for (; t + 2 < tiles; t += 2) {
    step(t, pa, pb);
    step(t + 1, pb, pa);
  }
  if (t + 1 < tiles) {  // two tiles left
    step(t, pa, pb);
    issue_pv(t + 1, pb);
    retire_pv(t + 1, pb);
  } else if (t < tiles) {  // one
    issue_pv(t, pa);
    retire_pv(t, pa);
  }
  asm volatile("bar.sync 2, %0;\n" ::"n"(kP4ConsumerThreads + kP4LoadThreads) : "memory");  // the load warp's flag
  const bool corrupt = *reinterpret_cast<const volatile uint32_t*>(smem + L::kCorrupt) != 0u;
  if (!active) return;

  // ---- epilogue: out = O / l (0 for a pair without a member, NaN when flagged), lse = ln(sum exp) ----
  l0 += __shfl_xor_sync(~0u, l0, 1);
  l0 += __shfl_xor_sync(~0u, l0, 2);
  l1 += __shfl_xor_sync(~0u, l1, 1);
  l1 += __shfl_xor_sync(~0u, l1, 2);
  const uint32_t bad_rows = corrupt ? ~0u : pg.bad;
  const float inv0 = m0 == kNegInf ? 0.f : 1.f / l0, inv1 = m1 == kNegInf ? 0.f : 1.f / l1;
  // A value that is not finite in T (NaN, Inf, or out of T's range once rounded) may come from a
  // non-finite V of a token another row selected (0 * NaN): the pair is flagged for the fix-up.
  const float kLimit = std::is_same_v<T, __half> ? 65520.f : 3.3895313e38f;  // fp16: rounds to Inf; bf16: its max
  bool over0 = false, over1 = false;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    over0 = over0 || !(fabsf(o[i][0] * inv0) < kLimit) || !(fabsf(o[i][1] * inv0) < kLimit);
    over1 = over1 || !(fabsf(o[i][2] * inv1) < kLimit) || !(fabsf(o[i][3] * inv1) < kLimit);
  }
  // A NaN score a row selected made its P, so its l, NaN (l stays NaN through every rescale).
  const bool nan0 = l0 != l0, nan1 = l1 != l1;
  const uint32_t flag0 = __ballot_sync(~0u, nan0 || over0), flag1 = __ballot_sync(~0u, nan1 || over1);
  const float qnan = __int_as_float(0x7FC00000);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int pr = hr == 0 ? pair0 : pair1;
    if (pr >= pairs) continue;
    const int rr = pr / G;
    // Flagged (any lane of the quad, or the row): out and lse NaN, so the fix-up recomputes it.
    const bool nan = (((hr == 0 ? flag0 : flag1) >> (lane & ~3)) & 0xFu) != 0u || ((bad_rows >> rr) & 1u) != 0u;
    const float m = hr == 0 ? m0 : m1, l = hr == 0 ? l0 : l1, inv = hr == 0 ? inv0 : inv1;
    const bool empty_row = m == kNegInf;
    const int64_t head = int64_t(kvh) * G + pr % G;
    T* dst = static_cast<T*>(p.io.out) + int64_t(row0 + rr) * p.io.out_row_stride + head * p.io.out_head_stride + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      float x = o[i][2 * hr] * inv, y = o[i][2 * hr + 1] * inv;
      if (nan) x = y = qnan;
      else if (empty_row) x = y = 0.f;
      *reinterpret_cast<uint32_t*>(dst + 8 * i) = Elem<T>::pack(x, y);
    }
    if (p.io.lse != nullptr && lane % 4 == 0) {
      const float lse = nan ? qnan : empty_row ? kNegInf : m * 0.69314718055994530942f + logf(l);
      p.io.lse[int64_t(row0 + rr) * p.io.lse_row_stride + head * p.io.lse_head_stride] = lse;
    }
  }
}

template <typename T, int D>
cudaError_t launch_qsa_page4(const QsaPage4Params& p, cudaStream_t stream) {
  constexpr int kSmem = P4Layout<D>::kBytes;
  static_assert(kSmem <= 227 * 1024, "page-4 CTA shared memory");
  if (p.num_rows <= 0) return cudaSuccess;
  const int64_t groups = (int64_t(p.num_rows) + p.rows_per_cta - 1) / p.rows_per_cta;
  const int64_t ctas = groups * p.num_kv_heads;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  cudaError_t err = selkv::detail::set_max_dynamic_smem_once<&qsa_page4_kernel<T, D>>(kSmem);
  if (err != cudaSuccess) return err;
  qsa_page4_kernel<T, D><<<dim3{unsigned(ctas)}, dim3{unsigned(kP4Threads)}, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace selkv::qsa
