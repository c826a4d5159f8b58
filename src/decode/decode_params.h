// Internal (device-side) parameters of the C5 sparse MLA decode, and the metadata layout shared
// by the scheduler, the decode kernel and the combine kernel. Arch-neutral.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/fast_divmod.h"
#include "selkv/formats.h"

#if defined(__CUDACC__)
#define SELKV_DEC_HD __host__ __device__ __forceinline__
#else
#define SELKV_DEC_HD inline
#endif

namespace selkv::decode {

inline constexpr int kBlockTokens = 64;      // selected tokens per KV block (TOPK_BLOCK_SIZE)
inline constexpr int kHeadsPerCta = 64;      // query heads per CTA (one wgmma M tile)
inline constexpr int64_t kOneBlockPartsBelow = 80;  // H = 64 calls of fewer blocks: 1-block parts
// Scheduler: do not split finer than this many 64-token blocks per part (the default of
// DecodeShape::min_blocks_per_part). Each part costs a Q load, a partial write and a combine read,
// and more parts cost more than their shorter main loops save once the grid is ~half full.
// H = 128 (2-CTA clusters): 4, and 2 for calls under 256 blocks. H = 64: T / 128 clamped to
// [2, 4] for T blocks in the call (at most: the fixed top-k count), so calls up to ~256 blocks keep
// 2-block parts (all SMs busy) and larger ones get 4; a call of under 80 blocks (a few short rows:
// most SMs idle at 2 blocks a part) takes 1-block parts (docs/perf-log.md: decode split granularity).
SELKV_DEC_HD constexpr int min_blocks_per_part(int num_heads, int64_t total_blocks) {
  if (num_heads == 128) return total_blocks < 256 ? 2 : 4;
  if (total_blocks < kOneBlockPartsBelow) return 1;
  const int64_t m = total_blocks / 128;
  return m < 2 ? 2 : (m > 4 ? 4 : int(m));
}

// Partial format of split rows for DecodePartials::kAuto (a template parameter of the decode and
// combine kernels, chosen per call from the plan's shape). fp16 with an inverse scale per (slot,
// head, d_v half) (partial_scale.h: 1 / sum, times a power of two where the data is far from unit
// scale), written by the bf16 out path's whole-sector 16-byte stores, halves the partial round
// trip; any data scale stays in range, and fp16 rounds 8x finer than bf16 (bf16 partials reached
// DESIGN §5's cosine limit).
// fp32 goes out by 8-byte register stores, 8 lines a warp instruction: it pays only at H = 64 on
// the smallest calls, up to 4096 block-heads (T blocks x H: B * S_q <= 2 at K=2048), where the
// fp16 epilogue's extra code, fetched cold, costs more than the stores (docs/perf-log.md: decode
// partial format).
SELKV_DEC_HD constexpr bool f16_partials_by_default(int num_heads, int64_t total_blocks) {
  return num_heads == 128 || total_blocks * num_heads > 4096;
}

// Split partial slots in the workspace (the decode kernel writes them, the combine reads them).
// fp16 slots are [H, 512] halves back to back. fp32 slots are [H, 512] floats plus this pad: at a
// stride of exactly H x 2 KB the fp32 epilogue's and the combine's time depended on the
// workspace's address (up to 2 % by where it landed); with 16 KB + 256 B between slots every
// address runs at the same time, below the unpadded average (docs/perf-log.md: fp32 partial
// slot pad; 8 KB and 32 KB pads were slower).
inline constexpr int64_t kFp32SlotPadFloats = 4160;
// Elements (fp16 or fp32) from one partial slot to the next.
SELKV_DEC_HD constexpr int64_t partial_slot_elems(int num_heads, bool f16_partials) {
  return int64_t(num_heads) * fmt::kVDim + (f16_partials ? 0 : kFp32SlotPadFloats);
}
// Floats from accum_out to accum_lse: the 2 * parts slots, counted in floats either way (fp16:
// the values fill the first half of those floats, the inverse scales follow; partial_scale.h).
SELKV_DEC_HD constexpr int64_t accum_out_floats(int32_t num_sm_parts, int num_heads, bool f16_partials) {
  return 2 * int64_t(num_sm_parts) * partial_slot_elems(num_heads, f16_partials);
}

// A schedule that splits rows pays for partials (written by the decode kernel, read by the
// combine), several blocks' worth of time per CTA. Cutting parts at row starts is taken when it
// lengthens the longest part by at most this many blocks and 1/8 of the part (row_start_cut_pays;
// docs/perf-log.md: decode split cost).
inline constexpr int32_t kSplitCostBlocks = 8;

// Most parts a plan may have (the capacity of the metadata's part table; SM90 parts are <= SMs).
inline constexpr int32_t kMaxDecodeParts = 1024;

// Metadata buffer (int32, device), written by the scheduler kernel:
//   [0] T = total blocks   [1] NP = effective number of parts   [2] rows   [3] magic
//   [4] min blocks per part   [5] the cut: DecodeCut (balanced, row starts or row pieces)
//   [6] S = split rows (rows merged by the combine)   [7] K = topk
//   (the header: kernels check it against their own shape, md_header_ok, so a stale or unwritten
//   buffer gives a defined result, never a walk sized by garbage)
//   [kMdSplitRows + 4 i .. + 3], i < S: split row i as {row, first_part, num_parts, first_slot}
//     (split_row_of_part of the kernels' schedule view, in part order): combine CTA column i
//   [kMdPartEntry + 8 q .. + 7], q < NP: part q's start as PartStart {g0, g1, r, P[r], P[r + 1],
//     P[r + 2], len(r), len(r + 1)} (r = its first row, len = clamped top-k length; indices past
//     rows clamp to rows / give 0): a dynamic decode CTA reads its first two rows' bounds and
//     lengths in one 32-byte sector, with no load that waits on another (docs/perf-log.md: part entries)
//   [kMdPrefix + r], r <= rows: P = prefix sums of blocks per row (P[0] = 0)
//   [md_lengths_offset(rows) + b], b < batch: the clamped top-k length of batch entry b (K for
//     fixed top-k): the plan's snapshot of topk_length. The scheduler reads topk_length once into
//     it and everything else (prefix sums, part entries, the producer's masks) derives from the
//     snapshot, so a decode always computes the result for the lengths at planning time.
//   [md_extra_offset(rows, batch)]: K2, the extra cache's top-k (0: none), then
//   [md_extra_lengths_offset(rows, batch) + b], b < batch: the extra cache's clamped top-k
//     lengths (K2 without extra_topk_length). A plan with K2 > 0 has the magic kMdMagicExtra, so
//     kernels built without the extra cache reject it (md_header_ok); the others check K2 too
//     (md_header_ok_extra). Dynamic ("lengths") plans: topk_length or extra_topk_length given.
// The fixed top-k decode kernels never read it: their schedule is closed form (FixedSchedule);
// the combine reads the split-row table in both cases.
inline constexpr int kMdHeaderInts = 8;
inline constexpr int kMdSplitCount = 6;
inline constexpr int kMdSplitRows = kMdHeaderInts;  // 16-byte aligned entries
inline constexpr int kMdPartEntryInts = 8;
inline constexpr int kMdPartEntry = kMdSplitRows + 4 * kMaxDecodeParts;  // 32-byte aligned entries
inline constexpr int kMdPrefix = kMdPartEntry + kMdPartEntryInts * kMaxDecodeParts;
static_assert(kMdSplitRows % 4 == 0, "split-row entries are loaded as int4");
static_assert(kMdPartEntry % 8 == 0, "part entries are two int4 loads of one 32-byte sector");
inline constexpr int32_t kMdMagic = 0x5e1c0de6;
inline constexpr int32_t kMdMagicExtra = 0x5e1c0de7;  // a plan with an extra cache (K2 > 0)
SELKV_DEC_HD constexpr int64_t md_lengths_offset(int32_t rows) { return int64_t(kMdPrefix) + rows + 1; }
SELKV_DEC_HD constexpr int64_t md_extra_offset(int32_t rows, int32_t batch) { return md_lengths_offset(rows) + batch; }
SELKV_DEC_HD constexpr int64_t md_extra_lengths_offset(int32_t rows, int32_t batch) {
  return md_extra_offset(rows, batch) + 1;
}
// Int32 values of a metadata buffer for `rows` rows of `batch` batch entries.
SELKV_DEC_HD constexpr int64_t md_ints(int32_t rows, int32_t batch) { return md_extra_lengths_offset(rows, batch) + batch; }

// A top-k length as the plan keeps it: clamped to [0, K].
SELKV_DEC_HD int32_t clamp_topk_length(int32_t len, int32_t topk) { return len < 0 ? 0 : (len > topk ? topk : len); }

// How a plan cut its parts (header word 5; the kernels read the part entries, never this word).
enum class DecodeCut : int32_t { kBalanced = 0, kRowStarts = 1, kRowPieces = 2 };
// The header [0, 8) as written by the scheduler.
SELKV_DEC_HD void md_write_header(int32_t* md, int32_t total, int32_t np, int32_t rows, int32_t min_blocks,
                                  DecodeCut cut, int32_t split_rows, int32_t topk) {
  md[0] = total, md[1] = np, md[2] = rows, md[3] = kMdMagic;
  md[4] = min_blocks, md[5] = int32_t(cut), md[6] = split_rows, md[7] = topk;
}
// The header words [0, 8): two 16-byte loads on the device.
SELKV_DEC_HD void md_load_header(const int32_t* md, int32_t (&h)[kMdHeaderInts]) {
#if defined(__CUDA_ARCH__)
  const int4 a = *reinterpret_cast<const int4*>(md), b = *reinterpret_cast<const int4*>(md + 4);
  h[0] = a.x, h[1] = a.y, h[2] = a.z, h[3] = a.w, h[4] = b.x, h[5] = b.y, h[6] = b.z, h[7] = b.w;
#else
  for (int i = 0; i < kMdHeaderInts; ++i) h[i] = md[i];
#endif
}
// Whether header words h[0, 8) describe a plan for this call's shape: magic, rows, K, the
// granularity, and a part count and total the kernels' loops may use (every row >= 1 block).
SELKV_DEC_HD bool md_header_ok(const int32_t* h, int32_t rows, int32_t topk, int32_t min_blocks,
                               int32_t num_sm_parts) {
  return h[3] == kMdMagic && h[2] == rows && h[7] == topk && h[4] == min_blocks && h[1] >= 1 &&
         h[1] <= num_sm_parts && h[0] >= rows && int64_t(h[0]) <= int64_t(rows) * (topk / kBlockTokens);
}

// md_header_ok for kernels that take an extra cache (K2 = topk2, possibly 0): the magic of a plan
// with or without one, K2 itself (`k2_word`, md[md_extra_offset]) and a total within
// rows * (K + K2) / 64.
SELKV_DEC_HD bool md_header_ok_extra(const int32_t* h, int32_t k2_word, int32_t rows, int32_t topk, int32_t topk2,
                                     int32_t min_blocks, int32_t num_sm_parts) {
  return h[3] == (topk2 > 0 ? kMdMagicExtra : kMdMagic) && k2_word == topk2 && h[2] == rows && h[7] == topk &&
         h[4] == min_blocks && h[1] >= 1 && h[1] <= num_sm_parts && h[0] >= rows &&
         int64_t(h[0]) <= int64_t(rows) * (topk / kBlockTokens + topk2 / kBlockTokens);
}

// Part p of NP owns global blocks [part_begin(p), part_begin(p+1)): the balanced cut of total /
// unit granules of `unit` blocks each (unit divides total; 1 = cut anywhere).
SELKV_DEC_HD int32_t part_begin(int32_t p, int32_t total, int32_t np, int32_t unit = 1) {
  return unit * int32_t((int64_t(p) * (total / unit)) / np);
}
// The part that owns global block g (0 <= g < total).
SELKV_DEC_HD int32_t part_of(int32_t g, int32_t total, int32_t np, int32_t unit = 1) {
  const int32_t units = total / unit;
  return int32_t((int64_t(g / unit + 1) * np + units - 1) / units) - 1;
}
// Effective part count: as many parts of >= min_blocks blocks as fit, within [1, num_sm_parts].
SELKV_DEC_HD int32_t effective_parts(int32_t total, int32_t min_blocks, int32_t num_sm_parts) {
  int32_t np = (total + min_blocks - 1) / min_blocks;
  if (np > num_sm_parts) np = num_sm_parts;
  return np < 1 ? 1 : np;
}
// Fixed top-k plans at the default granularity refine min_blocks_per_part with the call's row
// length and part count (every row has blocks_per_row blocks, so the cut is known on the host):
// - H = 64, 3 blocks -> 2: 3-block parts of 32-block rows measured slower than the full grid of
//   2-3-block parts that the 2-block granularity gives, with the same longest part (why is not
//   known; dynamic plans, whose cuts differ, keep the call-size rule).
// - Whole-row pieces: when the balanced cut's longest part L divides blocks_per_row and T / L
//   parts are fewer than the cut's, take L: the same longest part, no part straddling two rows (a
//   second Q tile and epilogue) and fewer split rows (e.g. 1024 blocks at H = 64: 128 parts of 8
//   instead of 132 of 7-8). (docs/perf-log.md: fixed_min_blocks_per_part.)
SELKV_DEC_HD int32_t fixed_min_blocks_per_part(int num_heads, int32_t total_blocks, int32_t blocks_per_row,
                                               int32_t num_sm_parts) {
  int32_t m = int32_t(min_blocks_per_part(num_heads, total_blocks));
  if (num_heads == 64 && m == 3) m = 2;
  const int32_t np = effective_parts(total_blocks, m, num_sm_parts);
  const int32_t longest = (total_blocks - 1) / np + 1;
  return blocks_per_row > 0 && blocks_per_row % longest == 0 && total_blocks / longest < np ? longest : m;
}

// The row holding global block g: the last r < rows with prefix[r] <= g (prefix strictly
// increasing: every row has at least one block).
SELKV_DEC_HD int32_t row_containing(const int32_t* prefix, int32_t rows, int32_t g) {
  int32_t lo = 0, hi = rows - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Dynamic top-k, row-piece cut: every row cut into pieces of `unit` blocks (its last piece
// shorter), one part per piece, taken when all the pieces fit the grid (the sum over rows of
// row_pieces <= num_sm_parts). Its longest part is at most the balanced cut's and no part
// straddles a row boundary: a straddling part loads a second Q tile and runs a second epilogue
// (docs/perf-log.md: row-piece cut).
SELKV_DEC_HD int32_t row_pieces(int32_t blocks, int32_t unit) { return (blocks + unit - 1) / unit; }

// Dynamic plans made at the default granularity (DecodeShape::min_blocks_per_part = 0) take parts
// of one block when every block can have its own part (total <= NP) and the default's pieces would
// split a row anyway (a row longer than min_blocks): the longest part drops to one block for the
// same kind of combine. Rows of at most min_blocks blocks keep whole-row parts: no partials, and
// splitting them cost more than the block it saved (docs/perf-log.md: one-block parts).
SELKV_DEC_HD bool one_block_parts_pay(bool default_granularity, int32_t total, int32_t longest_row,
                                      int32_t min_blocks, int32_t num_sm_parts) {
  return default_granularity && min_blocks > 1 && total <= num_sm_parts && longest_row > min_blocks;
}

// Dynamic top-k, row-start cut: the balanced boundary of part q moved to the nearer start of the
// row holding it (ties: the earlier start). Monotone in q, and it splits no row; the scheduler takes
// it when row_start_cut_pays (then no partial is written and the combine CTAs find nothing to merge).
SELKV_DEC_HD int32_t row_start_part_begin(const int32_t* prefix, int32_t rows, int32_t total, int32_t np,
                                          int32_t q) {
  const int32_t g = part_begin(q, total, np);
  if (g >= total) return total;
  const int32_t r = row_containing(prefix, rows, g);
  return g - prefix[r] <= prefix[r + 1] - g ? prefix[r] : prefix[r + 1];
}

// The rule of both row-start cuts (fixed_part_unit, and the scheduler's for dynamic top-k): taken
// when the cut's longest part is at most min(kSplitCostBlocks, balanced / 8) blocks longer than the
// balanced cut's, balanced = ceil(total / np). total >= 1, np >= 1.
SELKV_DEC_HD bool row_start_cut_pays(int64_t longest, int32_t total, int32_t np) {
  const int64_t balanced = (total - 1) / np + 1;
  // The slack is relative (1/8 of the part) as well as bounded: with short rows (MODEL1's 10-block
  // rows) whole rows per part lengthen the critical path far more than the combine costs.
  const int64_t slack = balanced / 8;
  return longest <= balanced + (slack < kSplitCostBlocks ? slack : kSplitCostBlocks);
}

// Fixed top-k: cutting the parts at row starts only leaves no row split: no partial is written and
// the combine kernel is not launched. It costs the balance of the parts (whole rows per part
// instead of total / np blocks), so it is taken when row_start_cut_pays. B=64 S_q=2 H=128 (128
// rows over 66 parts): 64 instead of 63 blocks per part.
// (32-bit divisions: rows * blocks_per_row fits in int32, checked by the host API.)
SELKV_DEC_HD int32_t fixed_part_unit(int32_t rows, int32_t blocks_per_row, int32_t np) {
  if (rows <= 0 || np <= 0) return 1;
  const int64_t whole_rows = int64_t((rows - 1) / np + 1) * blocks_per_row;
  return row_start_cut_pays(whole_rows, rows * blocks_per_row, np) ? blocks_per_row : 1;
}

// Where a dynamic-top-k part starts (DynamicSchedule::start, the scheduler's part entry): its
// blocks [g0, g1), its first row r = blocks [rb, re), the next row r + 1 = blocks [re, re2), and
// the two rows' clamped top-k lengths.
struct PartStart {
  int32_t g0, g1, r, rb, re, re2, len, len2;
};
// Part q's entry as stored (q clamped to the table; DynamicSchedule::clamped bounds the values).
// Its address needs no header word, so a decode CTA loads it beside the header, not after the
// header check: one DRAM round trip before the first index load, not two (docs/perf-log.md:
// part entry beside the header).
SELKV_DEC_HD PartStart load_part_entry(const int32_t* md, int32_t q) {
  const int32_t* e = md + kMdPartEntry + kMdPartEntryInts * (q < 0 ? 0 : (q < kMaxDecodeParts ? q : kMaxDecodeParts - 1));
#if defined(__CUDA_ARCH__)
  // Relaxed (strong) loads: ptxas sank plain ones past the kernel's header check into the one path
  // that uses them, a round trip later again. (L1 is no loss: each CTA reads its entry once.)
  PartStart ps;
  asm volatile("ld.relaxed.gpu.global.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(ps.g0), "=r"(ps.g1), "=r"(ps.r), "=r"(ps.rb) : "l"(e));
  asm volatile("ld.relaxed.gpu.global.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(ps.re), "=r"(ps.re2), "=r"(ps.len), "=r"(ps.len2) : "l"(e + 4));
  return ps;
#else
  return PartStart{e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]};
#endif
}

// Two views of one schedule, with the same interface for the decode and combine kernels.
// Fixed top-k: every row has K / 64 blocks, so the schedule is closed form (no metadata read on
// the hot path; the host validated the shape the plan was made for). This view computes the cut
// from the shape (the host, the scheduler kernel, the combine's fallback); the decode kernels use
// FixedPartSchedule, the same cut from the host's FixedPartition.
struct FixedSchedule {
  int32_t rows, blocks_per_row, total, np, unit;
  SELKV_DEC_HD FixedSchedule(int32_t rows_, int32_t topk, int32_t min_blocks, int32_t num_sm_parts)
      : rows(rows_), blocks_per_row(topk / kBlockTokens), total(rows_ * (topk / kBlockTokens)),
        np(effective_parts(rows_ * (topk / kBlockTokens), min_blocks, num_sm_parts)),
        unit(fixed_part_unit(rows_, topk / kBlockTokens, np)) {}
  SELKV_DEC_HD int32_t prefix(int32_t r) const { return r * blocks_per_row; }
  SELKV_DEC_HD int32_t begin(int32_t q) const { return part_begin(q, total, np, unit); }
  SELKV_DEC_HD int32_t part_of_block(int32_t g) const { return part_of(g, total, np, unit); }
  SELKV_DEC_HD int32_t row_of_part(int32_t q) const { return begin(q) / blocks_per_row; }
  // Whole rows per part: nothing to combine.
  SELKV_DEC_HD bool has_split_rows() const { return unit != blocks_per_row; }
};

// The fixed schedule's cut as the decode kernels take it (DecodeKernelParams::fixed, made by the
// host per call from FixedSchedule): part q's first block unit * floor(q * units / NP) is
// unit * (q * units_per_part + floor(q * units_rem / NP)), units = total / unit; q * units_rem <
// NP^2 <= 2^20, so that is one multiply-high by NP's FastDivmod, and a part's row one more by
// K / 64's. Computing the cut in every CTA took six integer divisions and two calls of the 64-bit
// division routine before the first load (docs/perf-log.md: fixed partition).
struct FixedPartition {
  int32_t unit = 1;
  int32_t units_per_part = 0;  // (total / unit) / NP
  int32_t units_rem = 0;       // (total / unit) % NP
  FastDivmod np;               // NP (divisor)
  FastDivmod blocks_per_row;   // K / 64 (+ K2 / 64) (divisor)
  FixedPartition() = default;
  explicit FixedPartition(const FixedSchedule& s)
      : unit(s.unit), np(uint32_t(s.np > 0 ? s.np : 1)), blocks_per_row(uint32_t(s.blocks_per_row > 0 ? s.blocks_per_row : 1)) {
    const int32_t units = s.total / (s.unit > 0 ? s.unit : 1);
    units_per_part = units / int32_t(np.divisor);
    units_rem = units - units_per_part * int32_t(np.divisor);
  }
};
// The decode kernels' view of the fixed schedule: FixedSchedule's interface (prefix, begin,
// row_of_part, np, total, rows) over a FixedPartition, with no division.
struct FixedPartSchedule {
  int32_t rows, blocks_per_row, total, np, unit;
  FixedPartition part;
  SELKV_DEC_HD FixedPartSchedule(int32_t rows_, const FixedPartition& fp)
      : rows(rows_), blocks_per_row(int32_t(fp.blocks_per_row.divisor)),
        total(rows_ * int32_t(fp.blocks_per_row.divisor)), np(int32_t(fp.np.divisor)), unit(fp.unit), part(fp) {}
  SELKV_DEC_HD int32_t prefix(int32_t r) const { return r * blocks_per_row; }
  // q in [0, NP] (part_begin(q, total, np, unit), exactly).
  SELKV_DEC_HD int32_t begin(int32_t q) const {
    return unit * (q * part.units_per_part + int32_t(part.np.div(uint32_t(q * part.units_rem))));
  }
  SELKV_DEC_HD int32_t row_of_part(int32_t q) const { return int32_t(part.blocks_per_row.div(uint32_t(begin(q)))); }
};
// Dynamic top-k: the scheduler's prefix sums and part table. Reads are clamped to the tables of
// `rows` rows (the host-validated shape), so even a corrupt buffer is never read out of bounds; a
// header that does not match the call (a stale or unwritten buffer) gives np = 0: no part has
// work (the kernel then writes NaN rows, a defined result).
struct DynamicSchedule {
  const int32_t* md;
  int32_t rows, total, np;
  SELKV_DEC_HD DynamicSchedule(const int32_t* md_, int32_t rows_, int32_t topk, int32_t min_blocks,
                               int32_t num_sm_parts)
      : md(md_), rows(rows_) {
    int32_t h[kMdHeaderInts];
    md_load_header(md_, h);
    const bool ok = md_header_ok(h, rows_, topk, min_blocks, num_sm_parts < kMaxDecodeParts ? num_sm_parts : kMaxDecodeParts);
    total = ok ? h[0] : 0;
    np = ok ? h[1] : 0;
  }
  // The scheduler's own view of the plan it is writing (total and part count known: no header).
  struct Known {};
  SELKV_DEC_HD DynamicSchedule(Known, const int32_t* md_, int32_t rows_, int32_t total_, int32_t np_)
      : md(md_), rows(rows_), total(total_), np(np_) {}
  // The same for a call with an extra cache of K2 = topk2 (possibly 0) over `batch` batch entries.
  SELKV_DEC_HD DynamicSchedule(const int32_t* md_, int32_t rows_, int32_t topk, int32_t min_blocks,
                               int32_t num_sm_parts, int32_t batch, int32_t topk2)
      : md(md_), rows(rows_) {
    int32_t h[kMdHeaderInts];
    md_load_header(md_, h);
    const bool ok = md_header_ok_extra(h, md_[md_extra_offset(rows_, batch)], rows_, topk, topk2, min_blocks,
                                       num_sm_parts < kMaxDecodeParts ? num_sm_parts : kMaxDecodeParts);
    total = ok ? h[0] : 0;
    np = ok ? h[1] : 0;
  }
  SELKV_DEC_HD bool valid() const { return np > 0; }
  SELKV_DEC_HD int32_t prefix(int32_t r) const { return md[kMdPrefix + (r < rows ? r : rows)]; }
  // The scheduler's cut (balanced, or at row starts): part q's first block from its entry, clamped
  // to [0, total]; part np (and past it) begins at total.
  SELKV_DEC_HD int32_t begin(int32_t q) const {
    if (q >= np) return total;
    const int32_t b = md[kMdPartEntry + kMdPartEntryInts * (q < 0 ? 0 : q)];  // q < np <= kMaxDecodeParts
    return b < 0 ? 0 : (b > total ? total : b);
  }
  // The part owning block g: the last q < np with begin(q) <= g (a search; scheduler only).
  SELKV_DEC_HD int32_t part_of_block(int32_t g) const {
    int32_t lo = 0, hi = np - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) >> 1;
      if (begin(mid) <= g) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  SELKV_DEC_HD int32_t row_of_part(int32_t q) const { return start(q).r; }
  // Part q's entry (q < np: the caller checks); the decode kernels load it with load_part_entry
  // before the header is checked and clamp it here. Block bounds are clamped to [0, total] and the
  // row to [0, rows). The row bounds are not clamped: every warpgroup reads the same values, so a
  // corrupt entry cannot desynchronize them, and the producer never addresses a block outside
  // [0, K / 64).
  SELKV_DEC_HD PartStart start(int32_t q) const { return clamped(load_part_entry(md, q)); }
  SELKV_DEC_HD PartStart clamped(PartStart ps) const {
    ps.g0 = ps.g0 < 0 ? 0 : (ps.g0 > total ? total : ps.g0);
    ps.g1 = ps.g1 < 0 ? 0 : (ps.g1 > total ? total : ps.g1);
    ps.r = ps.r < 0 ? 0 : (ps.r < rows ? ps.r : rows - 1);
    return ps;
  }
};

// The row whose partials the combine CTA of part q merges: the row split by the boundary at the
// end of part q, when part q is that row's first part (each split row has exactly one such part).
// num_parts == 0: nothing to merge for q.
struct SplitRow {
  int32_t row = 0, first_part = 0, num_parts = 0, first_slot = 0;
};
template <class Schedule>
SELKV_DEC_HD SplitRow split_row_of_part(const Schedule& s, int32_t q) {
  SplitRow sr;
  if (q + 1 >= s.np) return sr;  // no boundary after the last part
  const int32_t boundary = s.begin(q + 1);
  if (boundary >= s.total || boundary <= s.begin(q)) return sr;  // empty part q or nothing after it
  const int32_t r = s.row_of_part(q + 1);  // the row holding block `boundary`
  const int32_t rb = s.prefix(r);
  if (rb == boundary) return sr;                      // the boundary is a row start
  if (s.part_of_block(rb) != q) return sr;            // an earlier part starts this row
  sr.row = r;
  sr.first_part = q;
  sr.num_parts = s.part_of_block(s.prefix(r + 1) - 1) - q + 1;
  // Slots as the decode kernel writes them (PartIter::next): 2p for a part's first row, 2p + 1 for
  // its last row; only part q can have row r as its last row, the later parts start inside it.
  sr.first_slot = 2 * q + (rb == s.begin(q) ? 0 : 1);
  return sr;
}

// Entry i of the split-row table computed from the schedule itself (the scheduler's table in part
// order), by a walk over the parts: the combine's fallback when the plan's header does not match
// the call (the fixed schedule is closed form, so its table can always be rebuilt).
template <class Schedule>
SELKV_DEC_HD SplitRow nth_split_row(const Schedule& s, int32_t i) {
  for (int32_t q = 0, n = 0; q < s.np; ++q) {
    const SplitRow sr = split_row_of_part(s, q);
    if (sr.num_parts > 0 && n++ == i) return sr;
  }
  return SplitRow{};
}

// Schedule rows are query-position-major: row = s * batch + b. A part is a contiguous run of rows,
// so (S_q dividing the part count) the S_q query positions of one batch entry are worked on at the
// same time by different CTAs, which then share that entry's cache pages in L2; batch-major rows
// put them one after another in the same CTA, ~100 us apart. FlashMLA gets the same effect from
// s_q as a grid dimension (docs/perf-log.md: s-major rows).
struct RowCoord {
  int32_t b, s;
};
SELKV_DEC_HD RowCoord row_coord(int32_t row, int32_t batch) {
  const int32_t s = row / batch;
  return {row - s * batch, s};
}

// Field order follows first use: a kernel parameter is read through the constant cache, where a
// cold 64-byte line stalls the warp (it is not scoreboarded), one line after another. SM90 puts the
// parameters at constant-bank offset 0x210, so their first 48 bytes share a line: everything a
// dynamic kernel's entry reads (the schedule fields, the metadata pointer, and for the extra
// cache's plan words the batch and K2) sits there; the fixed cut follows (the fixed kernels read
// it at entry: two lines); the producer's first index load then needs the next lines, the
// consumers' Q load a later one (docs/perf-log.md: decode parameter order, parameter lines).
struct DecodeKernelParams {
  int32_t num_rows;             // batch * seq_q, numbered s * batch + b (row_coord)
  int32_t topk;
  int32_t min_blocks_per_part;  // the plan's
  int32_t num_sm_parts;         // grid parts; parts >= NP exit at once
  const int32_t* metadata;      // see layout above (read by the dynamic top-k kernels only)
  int32_t batch;
  int32_t topk_extra;           // K2 of the extra KV cache (model1_fp8 kernels; 0: none)
  FixedPartition fixed;         // fixed top-k: the cut, from the host (launch_decode)
  int32_t seq_q;

  const int32_t* indices;
  int64_t indices_batch_stride, indices_seq_stride;
  const int32_t* topk_length;  // non-null: dynamic top-k (kernels read the plan's length snapshot)
  const uint8_t* cache;
  int64_t num_slots;
  FastDivmod page;  // slot -> (block, offset) without an integer division on the index path
  int32_t page_size;
  int64_t block_stride_bytes;

  const uint16_t* q;  // bf16
  int64_t q_batch_stride, q_seq_stride, q_head_stride;
  float sm_scale;
  float sm_scale_log2;  // sm_scale * log2(e)
  int32_t num_heads;
  const float* attn_sink;  // [H] or null

  uint16_t* out;  // bf16
  int64_t out_batch_stride, out_seq_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_seq_stride;
  float* accum_out;  // 2 * num_sm_parts slots of the normalized partial out: fp32 [H, 512] each,
                     // partial_slot_elems apart, or (fp16 partials) fp16 [2 * num_sm_parts, H, 512]
                     // in the first half of [2 * num_sm_parts, H, 512] floats, then the inverse
                     // scales [2 * num_sm_parts, H, 2] (partial_scale.h)
  float* accum_lse;  // [2 * num_sm_parts, H], accum_out_floats past accum_out

  // Extra KV cache (kernels built with one, DecodeKernelTraits::kExtra; topk_extra == 0: none;
  // topk_extra itself sits with the entry fields above).
  const int32_t* extra_topk_length;  // non-null: the plan has lengths (dynamic)
  const int32_t* extra_indices;
  int64_t extra_indices_batch_stride, extra_indices_seq_stride;
  const uint8_t* extra_cache;
  int64_t extra_num_slots;
  FastDivmod extra_page;
  int32_t extra_page_size;
  int64_t extra_block_stride_bytes;

  float empty_lse;  // the lse written for a row with no valid entry: -inf, or +inf (FlashMLA's)
};
static_assert(offsetof(DecodeKernelParams, metadata) + sizeof(const int32_t*) <= 48 &&
                  offsetof(DecodeKernelParams, batch) + sizeof(int32_t) <= 48 &&
                  offsetof(DecodeKernelParams, topk_extra) + sizeof(int32_t) <= 48,
              "a dynamic kernel's entry reads one constant line: parameter bytes [0, 48) (bank 0x210-0x23f)");
static_assert(sizeof(FastDivmod) == 12, "DecodeKernelParams packs page with page_size into 16 bytes");
static_assert(offsetof(DecodeKernelParams, num_rows) == 0 && offsetof(DecodeKernelParams, num_sm_parts) == 12,
              "the schedule's fields stay in the first 16 bytes of the parameters (first-use order)");

// Whether a call's plan has lengths (the dynamic kernels and schedule): either cache's top-k length.
SELKV_DEC_HD bool has_lengths(const DecodeKernelParams& p) {
  return p.topk_length != nullptr || p.extra_topk_length != nullptr;
}

// The schedule view of an instantiation: closed form for fixed top-k, the metadata for dynamic.
template <bool kDynamic>
SELKV_DEC_HD auto make_schedule(const DecodeKernelParams& p) {
  if constexpr (kDynamic) {
    return DynamicSchedule(p.metadata, p.num_rows, p.topk, p.min_blocks_per_part, p.num_sm_parts);
  } else {
    return FixedPartSchedule(p.num_rows, p.fixed);
  }
}
// The same for kernels with an extra cache: K / 64 + K2 / 64 blocks per row when fixed.
template <bool kDynamic>
SELKV_DEC_HD auto make_schedule_extra(const DecodeKernelParams& p) {
  if constexpr (kDynamic) {
    return DynamicSchedule(p.metadata, p.num_rows, p.topk, p.min_blocks_per_part, p.num_sm_parts, p.batch,
                           p.topk_extra);
  } else {
    return FixedPartSchedule(p.num_rows, p.fixed);
  }
}

}  // namespace selkv::decode
