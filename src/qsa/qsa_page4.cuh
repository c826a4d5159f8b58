// C8 SM90 page-4 kernel (selkv/qsa.h; group plan layout src/qsa/qsa_group_layout.h). A unit is a group
// of rows_per_cta consecutive query rows and one kv head: the (row, head) pairs of the unit are
// the M dimension (64) of the warpgroup MMA tiles, and every selected 4-token
// block is loaded once for all rows of the group that selected it.
//
// Grid. One CTA an SM, each taking an equal share of the call's tiles (p4_schedule): whole units
// write their rows; a unit cut by a share's end leaves each piece's partial result in the caller's
// workspace and the last piece to land merges them in piece order. Without a workspace a CTA takes
// the whole units that start in its share. The warps walk the same units in the same order, so
// the reader and load warps run into the next unit while the consumers finish the last.
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
  static constexpr int kSched = kBlkPb + kP4Ring * kP4Blocks * 8;  // P4Sched, then p4_schedule's scratch
  // kv_full[stage], kv_empty[stage], ring_full[ring], ring_empty[ring]
  static constexpr int kBars = kSched + 256;
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

__device__ __forceinline__ int32_t p4_rows(const QsaPage4Params& p, int32_t grp) {
  const int32_t row0 = grp * p.rows_per_cta;
  return p.num_rows - row0 < p.rows_per_cta ? p.num_rows - row0 : p.rows_per_cta;
}

__device__ __forceinline__ P4Group p4_group(const QsaPage4Params& p, int32_t grp, int32_t rows) {
  const int32_t* md = p.md;
  const int64_t K = p.max_blocks, C = group_capacity(K);
  const int32_t groups = int32_t((uint32_t(p.num_rows) + uint32_t(p.rows_per_cta) - 1u) / uint32_t(p.rows_per_cta));
  P4Group pg;
  pg.bad = rows >= 32 ? ~0u : (1u << rows) - 1u;
  if (md[0] != kGroupMagic || md[1] != p.num_rows || md[2] != p.max_blocks || md[3] != p.rows_per_cta ||
      md[4] != groups)
    return pg;
  const int4 e = *reinterpret_cast<const int4*>(md + group_table_offset() + 4 * int64_t(grp));
  if (int64_t(e.x) != int64_t(grp) * p.rows_per_cta * C || e.y < 0 || int64_t(e.y) > rows * C) return pg;
  pg.first = e.x;
  pg.count = e.y;
  pg.bad = uint32_t(e.z);
  return pg;
}

// A unit of work: the rows of group grp with kv head kvh (unit u = grp * Hkv + kvh). Its weight in
// the schedule is its tiles (p4_weight).
struct P4Unit {
  int32_t grp, kvh, row0, rows, tiles;
  P4Group pg;
};

__device__ __forceinline__ int32_t p4_tiles(const P4Group& pg) { return (pg.count + kP4Blocks - 1) / kP4Blocks; }
// A unit without blocks (a group the plan handed over, or all of whose rows are bad) still writes
// its rows: weighed as kP4EmptyUnitTiles tiles, so a share of many such units is not a straggler.
inline constexpr int kP4EmptyUnitTiles = 4;
__device__ __forceinline__ int64_t p4_weight(const P4Group& pg) {
  return p4_tiles(pg) > 0 ? p4_tiles(pg) : kP4EmptyUnitTiles;
}

__device__ __forceinline__ P4Unit p4_unit(const QsaPage4Params& p, int32_t u) {
  P4Unit un;
  un.grp = u / p.num_kv_heads;
  un.kvh = u - un.grp * p.num_kv_heads;
  un.row0 = un.grp * p.rows_per_cta;
  un.rows = p4_rows(p, un.grp);
  un.pg = p4_group(p, un.grp, un.rows);
  un.tiles = p4_tiles(un.pg);
  return un;
}

// DESIGN §2 on the plan too: a block outside the cache is never read, and flags its unit.
__device__ __forceinline__ bool p4_block_outside(const QsaPage4Params& p, int2 pbe) {
  const int64_t page = pbe.x, base = pbe.y;
  return page < 0 || page >= p.num_pages || base < 0 || base % 4 != 0 || base >= p.page_size;
}

// The CTA's share of the units' tiles. Unit u = grp * Hkv + kvh starts at tile Hkv * W(grp) +
// kvh * w(grp) (w: a group's weight, W: their prefix sums; T tiles in all). CTA c of N takes
// [T c / N, T (c + 1) / N) when units may split (split scratch given), else the units that start
// in it.
struct P4Sched {
  int64_t a, b;    // the share [a, b)
  int64_t total;   // T
  int64_t su;      // first tile of unit u
  int32_t u;       // the unit holding tile a
  uint32_t merge;  // the consumers' word: this CTA merges the unit it just split
};

// floor(a / b) for 0 <= a < 2^50, b > 0, without a subroutine call (a 64-bit or IEEE double
// division calls one, and calls in the kernel cost the consumers' loop its uniform-datapath
// descriptors): the approximate reciprocal, two Newton steps, then the quotient corrected.
__device__ __forceinline__ int64_t p4_div(int64_t a, int64_t b) {
  const double db = double(b);
  double r;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(db));
  r = fma(r, fma(-db, r, 1.0), r);
  r = fma(r, fma(-db, r, 1.0), r);
  int64_t q = int64_t(double(a) * r);
  q -= q * b > a ? 1 : 0;
  q -= q * b > a ? 1 : 0;
  q += (q + 1) * b <= a ? 1 : 0;
  q += (q + 1) * b <= a ? 1 : 0;
  return q;
}
__device__ __forceinline__ int64_t p4_share_begin(int64_t total, int64_t c) { return p4_div(total * c, int64_t(gridDim.x)); }
__device__ __forceinline__ int64_t p4_cta_of(int64_t total, int64_t x) {  // the CTA whose share holds tile x
  return p4_div((x + 1) * int64_t(gridDim.x) - 1, total);
}

// Whether CTA c's share holds a tile (with fewer tiles than CTAs some do not).
__device__ __forceinline__ bool p4_share_used(int64_t total, int64_t c) {
  return p4_share_begin(total, c) < p4_share_begin(total, c + 1);
}

// Every thread of the CTA, in rounds of kP4Threads groups (the same trip count in every thread,
// and no branch on the thread's data: code that diverges here would keep the consumers' loops
// out of the uniform datapath): the groups' weights summed, then scanned, and the thread whose
// group holds an end of the share records it. scratch: 128 bytes of shared memory.
__device__ __forceinline__ void p4_schedule(const QsaPage4Params& p, P4Sched* out, int64_t* scratch) {
  constexpr int kWarps = kP4Threads / 32;
  int64_t* const warp_sums = scratch;       // [kWarps]
  int64_t* const found = scratch + kWarps;  // su(ta), w(ta), su(tb), w(tb), the unit holding ta
  static_assert(kWarps + 5 <= 16, "p4_schedule's scratch");
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int64_t groups = (uint32_t(p.num_rows) + uint32_t(p.rows_per_cta) - 1u) / uint32_t(p.rows_per_cta);
  auto weight = [&](int64_t g) { return g < groups ? p4_weight(p4_group(p, int32_t(g), p4_rows(p, int32_t(g)))) : 0; };
  // The CTA's sum of x (every thread gets it).
  auto cta_sum = [&](int64_t x) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(~0u, x, d);
    __syncthreads();  // the last round's sums are read
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    int64_t sum = 0;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += warp_sums[v];
    return sum;
  };
  int64_t sum = 0;
  for (int64_t base = 0; base < groups; base += kP4Threads) sum += cta_sum(weight(base + tid));
  const int64_t H = p.num_kv_heads, T = H * sum;
  const int64_t ta = p4_share_begin(T, blockIdx.x), tb = p4_share_begin(T, int64_t(blockIdx.x) + 1);
  if (tid == 0) found[2] = -1;
  int64_t carry = 0;  // the weights of the rounds before
  for (int64_t base = 0; base < groups; base += kP4Threads) {
    const int64_t g = base + tid, w = weight(g);
    int64_t incl = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t y = __shfl_up_sync(~0u, incl, d);
      incl += lane >= d ? y : 0;
    }
    __syncthreads();
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int64_t before = carry + incl - w, round = 0;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      before += v < warp ? warp_sums[v] : 0;
      round += warp_sums[v];
    }
    carry += round;
    // The unit holding tile x of group g (weight w > 0: the group exists) and its first tile.
    const int64_t s0 = H * before, s1 = H * (before + w);
    if (w > 0 && ta >= s0 && ta < s1) {
      const int64_t kvh = p4_div(ta - s0, w);
      found[0] = s0 + kvh * w;
      found[1] = w;
      found[4] = g * H + kvh;
    }
    if (w > 0 && tb >= s0 && tb < s1) {
      const int64_t kvh = p4_div(tb - s0, w);
      found[2] = s0 + kvh * w;
      found[3] = w;
    }
  }
  __syncthreads();
  if (tid == 0) {
    P4Sched s;
    s.total = T;
    s.merge = 0u;
    if (p.split_ws != nullptr) {
      s.a = ta;
      s.b = tb;
      s.u = int32_t(found[4]);
      s.su = found[0];
    } else {  // whole units: those that start in [ta, tb)
      const bool at = found[0] == ta;
      s.a = at ? ta : found[0] + found[1];
      s.u = int32_t(at ? found[4] : found[4] + 1);
      s.su = s.a;
      s.b = found[2] < 0 ? T : found[2] == tb ? tb : found[2] + found[3];
    }
    *out = s;
  }
  __syncthreads();
}

// Calls f(unit, lo, hi, su, w) for every unit overlapping the share, in order: [lo, hi) is the
// share's part of the unit's w weight tiles (whole: lo == 0 and hi == w), su its first tile.
template <class F>
__device__ __forceinline__ void p4_for_each_unit(const QsaPage4Params& p, const P4Sched& sc, F&& f) {
  const int32_t units =
      int32_t((uint32_t(p.num_rows) + uint32_t(p.rows_per_cta) - 1u) / uint32_t(p.rows_per_cta)) * p.num_kv_heads;
  int64_t su = sc.su;
  for (int32_t u = sc.u; su < sc.b && u < units; ++u) {
    const P4Unit un = p4_unit(p, u);
    const int64_t w = p4_weight(un.pg);
    const int32_t lo = int32_t((sc.a > su ? sc.a : su) - su), hi = int32_t((sc.b < su + w ? sc.b : su + w) - su);
    if (lo < hi) f(un, lo, hi, su, w);  // (an empty share holds no piece of the unit it points into)
    su += w;
  }
}

// The reader warp: tile t of a unit's descriptor is its blocks [8 t, 8 t + 8) of the plan. Lanes
// 0-7 copy one block's token words each (16 bytes, zero-filled past the count, so the consumers'
// words of unused slots are 0), lanes 8-15 its page and slot base (8 bytes); every lane's
// arrival on ring_full completes when its copies land, so the reader never waits for them. gt:
// the CTA's tiles so far (ring slots and phases run on across units).
template <int D>
__device__ __forceinline__ void p4_read(const QsaPage4Params& p, uint8_t* smem, const P4Sched& sc) {
  using L = P4Layout<D>;
  const int lane = int(threadIdx.x) % 32;
  const int64_t R = p.num_rows, K = p.max_blocks;
  const uint32_t ring_full = sm90::smem_addr(smem + L::kRingFull), ring_empty = sm90::smem_addr(smem + L::kRingEmpty);
  uint32_t gt = 0;
  p4_for_each_unit(p, sc, [&](const P4Unit& un, int32_t lo, int32_t hi, int64_t, int64_t) {
    const uint4* tokw = reinterpret_cast<const uint4*>(p.md + group_tokw_offset(R, K)) + un.pg.first;
    const int2* pb = reinterpret_cast<const int2*>(p.md + group_blocks_offset(R)) + un.pg.first;
    const int32_t t1 = hi < un.tiles ? hi : un.tiles;
    for (int32_t t = lo; t < t1; ++t, ++gt) {
      const uint32_t e = gt % kP4Ring;
      sm90::mbar_wait(ring_empty + 8u * e, ((gt / kP4Ring) & 1u) ^ 1u);  // its last tile is done
      const int k = kP4Blocks * t + (lane % kP4Blocks);
      if (lane < kP4Blocks) {
        sm90::cp_async_16(sm90::smem_addr(smem + L::kTokw) + (e * kP4Tokens + 4 * uint32_t(lane)) * 4u, tokw + k,
                          k < un.pg.count);
      } else if (lane < 2 * kP4Blocks && k < un.pg.count) {
        sm90::cp_async_8(sm90::smem_addr(smem + L::kBlkPb) + (e * kP4Blocks + uint32_t(lane - kP4Blocks)) * 8u, pb + k);
      }
      sm90::cp_async_arrive(ring_full + 8u * e);
    }
  });
}

// The load warps: for each tile descriptor, copy the used tokens' K and V rows into the stage.
// Lane l copies 16-byte chunk l % (D / 8) of token rows; a block's page and slot base are read
// once (shared-memory broadcasts) and its four rows issue back to back, so consecutive blocks'
// copies overlap (no per-token shuffles on the critical path).
template <int D>
__device__ __forceinline__ void p4_load(const QsaPage4Params& p, uint8_t* smem, const P4Sched& sc, int load_warp) {
  using L = P4Layout<D>;
  constexpr int kChunks = D / 8;              // 16-byte chunks of a row: 32 (D 256) or 16 (D 128)
  constexpr int kRowsPerCopy = 32 / kChunks;  // token rows one warp-wide copy covers: 1 or 2
  const int lane = int(threadIdx.x) % 32;
  const int c = lane % kChunks, sub = lane / kChunks;
  const int64_t kpage = p.io.k_page_stride * 2, kslot = p.io.k_slot_stride * 2;
  const int64_t vpage = p.io.v_page_stride * 2, vslot = p.io.v_slot_stride * 2;
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
  uint32_t gt = 0;
  p4_for_each_unit(p, sc, [&](const P4Unit& un, int32_t lo, int32_t hi, int64_t, int64_t) {
    // This lane's chunk of its first row (row `sub` of a block) in the unit's kv head: one 64-bit
    // address per block and cache, then an add per row.
    const char* kbase = static_cast<const char*>(p.io.k) + int64_t(un.kvh) * p.io.k_head_stride * 2 + c * 16 + sub * kslot;
    const char* vbase = static_cast<const char*>(p.io.v) + int64_t(un.kvh) * p.io.v_head_stride * 2 + c * 16 + sub * vslot;
    const int32_t t1 = hi < un.tiles ? hi : un.tiles;
    for (int32_t t = lo; t < t1; ++t, ++gt) {
      const uint32_t e = gt % kP4Ring, s = gt % kP4Stages;
      sm90::mbar_wait(ring_full + 8u * e, (gt / kP4Ring) & 1u);
      const int nb = un.pg.count - kP4Blocks * t < kP4Blocks ? un.pg.count - kP4Blocks * t : kP4Blocks;
      const uint32_t* tokw = reinterpret_cast<const uint32_t*>(smem + L::kTokw) + e * kP4Tokens;
      const int2* blk_pb = reinterpret_cast<const int2*>(smem + L::kBlkPb) + e * kP4Blocks;
      sm90::mbar_wait(kv_empty + 8u * s, ((gt / kP4Stages) & 1u) ^ 1u);
      const uint32_t kst = sm90::smem_addr(smem + L::kK + s * L::kStageBytes);
      const uint32_t vst = kst + uint32_t(L::kTileBytes);
#pragma unroll 4
      for (int b = load_warp; b < nb; b += kP4LoadWarps) {  // this warp's blocks of the tile
        uint4 w = *reinterpret_cast<const uint4*>(tokw + 4 * b);
        const int2 pbe = blk_pb[b];
        if (p4_block_outside(p, pbe)) w = make_uint4(0u, 0u, 0u, 0u);  // the consumers flag the unit
        const int64_t page = pbe.x, base = pbe.y;
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
      sm90::mbar_arrive(ring_empty + 8u * e);   // done with the descriptor
      sm90::cp_async_arrive(kv_full + 8u * s);  // the stage is full once this lane's copies land
    }
  });
}

template <typename T, int D>
__global__ void __launch_bounds__(kP4Threads, 1) qsa_page4_kernel(const QsaPage4Params p) {
  using L = P4Layout<D>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const float kNegInf = -__int_as_float(0x7F800000);
  // The warp index, warp-uniform to the compiler (a shuffle from lane 0): the role branches and
  // `active` then keep the consumers' loops convergent code (uniform-datapath descriptors).
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0), lane = int(threadIdx.x) % 32;
  const int G = p.group;

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
    sm90::fence_mbarrier_init();
  }
  P4Sched* const sched = reinterpret_cast<P4Sched*>(smem + L::kSched);
  p4_schedule(p, sched, reinterpret_cast<int64_t*>(smem + L::kSched + 128));  // ends with a CTA barrier
  // The share, warp-uniform to the compiler (shuffles from lane 0): the units' loops then stay
  // convergent code, whose descriptors and offsets live in uniform registers.
  P4Sched sc = *sched;
  sc.a = __shfl_sync(~0u, sc.a, 0);
  sc.b = __shfl_sync(~0u, sc.b, 0);
  sc.total = __shfl_sync(~0u, sc.total, 0);
  sc.su = __shfl_sync(~0u, sc.su, 0);
  sc.u = __shfl_sync(~0u, sc.u, 0);

  if (warp == kP4ReadWarp) {
    p4_read<D>(p, smem, sc);
    return;
  }
  if (warp >= kP4LoadWarp) {
    p4_load<D>(p, smem, sc, warp - kP4LoadWarp);
    return;
  }

  // ---- consumers: one warpgroup; warp w holds pairs [16 w, 16 w + 16) of the MMA tiles' 64 rows,
  // pair = row_in_group * G + head ----
  const int tid = int(threadIdx.x);
  const int pair0 = warp * 16 + lane / 4, pair1 = pair0 + 8;

  float o[D / 8][4];  // the m64nDk16 accumulator fragment: o[i] holds columns 8 i + 2 (lane % 4) + {0, 1}
  float m0, m1, l0, l1;  // rows lane / 4 and lane / 4 + 8 of the warp
  float sc_acc[2 * kP4Chunks][4];                // S of one tile (the m64n32k16 accumulator fragment)
  uint32_t pa[kP4Chunks][4], pb[kP4Chunks][4];  // P of alternate tiles (P V of one runs while the next is made)
  float a0 = 1.f, a1 = 1.f;                     // the rescale of O the last softmax asked for
  uint32_t gt = 0;                              // the CTA's tiles so far (stage and ring slots, phases)

  p4_for_each_unit(p, sc, [&](const P4Unit& un, int32_t lo, int32_t hi, int64_t su, int64_t w) {
    // Descriptors of Q and of stage 0's K and V tiles (the others are a 32-bit add away), made in
    // the unit's scope so the compiler keeps them in uniform registers.
    const wg::Desc q_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kQ), 16, 1024);
    const wg::Desc k_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kK), 16, 1024);
    const wg::Desc v_desc = wg::desc_sw128(sm90::smem_addr(smem + L::kV), L::kPanelBytes, 1024);
    const int pairs = un.rows * G;
    const bool active = warp * 16 < pairs;
    const uint32_t bit0 = pair0 < pairs ? 1u << (pair0 / G) : 0u;
    const uint32_t bit1 = pair1 < pairs ? 1u << (pair1 / G) : 0u;
    const int32_t t0 = lo < un.tiles ? lo : un.tiles, t1 = hi < un.tiles ? hi : un.tiles;
    const int tiles = t1 - t0;
    // Warp-uniform to the compiler (a shuffle from lane 0), so the stage and ring offsets and the
    // wgmma descriptors stay in uniform registers.
    const uint32_t gt0 = __shfl_sync(~0u, gt, 0);
    gt += uint32_t(tiles);

    // Q with cp.async, every copy of the thread in flight at once (pairs past the unit's: zeros),
    // once the last unit's wgmmas retired in every warp.
    asm volatile("bar.sync 1, %0;\n" ::"n"(kP4ConsumerThreads) : "memory");
    for (int i = tid; tiles > 0 && i < kQsaPage4Pairs * (D / 8); i += kP4ConsumerThreads) {  // (no tile: no Q)
      const int pr = i / (D / 8), c = i % (D / 8);
      const T* src = static_cast<const T*>(p.io.q);
      if (pr < pairs) {
        const int64_t row = un.row0 + pr / G, head = int64_t(un.kvh) * G + pr % G;
        src += row * p.io.q_row_stride + head * p.io.q_head_stride + c * 8;
      }
      sm90::cp_async_16(sm90::smem_addr(smem + L::kQ + wg::sw128_offset(kQsaPage4Pairs, pr, c)), src, pr < pairs);
    }
    // While Q lands: DESIGN §2 on the plan too. A block of this piece outside the cache is never
    // read (the load warps skip it) and flags the unit; checked here once, not per tile.
    int outside = 0;
    {
      const int2* pb = reinterpret_cast<const int2*>(p.md + group_blocks_offset(p.num_rows)) + un.pg.first;
      const int32_t k1 = un.pg.count < kP4Blocks * t1 ? un.pg.count : kP4Blocks * t1;
      for (int32_t base = kP4Blocks * t0; base < k1; base += kP4ConsumerThreads) {
        const int32_t k = base + tid;
        if (k < k1 && p4_block_outside(p, __ldg(pb + k))) outside = 1;
      }
    }
    sm90::cp_async_wait_all();
    sm90::fence_proxy_async();  // Q and the V tiles' zeros (generic proxy) before wgmma reads them
    int any_outside;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n barrier.red.or.pred q, 1, %2, p;\n selp.s32 %0, 1, 0, q;\n}\n"
        : "=r"(any_outside)
        : "r"(outside), "n"(kP4ConsumerThreads)
        : "memory");
    bool corrupt = any_outside != 0;

#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m0 = m1 = kNegInf;
    l0 = l1 = 0.f;

    // S = Q K^T of local tile t (64 pairs x kP4Tokens tokens) once its stage landed, committed, not
    // waited: D / 16 steps of 16 columns, 32 bytes into a panel each.
    auto issue_s = [&](int t) {
      const uint32_t g = gt0 + uint32_t(t), s = g % kP4Stages, e = g % kP4Ring;
      sm90::mbar_wait(ring_full + 8u * e, (g / kP4Ring) & 1u);
      sm90::mbar_wait(kv_full + 8u * s, (g / kP4Stages) & 1u);
      sm90::fence_proxy_async();  // the stage's cp.async rows before wgmma reads them
      const wg::Desc kd = wg::desc_advance(k_desc, s * uint32_t(L::kStageBytes));
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t col = uint32_t((kk % 4) * 32);
        wg::ss_m64n32k16<T>(&sc_acc[0][0], wg::desc_advance(q_desc, uint32_t((kk / 4) * kQsaPage4Pairs * 128) + col),
                            wg::desc_advance(kd, uint32_t((kk / 4) * L::kPanelBytes) + col), kk > 0);
      }
      wg::commit();
    };
    // O += P V of local tile t: per 16-token step, D / 64 MMAs of 64 columns (one V panel each); committed.
    auto issue_pv = [&](int t, uint32_t (&pt)[kP4Chunks][4]) {
      const wg::Desc vd = wg::desc_advance(v_desc, ((gt0 + uint32_t(t)) % kP4Stages) * uint32_t(L::kStageBytes));
      wg::fence();
#pragma unroll
      for (int kc = 0; kc < kP4Chunks; ++kc) {
#pragma unroll
        for (int n = 0; n < D / 64; ++n)
          wg::rs_m64n64k16_mn<T>(&o[8 * n][0], pt[kc], wg::desc_advance(vd, uint32_t(n * L::kPanelBytes + kc * 16 * 128)));
      }
      wg::commit();
    };
    // The online softmax of local tile t's scores (sc_acc, landed) into P (out); a0 / a1: O's rescale.
    auto softmax = [&](int t, uint32_t (&out)[kP4Chunks][4]) {
      const uint32_t* tokw = reinterpret_cast<const uint32_t*>(smem + L::kTokw) + ((gt0 + uint32_t(t)) % kP4Ring) * kP4Tokens;
      // Membership: token 8 j + 2 (lane % 4) + e of the tile for the thread's two rows. The masked
      // raw scores go to x (sc_acc stays as the wgmma wrote it: it is the next S's input); the scale
      // (> 0, check_sm_scale) is applied to the max once and folded into each exponent's FFMA.
      const float scale = p.io.scale_log2;
      float x[2 * kP4Chunks][4];
      float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
      for (int j = 0; j < 2 * kP4Chunks; ++j) {
        const uint2 tw2 = *reinterpret_cast<const uint2*>(tokw + 8 * j + 2 * (lane % 4));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t tw = e == 0 ? tw2.x : tw2.y;
          const bool in0 = (tw & bit0) != 0u, in1 = (tw & bit1) != 0u;
          x[j][e] = in0 ? sc_acc[j][e] : kNegInf;
          x[j][2 + e] = in1 ? sc_acc[j][2 + e] : kNegInf;
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
    // Retires P V of local tile t (P in pt) and frees its stage and descriptor.
    auto retire_pv = [&](int t, uint32_t (&pt)[kP4Chunks][4]) {
      wg::wait<0>();
      wg::fence_regs<D / 2>(&o[0][0]);
      wg::fence_regs<4 * kP4Chunks>(&pt[0][0]);
      const uint32_t g = gt0 + uint32_t(t);
      sm90::mbar_arrive(kv_empty + 8u * (g % kP4Stages));
      sm90::mbar_arrive(ring_empty + 8u * (g % kP4Ring));
    };
    // One step: S of t + 1 and P V of t (P in cur) in flight, the softmax of t + 1 into next under
    // P V, then O's rescale. Every step commits the same two groups, so the compiler sees which one
    // wait<1> retires; P alternates between two register sets (a copy would let the compiler give
    // both one set, and then it serializes the wgmmas).
    auto step = [&](int t, uint32_t (&cur)[kP4Chunks][4], uint32_t (&next)[kP4Chunks][4]) {
      issue_s(t + 1);
      issue_pv(t, cur);
      wg::wait<1>();  // S of t + 1 (committed first) retired; P V of t may still run
      wg::fence_regs<8 * kP4Chunks>(&sc_acc[0][0]);
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

    // Software pipeline of one warpgroup: S of tile t + 1 and P V of tile t are in flight together,
    // and the softmax of t + 1 runs under P V of t; O takes t + 1's rescale once P V of t retired.
    if (tiles > 0) {
      issue_s(0);
      wg::wait<0>();
      wg::fence_regs<8 * kP4Chunks>(&sc_acc[0][0]);
      softmax(0, pa);  // O = 0: nothing to rescale
    }
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
    l0 += __shfl_xor_sync(~0u, l0, 1);
    l0 += __shfl_xor_sync(~0u, l0, 2);
    l1 += __shfl_xor_sync(~0u, l1, 1);
    l1 += __shfl_xor_sync(~0u, l1, 2);

    if (lo != 0 || hi != w) {  // a piece of a split unit: its partial result to its slot
      const int64_t T_ = sc.total;
      const int64_t c_first = p4_cta_of(T_, su), c_last = p4_cta_of(T_, su + w - 1);
      int64_t pieces = 0;  // CTAs in [c_first, c_last] with a share (those without one hold none of it)
      for (int64_t c = c_first; c <= c_last; ++c) pieces += p4_share_used(T_, c) ? 1 : 0;
      // A CTA's slot 0 holds its first unit's piece, slot 1 its last's.
      auto slot = [&](int64_t c) {
        return reinterpret_cast<float4*>(static_cast<uint8_t*>(p.split_ws) + kQsaPage4CounterBytes +
                                         (2 * c + (p4_share_begin(T_, c) < su ? 1 : 0)) * qsa_page4_slot_bytes(D));
      };
      float4* mine = slot(blockIdx.x);
      if (active) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) mine[i * kP4ConsumerThreads + tid] = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
        mine[(D / 8) * kP4ConsumerThreads + tid] = make_float4(m0, m1, l0, l1);
      }
      if (tid == 0) *reinterpret_cast<uint32_t*>(mine + (D / 8 + 1) * kP4ConsumerThreads) = corrupt ? 1u : 0u;
      __threadfence();
      asm volatile("bar.sync 1, %0;\n" ::"n"(kP4ConsumerThreads) : "memory");
      if (tid == 0) {
        unsigned int* counter = static_cast<unsigned int*>(p.split_ws) + c_first;
        const unsigned int before = atomicAdd(counter, 1u);
        *reinterpret_cast<volatile uint32_t*>(&sched->merge) = before + 1u == unsigned(pieces) ? 1u : 0u;
      }
      asm volatile("bar.sync 1, %0;\n" ::"n"(kP4ConsumerThreads) : "memory");
      if (*reinterpret_cast<volatile uint32_t*>(&sched->merge) == 0u) return;  // another piece merges
      __threadfence();
      // The last piece merges every piece's result in piece order (its own from its slot too).
      float mm0 = kNegInf, mm1 = kNegInf;
      corrupt = false;
      for (int64_t c = c_first; c <= c_last; ++c) {
        if (!p4_share_used(T_, c)) continue;
        const float4* s = slot(c);
        const float4 ml = __ldcg(s + (D / 8) * kP4ConsumerThreads + tid);
        mm0 = fmaxf(mm0, ml.x);
        mm1 = fmaxf(mm1, ml.y);
        corrupt = corrupt || __ldcg(reinterpret_cast<const unsigned int*>(s + (D / 8 + 1) * kP4ConsumerThreads)) != 0u;
      }
#pragma unroll
      for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
      l0 = l1 = 0.f;
      if (active) {
        for (int64_t c = c_first; c <= c_last; ++c) {
          if (!p4_share_used(T_, c)) continue;
          const float4* s = slot(c);
          const float4 ml = __ldcg(s + (D / 8) * kP4ConsumerThreads + tid);
          const float w0 = ml.x == kNegInf ? 0.f : sm90::exp2_ftz(ml.x - mm0);
          const float w1 = ml.y == kNegInf ? 0.f : sm90::exp2_ftz(ml.y - mm1);
          l0 = fmaf(ml.z, w0, l0);
          l1 = fmaf(ml.w, w1, l1);
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
            const float4 v = __ldcg(s + i * kP4ConsumerThreads + tid);
            o[i][0] = fmaf(v.x, w0, o[i][0]);
            o[i][1] = fmaf(v.y, w0, o[i][1]);
            o[i][2] = fmaf(v.z, w1, o[i][2]);
            o[i][3] = fmaf(v.w, w1, o[i][3]);
          }
        }
      }
      m0 = mm0;
      m1 = mm1;
    }
    if (!active) return;

    // ---- epilogue: out = O / l (0 for a pair without a member, NaN when flagged), lse = ln(sum exp) ----
    const uint32_t bad_rows = corrupt ? ~0u : un.pg.bad;
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
      const int64_t head = int64_t(un.kvh) * G + pr % G;
      T* dst = static_cast<T*>(p.io.out) + int64_t(un.row0 + rr) * p.io.out_row_stride + head * p.io.out_head_stride +
               2 * (lane % 4);
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        float x = o[i][2 * hr] * inv, y = o[i][2 * hr + 1] * inv;
        if (nan) x = y = qnan;
        else if (empty_row) x = y = 0.f;
        *reinterpret_cast<uint32_t*>(dst + 8 * i) = Elem<T>::pack(x, y);
      }
      if (p.io.lse != nullptr && lane % 4 == 0) {
        const float lse = nan ? qnan : empty_row ? kNegInf : m * 0.69314718055994530942f + logf(l);
        p.io.lse[int64_t(un.row0 + rr) * p.io.lse_row_stride + head * p.io.lse_head_stride] = lse;
      }
    }
  });
}

// ctas: the persistent grid (qsa_api.cpp: one CTA an SM, at most kQsaPage4MaxCtas; without split
// scratch at most the units). With split scratch its arrival counters are zeroed first.
template <typename T, int D>
cudaError_t launch_qsa_page4(const QsaPage4Params& p, int ctas, cudaStream_t stream) {
  constexpr int kSmem = P4Layout<D>::kBytes;
  static_assert(kSmem <= 227 * 1024, "page-4 CTA shared memory");
  if (p.num_rows <= 0) return cudaSuccess;
  if (ctas < 1 || ctas > kQsaPage4MaxCtas) return cudaErrorInvalidConfiguration;
  cudaError_t err = selkv::detail::set_max_dynamic_smem_once<&qsa_page4_kernel<T, D>>(kSmem);
  if (err != cudaSuccess) return err;
  if (p.split_ws != nullptr) {
    err = cudaMemsetAsync(p.split_ws, 0, kQsaPage4CounterBytes, stream);
    if (err != cudaSuccess) return err;
  }
  qsa_page4_kernel<T, D><<<dim3{unsigned(ctas)}, dim3{unsigned(kP4Threads)}, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace selkv::qsa
