// C6 pack kernel (include/selkv/packed.h): selected 656-byte records of a paged ds_mla_fp8 cache
// -> the packed KV buffer (src/packed/packed_layout.h), zeros for invalid entries, validity words.
//
// Work split. A group is 32 consecutive entries of one row (K is a multiple of 64): one validity
// word and 32 * 656 = 20992 contiguous output bytes (1312 16-byte chunks, 128-byte aligned). A
// warp unit is one group, or one of `splits` slices of it when there are too few groups to give
// every resident warp a unit (small B * S_q): lane l loads the index of entry l once per unit,
// decides its validity (DESIGN §2) and its record's byte offset; the ballot of the 32 flags is
// the group's validity word, written whole by lane 0 of the group's first slice. Then lane l
// copies the group's chunks c = 32 j + l for its slice's j range: record c / 41, 16-byte chunk
// c % 41, source address shuffled from the record's lane. Stores are 512 contiguous bytes per
// warp instruction; loads cover at most two records per instruction. kPackBatch loads are issued
// before their stores. A chunk of an invalid entry (or a step past the slice's end) is a
// predicated load that reads nothing and yields zeros, so an invalid index is never dereferenced
// and no address is shared by many warps (reading one static zero record instead made every warp
// hit the same L2 lines: 2-3x the copy time on small packs, docs/perf-log.md).
// One unit per warp, CTAs scheduled by the hardware (no grid-stride loop): the tail balances.
#pragma once

#include <cstdint>

#include "common/fast_divmod.h"
#include "formats/device_codec.cuh"
#include "packed/packed_layout.h"

namespace selkv::packed {

inline constexpr int kPackThreads = 128;  // small CTAs: a small pack spreads over more SMs
inline constexpr int kPackWarps = kPackThreads / 32;
inline constexpr int kGroupEntries = 32;                          // one validity word
inline constexpr int kChunksPerRecord = kRecordBytes / 16;        // 41
inline constexpr int kGroupSteps = kChunksPerRecord;              // 32 * 41 chunks / 32 lanes
inline constexpr int kGroupBytes = kGroupEntries * kRecordBytes;  // 20992
inline constexpr int kPackBatch = 7;   // 16-byte loads in flight per lane before their stores
inline constexpr int kMaxPackSplits = 11;  // slices of a group: at least 3 steps each

struct PackKernelParams {
  const uint8_t* cache = nullptr;
  int64_t num_slots = 0;
  int64_t block_stride_bytes = 0;
  FastDivmod page;  // page_size
  const int32_t* indices = nullptr;
  int64_t idx_batch_stride = 0, idx_seq_stride = 0;
  const int32_t* topk_length = nullptr;
  FastDivmod seq;         // S_q
  FastDivmod row_groups;  // K / 32
  uint8_t* out = nullptr;
  uint32_t* validity = nullptr;
  uint64_t* shape = nullptr;  // the buffer's shape words (packed_layout.h), written by one thread
  PackedShape shape_words = {};
  int64_t num_units = 0;  // groups * splits
  int32_t splits = 1;
};

__global__ void __launch_bounds__(kPackThreads) pack_selected_kv_kernel(const PackKernelParams p) {
  const int lane = int(threadIdx.x) & 31;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.shape[0] = p.shape_words.lo;
    p.shape[1] = p.shape_words.hi;
  }
  const int64_t unit = int64_t(blockIdx.x) * kPackWarps + (int(threadIdx.x) >> 5);
  if (unit >= p.num_units) return;  // warp-uniform
  // unit < 11 * 2^26: 32-bit quotients.
  const uint32_t group = uint32_t(unit) / uint32_t(p.splits);
  const int part = int(uint32_t(unit) - group * uint32_t(p.splits));
  uint32_t row, kg, b, s;
  p.row_groups.divmod(group, row, kg);
  p.seq.divmod(row, b, s);
  const int32_t k = int32_t(kg) * kGroupEntries + lane;

  // ---- validity and source offset of entry `lane` (index read only inside the length window) ----
  bool in_len = true;
  if (p.topk_length != nullptr) in_len = k < __ldg(p.topk_length + b);  // len < 0: never
  const uint8_t* src = nullptr;  // null: invalid entry, nothing read
  if (in_len) {
    const int32_t slot = __ldg(p.indices + int64_t(b) * p.idx_batch_stride + int64_t(s) * p.idx_seq_stride + k);
    if (slot >= 0 && int64_t(slot) < p.num_slots) {
      uint32_t blk, off;
      p.page.divmod(uint32_t(slot), blk, off);
      src = p.cache + (int64_t(blk) * p.block_stride_bytes + int64_t(off) * kRecordBytes);
    }
  }
  const uint32_t word = __ballot_sync(0xffffffffu, src != nullptr);
  if (part == 0 && lane == 0) p.validity[group] = word;

  // ---- this slice's steps [j0, j1) of the group's 41 ----
  const int j0 = part * kGroupSteps / p.splits;
  const int j1 = (part + 1) * kGroupSteps / p.splits;
  int c = 32 * j0 + lane;  // chunk of the group this lane copies at step j0
  int r = c / kChunksPerRecord;
  int w = c - r * kChunksPerRecord;
  uint8_t* dst = p.out + int64_t(group) * kGroupBytes + 16 * c;
  for (int j = j0; j < j1; j += kPackBatch) {
    uint4 v[kPackBatch];
#pragma unroll
    for (int i = 0; i < kPackBatch; ++i) {
      // (past j1 the shuffle's source lane is meaningless: nothing is read)
      const uint8_t* rec = reinterpret_cast<const uint8_t*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), r));
      v[i] = dev::ld_nc_na_u4_pred(rec + 16 * w, j + i < j1 && rec != nullptr);
      w += 32;  // the next step's chunk: 32 further, at most one record boundary (32 < 41)
      if (w >= kChunksPerRecord) {
        w -= kChunksPerRecord;
        ++r;
      }
    }
#pragma unroll
    for (int i = 0; i < kPackBatch; ++i)
      if (j + i < j1) dev::st_u4(dst + 512 * (j - j0 + i), v[i]);
  }
}

}  // namespace selkv::packed
