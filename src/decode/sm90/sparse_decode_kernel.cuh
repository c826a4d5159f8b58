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
#include "sm90/wg_softmax.cuh"

// H = 128 crossover transport (A/B switch, default 1): 1 = the producer writes its 32 tokens into
// its own tile and one thread copies that contiguous 36 KB half into the peer CTA with one
// cp.async.bulk shared::cta -> shared::cluster (completing tx bytes on the peer's bar_remote);
// 0 = v2/v3: every producer thread also st.async's its 16-byte chunks to the peer (STAS measured at
// ~15 B/clk per SM: ~2,500 clk of producer time per 32-token round).
#ifndef SELKV_DECODE_XOVER_BULK
#define SELKV_DECODE_XOVER_BULK 1
#endif

namespace selkv::decode::sm90 {

inline constexpr bool kXoverBulk = SELKV_DECODE_XOVER_BULK != 0;

// Cycle probe (SELKV_DECODE_PROBE=1 builds only; never in the library default): thread 0 of the
// producer and of each consumer warpgroup accumulates clock64 deltas per phase and prints them
// for the first few CTAs that finish. Evidence for docs/perf-log.md.
#ifndef SELKV_DECODE_PROBE
#define SELKV_DECODE_PROBE 0
#endif
#if SELKV_DECODE_PROBE
__device__ int g_decode_probe_prints[2][3];  // [H / 64 - 1][producer, consumer 0, consumer 1]
// Print for the large grid shapes only (H=128: 256 rows, H=64: 64 rows), 3 CTAs per role.
template <int kNumHeads>
__device__ __forceinline__ bool probe_should_print(const DecodeKernelParams& p, int role) {
  return p.metadata[2] == (kNumHeads == 128 ? 256 : 64) &&
         atomicAdd(&g_decode_probe_prints[kNumHeads / 64 - 1][role], 1) < 3;
}
__device__ __forceinline__ unsigned long long probe_clk() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
#define SELKV_PROBE(...) __VA_ARGS__
#else
#define SELKV_PROBE(...)
#endif

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
    // Not clamped: the consumers only count blocks, and must count exactly the producer's
    // g1 - g0 blocks; the producer treats a block >= K / 64 (corrupt metadata) as fully invalid.
    w.blk_begin = g - rb;
    w.blk_end = end - rb;
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

// ---- cluster helpers (H = 128: a 2-CTA cluster shares the dequantized KV tile) --------------
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) { return cute::cast_smem_ptr_to_uint(ptr); }

// Address of the same shared-memory offset in CTA `rank` of the cluster (shared::cluster window).
__device__ __forceinline__ uint32_t map_smem_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// 16-byte store into the peer CTA's shared memory that completes 16 transaction bytes on the
// peer's mbarrier (both addresses in the shared::cluster window of the peer).
__device__ __forceinline__ void st_async_16(uint32_t remote_addr, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
          remote_addr),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

// Bulk copy of `bytes` (multiple of 16) from this CTA's smem to a peer CTA's smem (shared::cluster
// addresses), completing `bytes` transaction bytes on the peer's mbarrier. Async proxy: the
// source's generic-proxy writes must be fenced (fence.proxy.async) by their writers before.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t remote_dst, uint32_t local_src, uint32_t bytes,
                                                  uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(remote_dst),
      "r"(local_src), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// 16-byte load of the global record bytes at `gptr` when `valid`, else zeros with no memory
// access (an invalid index is never dereferenced). Deliberately a *generic* ld (LD.E.128, not
// LDG.E.128.CONSTANT): ptxas cannot prove it does not alias the producer's shared stores and
// st.async, so it keeps each load where the software pipeline puts it, right after the chunk whose
// registers it reuses. With ld.global.nc ptxas regroups the 11 loads of a round (all at the end
// of the previous round's conversion, or all before it), which costs either the loads' lead time
// or two rounds of records in registers (spills at the producer's 120 registers). Volatile asm
// with a memory clobber fixes the order in the PTX as well. Same bytes, same arithmetic.
__device__ __forceinline__ uint4 ld_16_pred(const void* gptr, int32_t valid) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(gptr), "r"(valid)
      : "memory");
  return v;
}

// ---- producer warpgroup ---------------------------------------------------------------------
// The producer walks the part's blocks in rounds of 32 tokens (H = 64: two rounds per block, the
// CTA dequantizes all 64 tokens; H = 128: one round per block, CTA rank c of the cluster
// dequantizes tokens [32c, 32c + 32) and writes them into both CTAs' tiles). Thread mapping of a
// round: token tl = 8 * warp + lane % 8, quarter q = lane / 8. A thread loads, of its token's
// record, the 16-byte NoPE chunks at bytes 64 d + 16 q (d = 0..7: 8 independent 16-byte loads),
// the 4 scales (one 16-byte load) and the RoPE chunks q and q + 4 (2 x 16 bytes): 11 loads in
// flight per thread, each issued one round ahead of its conversion (software pipeline: indices
// two rounds ahead, records one round ahead, convert + store the current round; the loads of
// round n + 1 are interleaved with the conversion of round n, chunk by chunk, so that about one
// round of records, not two, is live in registers: no spills at 120 registers).
struct RoundRaw {
  uint4 nope[8];
  float4 sc;
  uint4 rope[2];
  int valid;
};

// Walks (row, block) of the part in block order; identical in every CTA of a cluster.
struct BlockCursor {
  const int32_t* prefix;
  int32_t g, g1, row, row_begin, row_end;

  __device__ __forceinline__ void init(const PartIter& it) {
    prefix = it.prefix;
    g = it.g0;
    g1 = it.g1;
    row = it.r;
    row_begin = prefix[row];
    row_end = prefix[row + 1];
  }
  __device__ __forceinline__ void advance() {
    ++g;
    while (g < g1 && g >= row_end) {
      ++row;
      row_begin = row_end;
      row_end = prefix[row + 1];
    }
  }
};

template <int kNumHeads, bool kDynamic>
__device__ __forceinline__ void run_producer(const DecodeKernelParams& p, SharedStorage& ss,
                                             const PartIter& it, uint32_t rank) {
  constexpr int kCluster = kNumHeads == 128 ? 2 : 1;
  constexpr int kRounds = 2 / kCluster;  // rounds of 32 tokens per block in this CTA
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int q = lane >> 3, l7 = lane & 7;
  const int tl = warp * 8 + l7;  // token of the round (0..31)
  const int32_t max_blocks = p.topk / kBlockN;
  const int32_t total_rounds = (it.g1 - it.g0) * kRounds;

  // smem element offsets within a K tile (k_tile_offset, loop invariant): token row base of
  // token tl (+ 4 row groups per 32-token half), the two swizzled 16-byte chunks of NoPE quarter q
  // in each 64-dim atom, and the two RoPE chunks q, q + 4.
  const int row_base = warp * kKRowGroupStride + l7 * 64;
  const int c0 = ((2 * q) ^ l7) << 3, c1 = ((2 * q + 1) ^ l7) << 3;
  const int r0 = (kDimNope / 64) * 512 + ((q ^ l7) << 3), r1 = (kDimNope / 64) * 512 + (((q + 4) ^ l7) << 3);
  constexpr int kHalfOff = (32 / 8) * kKRowGroupStride;  // tokens [32, 64)
  uint32_t peer_smem = 0;
  if constexpr (kCluster == 2) peer_smem = map_smem_to_rank(smem_u32(&ss), rank ^ 1u);

  BlockCursor cur;
  cur.init(it);
  int stage_round = 0;  // round (within its block) of the cursor's next index load

  // Index stage: the index of this thread's token in the cursor's round (and, H = 128, the
  // index of the same position in the peer's half, for the validity flags). A position past
  // the row's top-k length (dynamic) or a clamped block is not loaded and reads as -1, which the
  // validity test (idx >= 0 && idx < num_slots) rejects exactly as the explicit length test did.
  auto load_index = [&](int32_t& idx, int32_t& idx2) {
    idx = -1; idx2 = -1;
    if (cur.g >= cur.g1) return;
    const int32_t row = cur.row, blk = cur.g - cur.row_begin;
    const int32_t b = row / p.seq_q, s = row - b * p.seq_q;
    const int tok = 32 * (kCluster == 2 ? int(rank) : stage_round) + tl;
    if (blk < max_blocks) {  // clamped: never past K / 64, whatever the metadata
      const int32_t* idx_row = p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride + blk * kBlockN;
      int32_t len = p.topk;
      if constexpr (kDynamic) {
        len = __ldg(p.topk_length + b);
        len = len < 0 ? 0 : (len > p.topk ? p.topk : len);
      }
      // blk < K / 64, so the fixed kernel's positions are all < K = len: no tail predicate there.
      if (!kDynamic || blk * kBlockN + tok < len) idx = __ldg(idx_row + tok);
      if constexpr (kCluster == 2) {
        if (q == 1) {
          const int tok2 = 32 * int(rank ^ 1u) + tl;
          if (!kDynamic || blk * kBlockN + tok2 < len) idx2 = __ldg(idx_row + tok2);
        }
      }
    }
    if (++stage_round == kRounds) {
      stage_round = 0;
      cur.advance();
    }
  };

  // Data stage, address half: validity and record address of a round (the address is only formed
  // for a valid token; an invalid token is never dereferenced, its data stays zero).
  auto record_of = [&](int32_t idx, int32_t& valid) -> const uint8_t* {
    valid = idx >= 0 && int64_t(idx) < p.num_slots;
    const uint8_t* rec = p.cache;
    if (valid) {
      const uint32_t blk_id = uint32_t(idx) / uint32_t(p.page_size);
      const uint32_t in_page = uint32_t(idx) - blk_id * uint32_t(p.page_size);
      rec += int64_t(blk_id) * p.block_stride_bytes + int64_t(in_page) * fmt::kDsMlaRecordBytes;
    }
    return rec;
  };
  // Data stage, load half: one 16-byte load (zeros for an invalid token: never loaded).
  auto load16 = [&](const uint8_t* rec, int32_t valid, int byte_off) -> uint4 {
    return ld_16_pred(rec + byte_off, valid);
  };
  auto load_scales = [&](const uint8_t* rec, int32_t valid) -> float4 {
    const uint4 v = ld_16_pred(rec + fmt::kScaleOffset, valid);
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  };
  // All loads of one round at once (prologue: round 0).
  auto issue_loads = [&](int32_t idx, RoundRaw& r) {
    const uint8_t* rec = record_of(idx, r.valid);
    CUTE_UNROLL
    for (int d = 0; d < 8; ++d) r.nope[d] = load16(rec, r.valid, fmt::kNopeOffset + 64 * d + 16 * q);
    r.sc = load_scales(rec, r.valid);
    r.rope[0] = load16(rec, r.valid, fmt::kRopeOffset + 16 * q);
    r.rope[1] = load16(rec, r.valid, fmt::kRopeOffset + 16 * (q + 4));
  };

  // Convert stage: dequantize round n from `r` into the K tile (both CTAs' tiles for H = 128),
  // and issue the loads of round n + 1 into `nx` (record `nrec`, validity nx.valid, set by the
  // caller) interleaved with it: NoPE chunk d of round n + 1 is loaded right after chunk d of
  // round n has been converted, into the registers that just died, so only about one round of
  // raw records is live at a time (v2 issued all 11 loads of round n + 1 before converting round
  // n: two rounds, ~90 registers, live at once -> spills at 120 registers). Every load still
  // has a full round of lead before its use. The arithmetic is unchanged.
  SELKV_PROBE(unsigned long long pr_empty = 0;)
  auto convert = [&](int32_t n, const RoundRaw& r, int32_t idx2v, RoundRaw& nx, const uint8_t* nrec) {
    const int32_t blkn = n / kRounds, rin = n - (n / kRounds) * kRounds;
    const int buf = blkn & 1;
    const uint32_t phase = uint32_t(blkn >> 1) & 1u;
    if (rin == 0) {
      SELKV_PROBE(const unsigned long long pe0 = probe_clk();)
      cutlass::arch::ClusterBarrier::wait(&ss.bar_empty[buf], phase ^ 1u);
      SELKV_PROBE(pr_empty += probe_clk() - pe0;)
      // The wait asm has no memory clobber: keep every smem store of this round below it.
      asm volatile("" ::: "memory");
      if constexpr (kCluster == 2) {
        // This CTA's half of the tile arrives from the peer: expect its bytes (after the empty
        // wait, so the previous phase of bar_remote has completed).
        constexpr uint32_t kTxBytes = uint32_t(kTokensPerConsumer * kDimQK * sizeof(bf16_t));
        if (threadIdx.x == 0)
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.bar_remote[buf], kTxBytes);
      }
    }
    nx.sc = load_scales(nrec, nx.valid);  // needed first in round n + 1 (after the wait: fewer live registers there)
    const int half = kCluster == 2 ? int(rank) : int(rin);
    const int base = half * kHalfOff + row_base;
    bf16_t* sk = ss.k[buf];
    uint32_t peer_k = 0, peer_bar = 0;
    if constexpr (kCluster == 2) {
      peer_k = peer_smem + uint32_t(reinterpret_cast<uint8_t*>(sk) - reinterpret_cast<uint8_t*>(&ss));
      peer_bar = peer_smem + uint32_t(reinterpret_cast<uint8_t*>(&ss.bar_remote[buf]) - reinterpret_cast<uint8_t*>(&ss));
    }
    constexpr bool kStAsyncToPeer = kCluster == 2 && !kXoverBulk;
    auto store_local = [&](int off, uint4 v) { *reinterpret_cast<uint4*>(sk + off) = v; };
    CUTE_UNROLL
    for (int d = 0; d < 8; ++d) {
      const float s = (d >> 1) == 0 ? r.sc.x : (d >> 1) == 1 ? r.sc.y : (d >> 1) == 2 ? r.sc.z : r.sc.w;
      const uint2 a = dequant4(r.nope[d].x, s);
      const uint2 bq = dequant4(r.nope[d].y, s);
      const uint2 c = dequant4(r.nope[d].z, s);
      const uint2 e = dequant4(r.nope[d].w, s);
      const uint4 lo = make_uint4(a.x, a.y, bq.x, bq.y), hi = make_uint4(c.x, c.y, e.x, e.y);
      const int o0 = base + d * 512 + c0, o1 = base + d * 512 + c1;
      store_local(o0, lo);
      store_local(o1, hi);
      if constexpr (kStAsyncToPeer) {
        st_async_16(peer_k + 2u * uint32_t(o0), lo, peer_bar);
        st_async_16(peer_k + 2u * uint32_t(o1), hi, peer_bar);
      }
      nx.nope[d] = load16(nrec, nx.valid, fmt::kNopeOffset + 64 * d + 16 * q);
    }
    store_local(base + r0, r.rope[0]);
    store_local(base + r1, r.rope[1]);
    if constexpr (kStAsyncToPeer) {
      st_async_16(peer_k + 2u * uint32_t(base + r0), r.rope[0], peer_bar);
      st_async_16(peer_k + 2u * uint32_t(base + r1), r.rope[1], peer_bar);
    }
    nx.rope[0] = load16(nrec, nx.valid, fmt::kRopeOffset + 16 * q);
    nx.rope[1] = load16(nrec, nx.valid, fmt::kRopeOffset + 16 * (q + 4));
    // Validity bits of the block (bit t = token t): lanes 0-7 (q == 0) hold this CTA's tokens of
    // the warp, lanes 8-15 (q == 1) the peer half's (H = 128); one byte per 8 tokens.
    {
      const uint32_t own = __ballot_sync(0xffffffffu, q == 0 && r.valid);
      if (lane == 0) ss.kv_valid_bits[buf][4 * half + warp] = uint8_t(own);
      if constexpr (kCluster == 2) {
        const uint32_t peer = __ballot_sync(0xffffffffu, q == 1 && idx2v);
        if (lane == 0) ss.kv_valid_bits[buf][4 * int(rank ^ 1u) + warp] = uint8_t(peer >> 8);
      }
    }
    if (rin == kRounds - 1) {
      // Generic-proxy smem writes -> visible to wgmma and the bulk copy (async proxy), then publish.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_full[buf]);
      if constexpr (kCluster == 2 && kXoverBulk) {
        // Every producer thread's half-tile stores are fenced: one thread ships the half.
        cutlass::arch::NamedBarrier::sync(128, uint32_t(NamedBar::kProducerHalfDone));
        if (threadIdx.x == 0) {
          const uint32_t off = uint32_t(half * kHalfOff) * uint32_t(sizeof(bf16_t));
          bulk_copy_to_peer(peer_k + off, smem_u32(sk) + off, uint32_t(kHalfOff * sizeof(bf16_t)), peer_bar);
        }
      }
    }
  };

  auto valid2 = [&](int32_t idx2) -> int32_t { return idx2 >= 0 && int64_t(idx2) < p.num_slots; };

  SELKV_PROBE(const unsigned long long pt0 = probe_clk();)
  // Prologue: indices of rounds 0 and 1, records of round 0.
  int32_t ia, ia2;  // round n + 1 (index arrived or in flight)
  int32_t ib, ib2;  // round n + 2
  RoundRaw x0, x1;
  int32_t v2_0 = 0, v2_1 = 0;
  load_index(ia, ia2);
  load_index(ib, ib2);
  issue_loads(ia, x0);
  v2_0 = valid2(ia2);
  ia = ib; ia2 = ib2;
  load_index(ib, ib2);

  // L2 prefetch of a round's record (index known two rounds ahead, registers not needed): the
  // register loads issued one round later then hit L2 instead of waiting a full DRAM latency.
  // Thread quarter q touches the record's 128-byte lines q and q + 4 (656 bytes span <= 7 lines:
  // q == 0 also touches the last byte's line).
  auto prefetch_record = [&](int32_t idx) {
    int32_t valid;
    const uint8_t* rec = record_of(idx, valid);
    if (valid) {
      const uintptr_t line0 = reinterpret_cast<uintptr_t>(rec) & ~uintptr_t(127);
      const uintptr_t last = (reinterpret_cast<uintptr_t>(rec) + fmt::kDsMlaRecordBytes - 1) & ~uintptr_t(127);
      const uintptr_t a = line0 + 128u * uintptr_t(q), b = line0 + 128u * uintptr_t(q + 4);
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      if (b <= last) asm volatile("prefetch.global.L2 [%0];" ::"l"(b));
    }
  };

  // One step: convert round n from `cx` while loading the records of round n + 1 into `nx`
  // (prefetching round n + 2's into L2), then the index of round n + 3.
  auto step = [&](int32_t n, RoundRaw& cx, int32_t& v2c, RoundRaw& nx, int32_t& v2n) {
    const bool more = n + 1 < total_rounds;
    const uint8_t* nrec = record_of(more ? ia : -1, nx.valid);  // !more: nothing loaded
    if (more) v2n = valid2(ia2);
    prefetch_record(ib);
    convert(n, cx, v2c, nx, nrec);
    ia = ib; ia2 = ib2;
    load_index(ib, ib2);
  };
#pragma unroll 1
  for (int32_t n = 0; n < total_rounds; n += 2) {
    step(n, x0, v2_0, x1, v2_1);
    if (n + 1 < total_rounds) step(n + 1, x1, v2_1, x0, v2_0);
  }
#if SELKV_DECODE_PROBE
  if (threadIdx.x == 0 && blockIdx.x == 0 && probe_should_print<kNumHeads>(p, 0)) {
    const unsigned long long tot = probe_clk() - pt0;
    printf("PROBE H%d producer part=%d rounds=%d total=%llu empty_wait=%llu per_round_busy=%llu\n", kNumHeads, int(blockIdx.y),
           int(total_rounds), tot, pr_empty, (tot - pr_empty) / (total_rounds > 0 ? total_rounds : 1));
  }
#endif
}

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

// Shared per-row state of the epilogue (both consumer warpgroups of one row).
struct RowStats {
  float m0, m1, l0, l1;
};

// Epilogue of one row for consumer `cw` (owns d_v [256 cw, 256 cw + 256)): normalize, then bf16
// out + lse (unsplit) or fp32 partial + partial lse (split).
template <int kNumHeads, typename TensorO>
__device__ __forceinline__ void store_row(const DecodeKernelParams& p, const RowWork& w, int cw, int lane,
                                          int r0, int r1, const RowStats& st, TensorO& tOrO) {
  constexpr float kNegInf = -INFINITY;
  const int32_t b = w.row / p.seq_q, s = w.row - (w.row / p.seq_q) * p.seq_q;
  const int head_base = int(blockIdx.x) * kBlockM;
  const bool any0 = st.l0 > 0.f, any1 = st.l1 > 0.f;
  const float lse0 = any0 ? st.m0 * p.sm_scale + logf(st.l0) : kNegInf;
  const float lse1 = any1 ? st.m1 * p.sm_scale + logf(st.l1) : kNegInf;
  float f0 = any0 ? 1.f / st.l0 : 0.f, f1 = any1 ? 1.f / st.l1 : 0.f;
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

// Q [64 heads x 576] of row `w` -> smem, by both consumer warpgroups (256 threads): 18 cp.async
// of 16 bytes per thread, all in flight at once (one DRAM latency per row, no registers). The
// caller guarantees every wgmma of the previous row has completed (the row-end barrier).
__device__ __forceinline__ void load_q_tile(const DecodeKernelParams& p, SharedStorage& ss, const RowWork& w) {
  const int tid_c = int(threadIdx.x) - 128;  // 0..255 over both consumers
  const int head_base = int(blockIdx.x) * kBlockM;
  const int32_t b = w.row / p.seq_q, s = w.row - (w.row / p.seq_q) * p.seq_q;
  const uint16_t* qrow = p.q + b * p.q_batch_stride + s * p.q_seq_stride;
  const uint32_t sq = smem_u32(ss.q);
  constexpr int kChunksPerHead = kDimQK / 8;  // 72 x 16 bytes
  constexpr int kIters = kBlockM * kChunksPerHead / kNumConsumerThreads;  // 18
  static_assert(kBlockM * kChunksPerHead % kNumConsumerThreads == 0);
#pragma unroll 1  // asynchronous copies: a rolled loop still has all 18 in flight, in few registers
  for (int u = 0; u < kIters; ++u) {
    const int c = u * kNumConsumerThreads + tid_c;
    const int h = c / kChunksPerHead, cc = c - (c / kChunksPerHead) * kChunksPerHead;
    selkv::sm90::cp_async_16(sq + 2u * uint32_t(k_tile_offset(h, cc * 8)),
                             qrow + int64_t(head_base + h) * p.q_head_stride + cc * 8, true);
  }
  selkv::sm90::cp_async_wait_all();
  cutlass::arch::fence_view_async_shared();  // cp.async writes are generic proxy; wgmma reads async
  cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kQReady));
}

// Wait until block `buf` (phase) is complete in this CTA: the local producer's part (bar_full),
// and for H = 128 the peer's part (bar_remote).
template <int kNumHeads>
__device__ __forceinline__ void wait_kv_tile(SharedStorage& ss, int buf, uint32_t phase) {
  cutlass::arch::ClusterBarrier::wait(&ss.bar_full[buf], phase);
  if constexpr (kNumHeads == 128) cutlass::arch::ClusterBarrier::wait(&ss.bar_remote[buf], phase);
}

// Return buffer `buf` to the producer(s): one arrival per consumer warp, on this CTA's and
// (H = 128) the peer's empty barrier (the peer's producer writes half of this tile).
template <int kNumHeads>
__device__ __forceinline__ void release_kv_tile(SharedStorage& ss, int buf, int lane) {
  __syncwarp();
  if constexpr (kNumHeads == 128) {
    cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf], 0u, uint32_t(lane == 0));
    cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf], 1u, uint32_t(lane == 0));
  } else {
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[buf]);
  }
}

// WG1: S, softmax, P, O_0 += P V_0.
template <int kNumHeads>
__device__ __forceinline__ void run_softmax_wg(const DecodeKernelParams& p, SharedStorage& ss, PartIter it) {
  const int tid_wg = int(threadIdx.x) - 128;
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;
  const float sl2 = p.sm_scale_log2;
  constexpr float kNegInf = -INFINITY;

  TiledMmaQK mma_qk;
  TiledMmaPVrs mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 36) descriptors
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  Tensor tOrP = make_tensor<bf16_t>(partition_shape_A(mma_pv, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  static_assert(decltype(size(tOrO))::value == 128);
  static_assert(decltype(size(tOrP))::value == 32);

  int buf = 0;
  uint32_t phase = 0;
  RowWork w;
  SELKV_PROBE(unsigned long long pc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; const unsigned long long ct0 = probe_clk();)
  while (it.next(w)) {
    load_q_tile(p, ss, w);
    clear(tOrO);
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;

    for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
      SELKV_PROBE(const unsigned long long c0 = probe_clk();)
      wait_kv_tile<kNumHeads>(ss, buf, phase);
      SELKV_PROBE(const unsigned long long c1 = probe_clk(); pc[0] += c1 - c0;)

      // S = Q K^T over 576 dims for the block's 64 tokens.
      Tensor sK = make_tensor(make_smem_ptr(ss.k[buf]), SmemLayoutK{});
      Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, 1, 36)
      Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
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
      SELKV_PROBE(const unsigned long long c2 = probe_clk(); pc[1] += c2 - c1;)

      // Mask invalid tokens (bit t of the block's mask = token t), row maxima over the quad.
      float mx0, mx1;
      selkv::sm90::wg_mask_rowmax64(tSrS, *reinterpret_cast<const uint64_t*>(ss.kv_valid_bits[buf]), lane, mx0, mx1);
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float mu0 = mn0 == kNegInf ? 0.f : mn0;  // nothing valid yet: keep exp2 finite
      const float mu1 = mn1 == kNegInf ? 0.f : mn1;
      const float sc0 = exp2f((m0 - mu0) * sl2), sc1 = exp2f((m1 - mu1) * sl2);
      const float base0 = mu0 * sl2, base1 = mu1 * sl2;
      m0 = mn0;
      m1 = mn1;

      // P = exp2(s * scale_log2 - m * scale_log2): row sums in fp32, P in bf16 registers.
      float ps0, ps1;
      selkv::sm90::wg_exp2_rows64(tSrS, sl2, base0, base1, ps0, ps1);
      l0 = l0 * sc0 + ps0;
      l1 = l1 * sc1 + ps1;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); i += 2) {
        const uint32_t v = bf16x2_bits(tSrS(i), tSrS(i + 1));
        *reinterpret_cast<uint32_t*>(&tOrP(i)) = v;
      }
      SELKV_PROBE(const unsigned long long c3 = probe_clk(); pc[2] += c3 - c2;)

      // Publish P and the rescale factors to WG2 (after it has finished with the previous ones).
      if (blk != w.blk_begin) cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kPFree));
      CUTE_UNROLL
      for (int i = 0; i < size(tOrP); i += 2) {
        const int row = ((i >> 1) & 1) ? r1 : r0;
        const int col = 8 * (i >> 2) + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(ss.p + p_tile_offset(row, col)) = *reinterpret_cast<const uint32_t*>(&tOrP(i));
      }
      if ((lane & 3) == 0) {
        ss.row_scale[r0] = sc0;
        ss.row_scale[r1] = sc1;
      }
      cutlass::arch::fence_view_async_shared();  // P tile: generic stores -> WG2's wgmma
      cutlass::arch::NamedBarrier::arrive(kNumConsumerThreads, uint32_t(NamedBar::kPReady));
      // Once the running maxima settle the factors are exactly 1: skip the 128 multiplies
      // (warp-uniform test; multiplying by 1 would give the same bits).
      if (__any_sync(0xffffffffu, sc0 != 1.f || sc1 != 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
      }
      SELKV_PROBE(const unsigned long long c4 = probe_clk(); pc[3] += c4 - c3;)

      // O_0 += P V_0 (V = first 512 dims of the same KV tile, read MN-major).
      Tensor sV = make_tensor(make_smem_ptr(ss.k[buf]), SmemLayoutVHalf{});
      Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, 1, 4)
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb), tOrO);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      SELKV_PROBE(const unsigned long long c5 = probe_clk(); pc[4] += c5 - c4;)

      release_kv_tile<kNumHeads>(ss, buf, lane);
      if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
      SELKV_PROBE(pc[5] += probe_clk() - c5; pc[6] += 1;)
    }

    // Row end: total row sums and maxima -> smem for WG2; the barrier also orders every wgmma of
    // this row before the next row's Q load.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if ((lane & 3) == 0) {
      ss.row_sum[r0] = l0;
      ss.row_sum[r1] = l1;
      ss.row_max[r0] = m0;
      ss.row_max[r1] = m1;
    }
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kRowSum));
    // WG2 reads row_sum / row_max right after kRowSum; WG1 rewrites them only after the next
    // row's kQReady barrier, which WG2 reaches after that read.
    store_row<kNumHeads>(p, w, 0, lane, r0, r1, RowStats{m0, m1, l0, l1}, tOrO);
  }
#if SELKV_DECODE_PROBE
  if (tid_wg == 0 && blockIdx.x == 0 && probe_should_print<kNumHeads>(p, 1)) {
    printf("PROBE H%d softmaxWG part=%d blocks=%llu total=%llu wait_full=%llu S=%llu softmax=%llu publishP=%llu PV=%llu release=%llu\n",
           kNumHeads, int(blockIdx.y), pc[6], probe_clk() - ct0, pc[0], pc[1], pc[2], pc[3], pc[4], pc[5]);
  }
#endif
}

// WG2: O_1 = O_1 * scale + P V_1.
template <int kNumHeads>
__device__ __forceinline__ void run_pv_wg(const DecodeKernelParams& p, SharedStorage& ss, PartIter it) {
  const int tid_wg = int(threadIdx.x) - 256;
  const int warp_wg = tid_wg / 32, lane = tid_wg % 32;
  const int r0 = warp_wg * 16 + lane / 4, r1 = r0 + 8;

  TiledMmaPV mma_pv;
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sP = make_tensor(make_smem_ptr(ss.p), SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4) descriptors
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDimVPerConsumer>>{});
  static_assert(decltype(size(tOrO))::value == 128);

  int buf = 0;
  uint32_t phase = 0;
  RowWork w;
  SELKV_PROBE(unsigned long long pc[4] = {0, 0, 0, 0}; const unsigned long long ct0 = probe_clk();)
  while (it.next(w)) {
    load_q_tile(p, ss, w);
    clear(tOrO);
    for (int32_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
      SELKV_PROBE(const unsigned long long c0 = probe_clk();)
      cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kPReady));
      // WG1 waited for this tile before publishing P; waiting here too is free and keeps the
      // async-proxy visibility chain explicit (producer fence -> mbarrier -> this thread).
      wait_kv_tile<kNumHeads>(ss, buf, phase);
      SELKV_PROBE(const unsigned long long c1 = probe_clk(); pc[0] += c1 - c0;)
      const float sc0 = ss.row_scale[r0], sc1 = ss.row_scale[r1];
      if (__any_sync(0xffffffffu, sc0 != 1.f || sc1 != 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
      }

      Tensor sV = make_tensor(make_smem_ptr(ss.k[buf] + kVHalfDimOffset), SmemLayoutVHalf{});
      Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, 1, 4)
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb), tOrO);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      SELKV_PROBE(pc[1] += probe_clk() - c1; pc[2] += 1;)

      release_kv_tile<kNumHeads>(ss, buf, lane);
      if (blk + 1 != w.blk_end) cutlass::arch::NamedBarrier::arrive(kNumConsumerThreads, uint32_t(NamedBar::kPFree));
      if (++buf == kNumKBufs) { buf = 0; phase ^= 1u; }
    }
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(NamedBar::kRowSum));
    const RowStats st{ss.row_max[r0], ss.row_max[r1], ss.row_sum[r0], ss.row_sum[r1]};
    store_row<kNumHeads>(p, w, 1, lane, r0, r1, st, tOrO);
  }
#if SELKV_DECODE_PROBE
  if (tid_wg == 0 && blockIdx.x == 0 && probe_should_print<kNumHeads>(p, 2)) {
    printf("PROBE H%d pvWG part=%d blocks=%llu total=%llu wait_P=%llu PV=%llu\n", kNumHeads, int(blockIdx.y), pc[2],
           probe_clk() - ct0, pc[0], pc[1]);
  }
#endif
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
  // grid (H / 64, parts); H = 128 runs as clusters of the two head groups of one part (cluster
  // rank == blockIdx.x). An empty part exits in both CTAs of its cluster, before any cluster sync.
  if (!it.init(p.metadata, int32_t(blockIdx.y), p.topk / kBlockN)) return;  // uniform
  constexpr int kCluster = kNumHeads == 128 ? 2 : 1;
  const uint32_t rank = kCluster == 2 ? uint32_t(blockIdx.x) : 0u;

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int i = 0; i < kNumKBufs; ++i) {
      cutlass::arch::ClusterBarrier::init(&ss.bar_full[i], 128);
      cutlass::arch::ClusterBarrier::init(&ss.bar_remote[i], 1);  // expect_tx + the peer's bytes
      cutlass::arch::ClusterBarrier::init(&ss.bar_empty[i], 8 * kCluster);  // consumer warps
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (kCluster == 2) {
    cute::cluster_arrive_relaxed();  // barriers of both CTAs initialized before any remote access
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  // Programmatic dependent launch: the combine kernel may be scheduled now; it waits
  // (griddepcontrol.wait) for this grid's completion and memory flush before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    run_producer<kNumHeads, kDynamic>(p, ss, it, rank);
  } else {
    if (wg == 1) {
      cutlass::arch::warpgroup_reg_alloc<kSoftmaxWgRegs>();
      run_softmax_wg<kNumHeads>(p, ss, it);
    } else {
      run_pv_wg<kNumHeads>(p, ss, it);  // stays at the launch budget (kPvWgRegs)
    }
  }
  if constexpr (kCluster == 2) {
    // No CTA exits while its peer may still write its smem or arrive on its barriers.
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
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
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kNumHeads / kBlockM, p.num_sm_parts, 1);
  cfg.blockDim = dim3(kNumThreads, 1, 1);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kNumHeads / kBlockM;  // H = 128: 2-CTA cluster
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = kNumHeads == 128 ? 1 : 0;
  err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

// How many clusters (H = 128) / CTAs (H = 64) of the decode kernel can be resident at once: the
// part count must not exceed it (a second wave would double the time).
template <int kNumHeads>
cudaError_t max_resident_sparse_decode_sm90(int* count) {
  auto kernel = &sparse_decode_sm90_kernel<kNumHeads, false>;
  constexpr int kSmem = int(sizeof(SharedStorage));
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kNumHeads / kBlockM, 132, 1);
  cfg.blockDim = dim3(kNumThreads, 1, 1);
  cfg.dynamicSmemBytes = kSmem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kNumHeads / kBlockM;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(count, kernel, &cfg);
}

}  // namespace selkv::decode::sm90
