// Producer warpgroup of the SM90 decode: indices -> validity -> FP8 records -> bf16 K tile ring
// (docs/decode-design.md §2).
#pragma once

#include <cutlass/arch/barrier.h>

#include <type_traits>

#include "decode/sm90/config.h"
#include "decode/sm90/part_iter.cuh"
#include "decode/sm90/primitives.cuh"
#include "decode/sm90/timeline.cuh"
#include "formats/device_codec.cuh"

namespace selkv::decode::sm90 {

// ---- producer warpgroup ---------------------------------------------------------------------
// The producer walks the part's blocks in rounds of 32 tokens (H = 64: two rounds per block, the
// CTA dequantizes all 64 tokens; H = 128: one round per block, CTA rank c of the cluster
// dequantizes tokens [32c, 32c + 32) and writes them into both CTAs' tiles). Index mapping of a
// round: lane 8 q + l7 of warp w loads the index of token tl = 8 w + l7 (quarter q = lane / 8).
// Data mapping (ds_mla_fp8, paged or packed): the lane converts two tokens of its warp's eight,
// 8 w + q and 8 w + q + 4; of each it loads the 16-byte NoPE pieces at bytes 128 k + 16 l7 (k =
// 0..3: eight lanes read a token's 128 contiguous bytes, a warp four tokens' 512), the token's
// scales (one 16-byte load) and RoPE chunk l7: 12 loads in flight per thread, each issued one
// round ahead of its conversion (software pipeline: indices two rounds ahead, records one round
// ahead, convert + store the current round; the loads of round n + 1 are interleaved with the
// conversion of round n, piece by piece, so that about one round of records, not two, is live in
// registers). A load instruction covers whole 128-byte lines where one token's quarter per lane
// covered half lines (docs/perf-log.md: packed lane mapping, native lane mapping).
struct RoundRawPair {
  uint4 nope[8];  // piece k of token X at nope[4 X + k]
  float4 sc[2];
  uint4 rope[2];
  int valid;    // token 8w + q
  int valid_b;  // token 8w + q + 4
};
// model1_fp8 (DecodeLayout<kModel1Fp8>): one token a lane (tl); of its 448 NoPE bytes the 16-byte
// chunks at 64 d + 16 q (d = 0..6, one UE8M0 scale each), its 8 scale bytes (one 8-byte load from
// the page tail) and the RoPE chunks q and q + 4.
struct RoundRawModel1 {
  uint4 nope[7];
  uint2 sc;
  uint4 rope[2];
  int valid;
};
template <class L>
using RoundRawOf = std::conditional_t<L::kFormat == KvFormat::kModel1Fp8, RoundRawModel1, RoundRawPair>;
// The cache a round reads (model1_fp8 kernels: 0 main, 1 extra); nothing for the others.
struct NoExtra {};

// Dynamic model1_fp8 kernels, batch <= kPreloadedBatch: lane b's batch entry b of the plan's
// extra-length snapshot (0 past the batch), loaded at kernel entry beside the part entry instead
// of after it, so the producer's first index load waits on one metadata round trip, not two.
inline constexpr int32_t kPreloadedBatch = 32;  // one warp's lanes
__device__ __forceinline__ int32_t preload_extra_lengths(const DecodeKernelParams& p) {
  const int lane = int(threadIdx.x) % 32;
  return ld_s32_pred_or_zero(p.metadata + md_extra_lengths_offset(p.num_rows, p.batch) + lane,
                             p.batch <= kPreloadedBatch && lane < p.batch);
}

// Walks (row, block) of the part in block order; identical in every CTA of a cluster. With
// dynamic top-k it holds the clamped top-k lengths of rows row and row + 1, loading the next one
// when it steps to a new row, a whole row before it is needed: the index stage of a new row never
// waits on a length load (a dependent DRAM round trip per row otherwise; docs/perf-log.md: part
// entries). The lengths come from the plan's snapshot (never topk_length itself), and a row's
// block count follows from its length exactly as the scheduler derived the prefix sums the
// consumers walk (max(ceil(len / 64), 1)).
// kExtra (model1_fp8 kernels): a row's blocks are the main cache's ceil(len / 64) then the extra
// cache's ceil(len_x / 64) (fixed: K / 64 then K2 / 64); with lengths it also holds the extra
// cache's lengths of rows row and row + 1 (the plan's snapshot, md_extra_lengths_offset).
template <bool kDynamic, class Schedule, bool kExtra = false>
struct BlockCursor {
  Schedule sched;
  int32_t g, g1, row, row_begin, row_end;
  int32_t len, next_len;  // dynamic: clamped top-k lengths of rows row and row + 1
  int32_t len_x, next_len_x;  // dynamic, kExtra: the extra cache's

  __device__ __forceinline__ explicit BlockCursor(const PartIter<Schedule>& it)
      : sched(it.sched), g(it.g0), g1(it.g1), row(it.r) {
    if constexpr (kDynamic) {
      row_begin = it.rb;
      row_end = it.re;
      len = it.len0;
      next_len = it.len1;
    } else {
      row_begin = sched.prefix(row);
      row_end = sched.prefix(row + 1);
    }
  }
  // kExtra, dynamic: the extra lengths of the part's first two rows. `lane_len` is lane b's batch
  // entry b (preload_extra_lengths, issued before the part entry was read): with a preloaded batch the
  // lengths are a shuffle away, otherwise one load that depends on the entry's row.
  __device__ __forceinline__ void init_extra(const DecodeKernelParams& p, [[maybe_unused]] int32_t lane_len) {
    if constexpr (kExtra && kDynamic) {
      const int32_t r0 = row < p.num_rows ? row : p.num_rows - 1;
      const int32_t r1 = row + 1 < p.num_rows ? row + 1 : p.num_rows - 1;
      const int32_t b0 = row_coord(r0, p.batch).b, b1 = row_coord(r1, p.batch).b;
      int32_t raw0, raw1;
      if (p.batch <= kPreloadedBatch) {  // uniform
        raw0 = __shfl_sync(0xffffffffu, lane_len, b0);
        raw1 = __shfl_sync(0xffffffffu, lane_len, b1);
      } else {
        const int32_t* lx = p.metadata + md_extra_lengths_offset(p.num_rows, p.batch);
        raw0 = __ldg(lx + b0);
        raw1 = __ldg(lx + b1);
      }
      len_x = clamp_topk_length(raw0, p.topk_extra);
      next_len_x = clamp_topk_length(raw1, p.topk_extra);
    }
  }
  __device__ __forceinline__ void advance(const DecodeKernelParams& p) {
    ++g;
    if constexpr (kDynamic) {
      // (row + 1 < rows: corrupt row bounds cannot walk past the last row or loop forever)
      while (g < g1 && g >= row_end && row + 1 < p.num_rows) {
        ++row;
        row_begin = row_end;
        len = next_len;
        int32_t nblk = (len + kBlockN - 1) / kBlockN;
        if constexpr (kExtra) {
          len_x = next_len_x;
          nblk += (len_x + kBlockN - 1) / kBlockN;
        }
        row_end = row_begin + (nblk > 1 ? nblk : 1);
        // Row row + 1's length from the plan's snapshot (past the last row: the last row's),
        // clamped again so that even a corrupt plan cannot widen a mask past K.
        const int32_t nr = row + 1 < p.num_rows ? row + 1 : p.num_rows - 1;
        const int32_t raw = __ldg(p.metadata + md_lengths_offset(p.num_rows) + row_coord(nr, p.batch).b);
        next_len = clamp_topk_length(raw, p.topk);
        if constexpr (kExtra) {
          const int32_t rx = __ldg(p.metadata + md_extra_lengths_offset(p.num_rows, p.batch) + row_coord(nr, p.batch).b);
          next_len_x = clamp_topk_length(rx, p.topk_extra);
        }
      }
    } else {
      while (g < g1 && g >= row_end) {  // closed-form bounds: every row has K / 64 blocks
        ++row;
        row_begin = row_end;
        row_end = sched.prefix(row + 1);
      }
    }
  }
};

// Packed decode (C6): the records of a part's first kPackedEntryPrefetchBlocks blocks (this CTA's
// tokens of each) prefetched into L2 by every thread at kernel entry, before the barrier init, the
// cluster sync and the register split. Their addresses are arithmetic, so the first DRAM round trip
// overlaps the kernel's start instead of following it (docs/perf-log.md: packed entry prefetch).
// Only lines of tokens the producer will load are touched (the row's first blocks in this part, below
// its clamped top-k length): never an address outside the buffer, whatever the plan says.
inline constexpr int kPackedEntryPrefetchBlocks = 2;
template <int kNumHeads, bool kDynamic, class Schedule>
__device__ __forceinline__ void prefetch_packed_part_head(const DecodeKernelParams& p, const PartIter<Schedule>& it,
                                                          uint32_t rank) {
  constexpr int kCluster = DecodeTraits<kNumHeads>::kCluster;
  constexpr int kSpan = kBlockN / kCluster;  // tokens of a block this CTA dequantizes
  const BlockCursor<kDynamic, Schedule> cur(it);
  const int32_t row = cur.row < p.num_rows ? cur.row : p.num_rows - 1;  // the plan's row is >= 0
  const auto [b, s] = row_coord(row, p.batch);
  const int32_t len = kDynamic ? clamp_topk_length(cur.len, p.topk) : p.topk;
  const int32_t blk0 = it.g0 - cur.row_begin;
  const int32_t end = it.g1 < cur.row_end ? it.g1 : cur.row_end;
  if (blk0 < 0) return;
  const uintptr_t base =
      reinterpret_cast<uintptr_t>(p.cache) + uintptr_t(int64_t(b * p.seq_q + s) * p.topk) * KvFmt::kRecordBytes;
#pragma unroll 1
  for (int32_t i = 0; i < kPackedEntryPrefetchBlocks && it.g0 + i < end; ++i) {
    const int32_t t_lo = (blk0 + i) * kBlockN + kSpan * int32_t(rank);
    const int32_t t_hi = t_lo + kSpan < len ? t_lo + kSpan : len;
    if (t_hi <= t_lo) break;
    prefetch_l2_span(base + uintptr_t(t_lo) * KvFmt::kRecordBytes, base + uintptr_t(t_hi) * KvFmt::kRecordBytes,
                     threadIdx.x, kNumThreads);
  }
}

// kPacked: the records come from a packed KV buffer (selkv/packed.h) instead of the paged cache.
// Token k of row (b, s) is entry e = (b * S_q + s) * K + k at byte e * 656 of p.cache, an address
// by arithmetic: no index load precedes a record load, and nothing is translated. The "index" of
// a token is e (or -1: not wanted, never loaded); the second index slot carries the buffer's
// validity word of the token whose bit this lane publishes (p.indices points at the words, in
// int32 units with the index strides), needed only for the block's mask, never for an address.
// Everything else (ring, conversion, cluster exchange) is the native path's, so both paths give
// the same bits for the same records.
//
// L = DecodeLayout<kModel1Fp8> (kM1): a token's 576-byte record (7 NoPE chunks of 64 codes, one
// UE8M0 scale each, then the RoPE) and its 8 scale bytes in the page tail, both addressed through
// the format traits (record_offset, scale_offset: the scale address depends on the page size);
// dequant e4m3 * 2^e; the RoPE lands at atom 7 (dims 448..511). These kernels take the optional
// extra cache: blocks [0, nb1) of a row read the main cache and indices, [nb1, nb1 + nb2) the
// extra ones (nb1 = ceil(len / 64), fixed K / 64), each with its own num_slots, page size and
// block stride; a round's cache (`ext`) travels with its index through the ring.
template <class L, int kNumHeads, bool kDynamic, bool kPacked, class Schedule>
__device__ __forceinline__ void run_producer(const DecodeKernelParams& p, typename L::SharedStorage& ss,
                                             const PartIter<Schedule>& it, uint32_t rank,
                                             [[maybe_unused]] int32_t extra_len_lane) {
  using Fmt = typename L::Fmt;
  constexpr bool kM1 = L::kFormat == KvFormat::kModel1Fp8;
  constexpr bool kExtra = kM1;
  static_assert(!(kM1 && kPacked), "the packed buffer holds ds_mla_fp8 records");
  using Ext = std::conditional_t<kExtra, int32_t, NoExtra>;
  using Raw = RoundRawOf<L>;
  constexpr int kNopeChunks = L::kDimNope / 64;  // 64-byte NoPE chunks per record: 8 / 7
  constexpr int kKRowGroupStride = L::kKRowGroupStride;
  constexpr int kCluster = DecodeTraits<kNumHeads>::kCluster;
  constexpr int kRounds = DecodeTraits<kNumHeads>::kRoundsPerBlock;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int q = lane >> 3, l7 = lane & 7;
  const int tl = warp * 8 + l7;  // token of the round (0..31)
  const int32_t max_blocks = p.topk / kBlockN;
  [[maybe_unused]] const int32_t max_blocks_x = kExtra ? p.topk_extra / kBlockN : 0;
  const int32_t total_rounds = (it.g1 - it.g0) * kRounds;
  // packed: a thread's second token (8w + q + 4) is 4 records after its first
  [[maybe_unused]] constexpr int kSecondToken = 4 * KvFmt::kRecordBytes;

  // model1_fp8: smem element offsets within a K tile (DecodeLayout's lane_* functions, loop
  // invariant): token row base of token tl (+ 4 row groups per 32-token half), the two swizzled
  // 16-byte chunks of NoPE quarter q in each 64-dim atom, and the two RoPE chunks q, q + 4.
  const int row_base = L::lane_row_base(warp, l7);
  const int c0 = L::lane_nope_chunk(q, l7, 0), c1 = L::lane_nope_chunk(q, l7, 1);
  const int r0 = L::lane_rope_chunk(q, l7), r1 = L::lane_rope_chunk(q + 4, l7);
  constexpr int kHalfOff = L::kKHalfTokenOffset;  // tokens [32, 64)
  static_assert(kHalfOff == 4 * kKRowGroupStride, "a cluster half is the 4 producer warps' row groups");
  uint32_t peer_smem = 0;
  if constexpr (kCluster == 2) peer_smem = map_smem_to_rank(smem_u32(&ss), rank ^ 1u);

  BlockCursor<kDynamic, Schedule, kExtra> cur(it);
  if constexpr (kExtra) cur.init_extra(p, extra_len_lane);
  int stage_round = 0;  // round (within its block) of the cursor's next index load

  // Index stage: the index of this thread's token in the cursor's round (and, H = 128, the
  // index of the same position in the peer's half, for the validity flags). A position past
  // the row's top-k length (dynamic) or a clamped block is not loaded and reads as -1, which the
  // validity test (idx >= 0 && idx < num_slots) rejects exactly as the explicit length test did.
  // Straight-line code around one predicated load per value (no branch, so the value's register
  // is the load's target: nothing copies an index that is still in flight).
  auto load_index = [&](int32_t& idx, int32_t& idx2, [[maybe_unused]] Ext& ext) {
    // Row and block clamped to the call's shape whatever the (dynamic) metadata says: a corrupt
    // plan gives wrong results, never an out-of-bounds index read.
    const int32_t row = cur.row < p.num_rows ? cur.row : p.num_rows - 1, blk = cur.g - cur.row_begin;
    const auto [b, s] = row_coord(row, p.batch);
    const int tok = 32 * (kCluster == 2 ? int(rank) : stage_round) + tl;
    if constexpr (kExtra) {
      // The row's main blocks first, then the extra cache's; each block index clamped to its
      // own cache's K / 64 (the empty row's one block: nothing wanted).
      const int32_t nb1 = kDynamic ? (cur.len + kBlockN - 1) / kBlockN : max_blocks;
      const bool x = blk >= nb1;
      const int32_t xb = x ? blk - nb1 : blk;
      const bool in_part = cur.g < cur.g1 && uint32_t(xb) < uint32_t(x ? max_blocks_x : max_blocks);
      const int32_t len = x ? (kDynamic ? cur.len_x : p.topk_extra) : (kDynamic ? cur.len : p.topk);
      auto wanted = [&](int t) -> int32_t { return in_part && xb * kBlockN + t < len; };
      const int32_t* idx_row =
          x ? p.extra_indices + b * p.extra_indices_batch_stride + s * p.extra_indices_seq_stride +
                  int64_t(in_part ? xb : 0) * kBlockN
            : p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride + int64_t(in_part ? xb : 0) * kBlockN;
      idx = ld_s32_pred_or_neg1(idx_row + tok, wanted(tok));
      if constexpr (kCluster == 2) {
        const int tok2 = 32 * int(rank ^ 1u) + tl;
        idx2 = ld_s32_pred_or_neg1(idx_row + tok2, q == 1 && wanted(tok2));
      } else {
        idx2 = -1;
      }
      ext = x ? 1 : 0;
      if (++stage_round == kRounds) {
        stage_round = 0;
        cur.advance(p);
      }
      return;
    }
    // Past the part's end or outside 0 <= blk < K / 64: nothing is loaded.
    const bool in_part = cur.g < cur.g1 && uint32_t(blk) < uint32_t(max_blocks);
    // fixed: blk < K / 64, so every position is < K = len (no tail predicate); dynamic: the row's
    // clamped top-k length, loaded a row ahead (BlockCursor).
    const int32_t len = kDynamic ? cur.len : p.topk;
    auto wanted = [&](int t) -> int32_t { return in_part && (!kDynamic || blk * kBlockN + t < len); };
    if constexpr (kPacked) {
      // Entry of the block's token 0 (rows * K < 2^31: checked by the host API); the validity
      // words follow the entries, one per 32 (p.indices).
      const int32_t e0 = (b * p.seq_q + s) * p.topk + (in_part ? blk : 0) * kBlockN;
      // The round's first entry (a multiple of 32) with, in its low 5 bits, the number of wanted
      // tokens of the round minus one (all the thread's data loads need); -1: none wanted.
      const int hb = tok - tl;  // the round's first token in the block: 0 or 32
      int32_t nw = kDynamic ? len - (blk * kBlockN + hb) : 32;
      nw = in_part ? (nw < 32 ? nw : 32) : 0;
      idx = nw > 0 ? (e0 + hb) | (nw - 1) : -1;
      // This lane's published token: its own (H = 64, and q != 1), the peer half's (H = 128, q == 1).
      const int pub = kCluster == 2 && q == 1 ? 32 * int(rank ^ 1u) + tl : tok;
      idx2 = ld_s32_pred_or_zero(p.indices + (e0 >> 5) + (pub >> 5), wanted(pub));
    } else {
      const int32_t* idx_row = p.indices + b * p.indices_batch_stride + s * p.indices_seq_stride +
                               int64_t(in_part ? blk : 0) * kBlockN;
      idx = ld_s32_pred_or_neg1(idx_row + tok, wanted(tok));
      if constexpr (kCluster == 2) {
        const int tok2 = 32 * int(rank ^ 1u) + tl;
        idx2 = ld_s32_pred_or_neg1(idx_row + tok2, q == 1 && wanted(tok2));
      } else {
        idx2 = -1;
      }
    }
    if (++stage_round == kRounds) {
      stage_round = 0;
      cur.advance(p);
    }
  };

  // Data stage, address half: validity and record address of a round (the address is only formed
  // for a valid token; an invalid token is never dereferenced, its data stays zero).
  // model1_fp8: the record of index idx in cache `ext` and (out) its scale bytes' address.
  auto record_of_m1 = [&](int32_t idx, Ext ext, int32_t& valid, const uint8_t*& sc) -> const uint8_t* {
    if constexpr (kM1) {
      const bool x = ext != 0;
      valid = idx >= 0 && int64_t(idx) < (x ? p.extra_num_slots : p.num_slots);
      const uint8_t* rec = x ? p.extra_cache : p.cache;
      sc = rec;
      if (valid) {
        uint32_t blk_id, in_page;
        if (x) p.extra_page.divmod(uint32_t(idx), blk_id, in_page);  // valid: 0 <= idx < 2^31
        else p.page.divmod(uint32_t(idx), blk_id, in_page);
        const uint8_t* page = rec + int64_t(blk_id) * (x ? p.extra_block_stride_bytes : p.block_stride_bytes);
        // (in-page offsets < 2^31: checked by the host API)
        rec = page + int32_t(Fmt::record_offset(in_page));
        sc = page + int32_t(Fmt::scale_offset(in_page, x ? p.extra_page_size : p.page_size));
      }
      return rec;
    } else {
      return nullptr;
    }
  };
  // Packed: the record of the thread's first token (its second is 4 entries on), validity of both.
  auto record_of_packed = [&](int32_t idx, int32_t& valid, int32_t& valid_b) -> const uint8_t* {
    const int32_t nw = (idx & 31) + 1, ta = warp * 8 + q;
    valid = idx >= 0 && ta < nw;
    valid_b = idx >= 0 && ta + 4 < nw;
    return idx >= 0 ? p.cache + int64_t((idx & ~31) + ta) * KvFmt::kRecordBytes : p.cache;
  };
  auto record_of = [&](int32_t idx, int32_t& valid) -> const uint8_t* {
    valid = idx >= 0 && int64_t(idx) < p.num_slots;
    const uint8_t* rec = p.cache;
    if (valid) {
      uint32_t blk_id, in_page;
      p.page.divmod(uint32_t(idx), blk_id, in_page);  // valid: 0 <= idx < 2^31
      rec += int64_t(blk_id) * p.block_stride_bytes + KvFmt::record_offset(in_page);
    }
    return rec;
  };
  // ds_mla_fp8: the records of the thread's two tokens (8w + q and 8w + q + 4) of the round whose
  // index this lane holds (`idx`: its own token's; -1 for a round with nothing to load). Paged:
  // their indices from the lanes that loaded them (l7 = q, q + 4), each translated; packed: the
  // round's entries, the second 4 records after the first.
  auto pair_records = [&](int32_t idx, int32_t& valid, int32_t& valid_b, const uint8_t*& rec_b) -> const uint8_t* {
    if constexpr (kPacked) {
      const uint8_t* rec = record_of_packed(idx, valid, valid_b);
      rec_b = rec + kSecondToken;
      return rec;
    } else {
      const int32_t ia = __shfl_sync(0xffffffffu, idx, q), ib = __shfl_sync(0xffffffffu, idx, q + 4);
      rec_b = record_of(ib, valid_b);
      return record_of(ia, valid);
    }
  };
  // Data stage, load half: one 16-byte load (zeros for an invalid token: never loaded).
  auto load16 = [&](const uint8_t* rec, int32_t valid, int byte_off) -> uint4 {
    return ld_16_pred(rec + byte_off, valid);
  };
  auto load_scales = [&](const uint8_t* rec, int32_t valid) -> float4 {
    const uint4 v = ld_16_pred(rec + KvFmt::kScaleOffset, valid);
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  };
  // All loads of one round at once (prologue: round 0).
  auto issue_loads = [&](int32_t idx, [[maybe_unused]] Ext ext, Raw& r) {
    if constexpr (kM1) {
      const uint8_t* sc;
      const uint8_t* rec = record_of_m1(idx, ext, r.valid, sc);
      CUTE_UNROLL
      for (int d = 0; d < kNopeChunks; ++d) r.nope[d] = load16(rec, r.valid, Fmt::kNopeOffset + 64 * d + 16 * q);
      r.sc = ld_8_pred(sc, r.valid);
      r.rope[0] = load16(rec, r.valid, Fmt::kRopeOffset + 16 * q);
      r.rope[1] = load16(rec, r.valid, Fmt::kRopeOffset + 16 * (q + 4));
    } else {
      const uint8_t* rec_b;
      const uint8_t* rec = pair_records(idx, r.valid, r.valid_b, rec_b);
      CUTE_UNROLL
      for (int d = 0; d < 8; ++d)
        r.nope[d] = load16(d < 4 ? rec : rec_b, d < 4 ? r.valid : r.valid_b, KvFmt::kNopeOffset + 128 * (d & 3) + 16 * l7);
      r.sc[0] = load_scales(rec, r.valid);
      r.sc[1] = load_scales(rec_b, r.valid_b);
      r.rope[0] = load16(rec, r.valid, KvFmt::kRopeOffset + 16 * l7);
      r.rope[1] = load16(rec_b, r.valid_b, KvFmt::kRopeOffset + 16 * l7);
    }
  };

  // Convert stage: dequantize round n from `r` into the K tile (both CTAs' tiles for H = 128),
  // and issue the loads of round n + 1 into `nx` (records `nrec` / `nrec_b` of the pair mapping's
  // two tokens, validity nx.valid / nx.valid_b, set by the caller; model1_fp8: `nrec` only)
  // interleaved with it: NoPE chunk d of round n + 1 is loaded right after chunk d of round n has
  // been converted, into the registers that just died, so only about one round of raw records is
  // live at a time (issuing all of round n + 1's loads first kept two rounds live and spilled).
  // Every load still has a full round of lead before its use.
  auto convert = [&](int32_t n, const Raw& r, int32_t idx2v, Raw& nx, const uint8_t* nrec,
                     [[maybe_unused]] const uint8_t* nrec_b) {
    const int32_t blkn = n / kRounds, rin = n - (n / kRounds) * kRounds;
    const int buf = blkn & 1;
    const uint32_t phase = uint32_t(blkn >> 1) & 1u;
    if (rin == 0) {
      cutlass::arch::ClusterBarrier::wait(&ss.bar_empty[buf], phase ^ 1u);
      // The wait asm has no memory clobber: keep every smem store of this round below it.
      asm volatile("" ::: "memory");
      if constexpr (kCluster == 2) {
        // This CTA's half of the tile arrives from the peer: expect its bytes (after the empty
        // wait, so the previous phase of bar_remote has completed).
        constexpr uint32_t kTxBytes = uint32_t(kTokensPerConsumer * L::kDimQK * sizeof(bf16_t));
        if (threadIdx.x == 0)
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.bar_remote[buf], kTxBytes);
      }
    }
    SELKV_TL(if (threadIdx.x == 0 && n == 1) { tl_wait_value(r.nope[0].x); tl_stamp(19); })
    const int half = kCluster == 2 ? int(rank) : int(rin);
    const int base = half * kHalfOff + row_base;
    bf16_t* sk = ss.k[buf];
    auto store_local = [&](int off, uint4 v) { *reinterpret_cast<uint4*>(sk + off) = v; };  // 16-byte chunk -> tile
    uint32_t peer_k = 0, peer_bar = 0;
    if constexpr (kCluster == 2) {
      peer_k = peer_smem + uint32_t(reinterpret_cast<uint8_t*>(sk) - reinterpret_cast<uint8_t*>(&ss));
      peer_bar = peer_smem + uint32_t(reinterpret_cast<uint8_t*>(&ss.bar_remote[buf]) - reinterpret_cast<uint8_t*>(&ss));
    }
    if constexpr (!kM1) {
      // Token X (0: row q of the warp's group, 1: row q + 4), piece k: 16 codes of atom 2k + l7 / 4,
      // 16-byte chunks 2 (l7 % 4) and 2 (l7 % 4) + 1 of its row (DecodeLayout::pair_nope_base, pair_nope_chunk).
      CUTE_UNROLL
      for (int d = 0; d < 8; ++d) {
        const int x = d >> 2, k = d & 3, row = q + 4 * x;
        const float4 sc = r.sc[x];
        const float s = k == 0 ? sc.x : k == 1 ? sc.y : k == 2 ? sc.z : sc.w;
        const uint2 a = dev::dequant_e4m3x4(r.nope[d].x, s);
        const uint2 bq = dev::dequant_e4m3x4(r.nope[d].y, s);
        const uint2 c = dev::dequant_e4m3x4(r.nope[d].z, s);
        const uint2 e = dev::dequant_e4m3x4(r.nope[d].w, s);
        const uint4 lo = make_uint4(a.x, a.y, bq.x, bq.y), hi = make_uint4(c.x, c.y, e.x, e.y);
        const int o = L::pair_nope_base(half, warp, row, l7, k);
        store_local(o + L::pair_nope_chunk(row, l7, 0), lo);
        store_local(o + L::pair_nope_chunk(row, l7, 1), hi);
        nx.nope[d] = load16(x ? nrec_b : nrec, x ? nx.valid_b : nx.valid, KvFmt::kNopeOffset + 128 * k + 16 * l7);
        // a token's next scales once its current ones are dead (half a round of lead)
        if (k == 3) nx.sc[x] = load_scales(x ? nrec_b : nrec, x ? nx.valid_b : nx.valid);
      }
      CUTE_UNROLL
      for (int x = 0; x < 2; ++x) {
        const int row = q + 4 * x;
        store_local(L::pair_rope_offset(half, warp, row, l7), r.rope[x]);
      }
      nx.rope[0] = load16(nrec, nx.valid, KvFmt::kRopeOffset + 16 * l7);
      nx.rope[1] = load16(nrec_b, nx.valid_b, KvFmt::kRopeOffset + 16 * l7);
    } else {
      CUTE_UNROLL
      for (int d = 0; d < kNopeChunks; ++d) {
        const uint32_t s2 = dev::ue8m0_bf16x2(d < 4 ? r.sc.x >> (8 * d) : r.sc.y >> (8 * (d - 4)));  // chunk d = tile d
        const uint2 a = dev::dequant_e4m3x4_pow2(r.nope[d].x, s2);
        const uint2 bq = dev::dequant_e4m3x4_pow2(r.nope[d].y, s2);
        const uint2 c = dev::dequant_e4m3x4_pow2(r.nope[d].z, s2);
        const uint2 e = dev::dequant_e4m3x4_pow2(r.nope[d].w, s2);
        const uint4 lo = make_uint4(a.x, a.y, bq.x, bq.y), hi = make_uint4(c.x, c.y, e.x, e.y);
        const int o0 = base + d * 512 + c0, o1 = base + d * 512 + c1;
        store_local(o0, lo);
        store_local(o1, hi);
        nx.nope[d] = load16(nrec, nx.valid, Fmt::kNopeOffset + 64 * d + 16 * q);
      }
      store_local(base + r0, r.rope[0]);
      store_local(base + r1, r.rope[1]);
      nx.rope[0] = load16(nrec, nx.valid, Fmt::kRopeOffset + 16 * q);
      nx.rope[1] = load16(nrec, nx.valid, Fmt::kRopeOffset + 16 * (q + 4));
    }
    // Validity bits of the block (bit t = token t): lanes 0-7 (q == 0) hold this CTA's tokens of
    // the warp, lanes 8-15 (q == 1) the peer half's (H = 128); one byte per 8 tokens.
    {
      // (ds_mla_fp8: idx2v is the validity of the lane's published token: its own for q == 0,
      // the peer half's for q == 1; model1_fp8, q == 0: the lane's token is the one it converted)
      const uint32_t own = __ballot_sync(0xffffffffu, q == 0 && (kM1 ? r.valid : idx2v));
      if (lane == 0) ss.kv_valid_bits[buf][4 * half + warp] = uint8_t(own);
      if constexpr (kCluster == 2) {
        const uint32_t peer = __ballot_sync(0xffffffffu, q == 1 && idx2v);
        if (lane == 0) ss.kv_valid_bits[buf][4 * int(rank ^ 1u) + warp] = uint8_t(peer >> 8);
      }
    }
    SELKV_TL(if (threadIdx.x == 0 && n == 0) tl_stamp(18);)
    if (rin == kRounds - 1) {
      // Generic-proxy smem writes -> visible to wgmma and the bulk copy (async proxy), then publish.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_full[buf]);
      SELKV_TL(if (threadIdx.x == 0 && n == kRounds - 1) tl_stamp(1);)
      SELKV_TL(if (threadIdx.x == 96 && n == kRounds - 1) tl_stamp(20);)
      if constexpr (kCluster == 2) {
        // Each warp ships its own 8 tokens (one row group, contiguous in the tile) once its lanes'
        // stores are fenced: four copies that start as each warp finishes, instead of one that
        // waited for the whole half behind a named barrier (docs/perf-log.md: per-warp crossover).
        __syncwarp();
        if (lane == 0) {
          const uint32_t off = uint32_t(half * kHalfOff + warp * kKRowGroupStride) * uint32_t(sizeof(bf16_t));
          bulk_copy_to_peer(peer_k + off, smem_u32(sk) + off, uint32_t(kKRowGroupStride * sizeof(bf16_t)), peer_bar);
        }
      }
    }
  };

  auto valid2 = [&](int32_t idx2, [[maybe_unused]] Ext ext) -> int32_t {
    if constexpr (kPacked) return (uint32_t(idx2) >> tl) & 1u;  // the word holds 32 tokens: bit tl
    if constexpr (kExtra) return idx2 >= 0 && int64_t(idx2) < (ext != 0 ? p.extra_num_slots : p.num_slots);
    return idx2 >= 0 && int64_t(idx2) < p.num_slots;
  };
  // The validity this lane publishes into its round's block mask (convert's idx2v): the peer
  // half's token for q == 1 (H = 128); paged ds_mla_fp8, q == 0: its own token tl, which it no
  // longer converts (the pair mapping); packed: the buffer's bit of whichever token that is.
  auto published = [&](int32_t idx, int32_t idx2, Ext ext) -> int32_t {
    if constexpr (kPacked || kM1) return valid2(idx2, ext);
    else return valid2(kCluster == 2 && q == 1 ? idx2 : idx, ext);
  };

  // L2 prefetch of a round's record (index known two rounds ahead, registers not needed): the
  // register loads issued one round later then hit L2 instead of waiting a full DRAM latency.
  // Thread quarter q touches the record's 128-byte lines q and q + 4 (656 bytes span <= 7 lines:
  // q == 0 also touches the last byte's line).
  auto prefetch_record = [&](int32_t idx, [[maybe_unused]] Ext ext) {
    if constexpr (kM1) {
      // The 576-byte record (<= 6 lines: quarters q and q + 4) and, q == 0, the scale bytes' line.
      int32_t valid;
      const uint8_t* sc;
      const uint8_t* rec = record_of_m1(idx, ext, valid, sc);
      if (valid) {
        const uintptr_t line0 = reinterpret_cast<uintptr_t>(rec) & ~uintptr_t(127);
        const uintptr_t last = (reinterpret_cast<uintptr_t>(rec) + Fmt::kRecordStride - 1) & ~uintptr_t(127);
        const uintptr_t a = line0 + 128u * uintptr_t(q), b = line0 + 128u * uintptr_t(q + 4);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
        if (b <= last) asm volatile("prefetch.global.L2 [%0];" ::"l"(b));
        if (q == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(sc));
      }
      return;
    }
    if constexpr (kPacked) {
      // The round's wanted records are contiguous: the producer's 128 threads take its lines in turn.
      if (idx >= 0) {
        const uintptr_t lo = reinterpret_cast<uintptr_t>(p.cache) + uintptr_t(idx & ~31) * KvFmt::kRecordBytes;
        prefetch_l2_span(lo, lo + uintptr_t((idx & 31) + 1) * KvFmt::kRecordBytes, threadIdx.x,
                         kNumThreads - kNumConsumerThreads);
      }
      return;
    }
    int32_t valid;
    const uint8_t* rec = record_of(idx, valid);
    if (valid) {
      const uintptr_t line0 = reinterpret_cast<uintptr_t>(rec) & ~uintptr_t(127);
      const uintptr_t last = (reinterpret_cast<uintptr_t>(rec) + KvFmt::kRecordBytes - 1) & ~uintptr_t(127);
      const uintptr_t a = line0 + 128u * uintptr_t(q), b = line0 + 128u * uintptr_t(q + 4);
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      if (b <= last) asm volatile("prefetch.global.L2 [%0];" ::"l"(b));
    }
  };

  // Index ring of two slots (slot of round m = m & 1), rotated by the main loop's 2-step unroll,
  // so a loop-carried index never moves between registers (a move of a value still in flight
  // waits for it; docs/perf-log.md: decode index ring). At the
  // start of step n, slot (n + 1) & 1 holds round n + 1's indices (their records are loaded in
  // step n) and slot n & 1 round n + 2's (prefetched into L2 in step n); step n then loads round
  // n + 3's into slot (n + 1) & 1. Prologue: rounds 0, 1 and 2, records of round 0.
  int32_t s0, s0p, s1, s1p;  // slot 0 / slot 1: this thread's index and the peer-half index
  Ext e0{}, e1{};            // (model1_fp8) slot 0 / slot 1: the cache of the slot's round
  Raw x0, x1;
  int32_t v2_0 = 0, v2_1 = 0;
  SELKV_TL(if (threadIdx.x == 0) tl_stamp(7);)
  load_index(s0, s0p, e0);  // round 0
  load_index(s1, s1p, e1);  // round 1
  SELKV_TL(if (threadIdx.x == 0) { tl_wait_value(uint32_t(s0)); tl_stamp(8); })
  issue_loads(s0, e0, x0);
  // The consumers issue their Q tile's copies only now (run_consumer_wg): issued at
  // the same time as the first index and record loads, its 4 K copies delayed those loads.
  // (relaxed: a signal of issue order; a release arrive or a named barrier would hold the loads)
  if (lane == 0) selkv::sm90::mbar_arrive<true>(smem_u32(&ss.bar_first_loads));
  SELKV_TL(if (threadIdx.x == 0) { tl_wait_value(x0.nope[0].x); tl_stamp(9); })
  // Round 1's records to L2 now, alongside round 0's, not in step 0 after round 0 landed: the first
  // block of an H = 64 part needs both rounds (docs/perf-log.md: decode prologue prefetch).
  constexpr bool kL2Prefetch = !kPacked || DecodeTraits<kNumHeads>::kPackedL2Prefetch;
  // Packed records need no index load: their prefetch goes out as soon as the round is indexed,
  // three rounds ahead of its conversion instead of two (docs/perf-log.md: packed prefetch at
  // indexing).
  constexpr bool kPrefetchAtIndex = kPacked && kL2Prefetch;
  if constexpr (kL2Prefetch) prefetch_record(s1, e1);
  v2_0 = published(s0, s0p, e0);
  load_index(s0, s0p, e0);  // round 2
  if constexpr (kPrefetchAtIndex) prefetch_record(s0, e0);

  // One step: convert round n from `cx` while loading the records of round n + 1 into `nx`
  // (index slot `ni`, peer `ni2`) and prefetching round n + 2's into L2 (slot `pi`), then load
  // round n + 3's indices into the slot just used (packed: and prefetch its records right away).
  auto step = [&](int32_t n, Raw& cx, int32_t& v2c, Raw& nx, int32_t& v2n, int32_t& ni,
                  int32_t& ni2, Ext& nie, int32_t pi, Ext pie) {
    const bool more = n + 1 < total_rounds;
    const uint8_t* nrec;
    const uint8_t* nrec_b = nullptr;  // ds_mla_fp8: the second token's record
    const uint8_t* nsc = nullptr;
    if constexpr (kM1) {
      nrec = record_of_m1(more ? ni : -1, nie, nx.valid, nsc);  // !more: nothing loaded
      nx.sc = ld_8_pred(nsc, nx.valid);
    } else {
      nrec = pair_records(more ? ni : -1, nx.valid, nx.valid_b, nrec_b);  // !more: nothing loaded
    }
    if (more) v2n = published(ni, ni2, nie);
    if constexpr (kL2Prefetch && !kPrefetchAtIndex) prefetch_record(pi, pie);
    convert(n, cx, v2c, nx, nrec, nrec_b);
    load_index(ni, ni2, nie);
    if constexpr (kPrefetchAtIndex) prefetch_record(ni, nie);  // round n + 3
  };
#pragma unroll 1
  for (int32_t n = 0; n < total_rounds; n += 2) {
    step(n, x0, v2_0, x1, v2_1, s1, s1p, e1, s0, e0);
    if (n + 1 < total_rounds) step(n + 1, x1, v2_1, x0, v2_0, s0, s0p, e0, s1, e1);
  }
  SELKV_TL(if (threadIdx.x == 0) tl_stamp(2);)
}

}  // namespace selkv::decode::sm90
