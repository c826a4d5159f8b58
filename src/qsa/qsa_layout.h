// Layout of the C8 virtual page-4 plan (selkv/qsa.h qsa_plan): one int32 buffer, written by the
// GPU metadata kernel (to come) and by its CPU reference selkv::ref::qsa_plan, read by the page-4
// attention kernel. Header-only, host and device.
//
//   words [0, 8)         header: kMagic, num_rows R, max_blocks K, capacity C = K + 1, 0, 0, 0, 0
//   words [8, 8 + R)     counts[r]: entries of row r (0..C), or kIrregular
//   words [E, E + 2RC)   entries[r][c] = {page, word}, E = 8 + round_up(R, 4) (16-byte aligned)
//
// An entry is one virtual page: 4 consecutive slots of physical page `page` starting at the
// 4-aligned slot base = (word >> 4) * 4, of which the slots base + i with bit i of (word & 15)
// set are valid tokens (mask never 0). K and V of slot base + i of kv head h are read at
// page * page_stride + (base + i) * slot_stride + h * head_stride; nothing outside the mask is.
//
// Per row: one entry per group of the selection that holds at least one valid token — compact:
// each of the first clamp(count, 0, K) blocks, then the partial block; expanded: each 4-column
// group, columns 4j..4j+3 (the last group has 3). A group's valid tokens must be distinct tokens
// of one logical block t / 4 (so of one physical page, P being a multiple of 4); an expanded group
// that is not (repeated token, tokens of two blocks) makes the whole row kIrregular: its entries
// are not written and the simple kernel must compute it. Groups with no valid token are dropped.
// Order: the entries not of the causal tail block, sorted by (page, base) ascending — equal keys
// (a block selected twice) keep the selection order —, then the tail entries in selection order.
// The causal tail block of position p is floor((p + 1) / 4) (the block p + 1 falls in: the
// partial block when well formed). Entries c >= counts[r] are unspecified.
#pragma once

#include <cstddef>
#include <cstdint>

namespace selkv::qsa {

inline constexpr int32_t kMagic = 0x51534134;  // "4ASQ" little endian: 'Q' 'S' 'A' '4'
inline constexpr int32_t kHeaderWords = 8;
inline constexpr int32_t kIrregular = -1;       // counts[r]: the row has no page-4 table

inline constexpr int64_t capacity(int64_t max_blocks) { return max_blocks + 1; }
inline constexpr int64_t counts_offset() { return kHeaderWords; }
inline constexpr int64_t entries_offset(int64_t num_rows) { return kHeaderWords + (num_rows + 3) / 4 * 4; }
// Word offset of entry c of row r (its page; the packed word follows).
inline constexpr int64_t entry_offset(int64_t num_rows, int64_t max_blocks, int64_t r, int64_t c) {
  return entries_offset(num_rows) + (r * capacity(max_blocks) + c) * 2;
}
inline constexpr int64_t total_words(int64_t num_rows, int64_t max_blocks) {
  return entries_offset(num_rows) + num_rows * capacity(max_blocks) * 2;
}

inline constexpr int32_t pack_word(int32_t slot_base, int32_t mask) { return ((slot_base >> 2) << 4) | mask; }
inline constexpr int32_t word_slot_base(int32_t word) { return (word >> 4) * 4; }
inline constexpr int32_t word_mask(int32_t word) { return word & 15; }

}  // namespace selkv::qsa
