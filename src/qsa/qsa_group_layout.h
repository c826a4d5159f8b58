// Layout of the C8 page-4 plan, the group plan (selkv::qsa_plan; the page-4 kernel streams it). For
// groups of `rows_per_group` consecutive rows it lists, per group, the distinct 4-token blocks its
// rows select and which row uses which token, so the attention CTA only streams it.
// Header-only, host and device. CPU reference: selkv::ref::qsa_group_plan.
//
//   words [0, 8)            header: kGroupMagic, R, K, rows_per_group, num_groups, 0, 0, 0
//   words [8, 8 + 4R)       group g (g < num_groups): {first block, block count, bad-row mask, 0}
//   words [B, B + 2RC)      blocks' {page, slot base}, B = 8 + 4R (C = K + 1)
//   words [T, T + 4RC)      blocks' token words {w0, w1, w2, w3}, T = round_up(B + 2RC, 4)
//
// Group g owns blocks [g * rows_per_group * C, + its count): at most C per row, so no group can
// overflow whatever the selection. Block = 4 consecutive slots of one physical page from a 4-aligned
// slot base; bit j of w_i: row g * rows_per_group + j uses slot base + i (a valid token of its
// selection). Order: the valid request ids in order of first appearance among the group's rows,
// within a request ascending logical block (so the causal partial block of each row comes after
// its complete blocks). A row is bad (mask bit set, no token bits; the fix-up pass computes it)
// when an expanded group of its selection is not distinct tokens of one block, or it selects a
// block twice. In the route's plan (qsa_plan; `hand_over` of the group plan) a group whose rows
// share too little (the (row, block) uses of its blocks fewer than kGroupSharingNum /
// kGroupSharingDen times its block count) lists no blocks and has every row bad: the page-4 kernel
// would multiply each block of the union against every row of the group, so the fix-up pass (the
// simple kernel, which reads each row's blocks once for that row) serves it for less. Every other
// word (blocks past a group's count, the table past the last group, the padding) is 0, on the GPU
// as in the CPU reference.
#pragma once

#include <cstdint>

namespace selkv::qsa {

inline constexpr int32_t kGroupMagic = 0x47534134;  // "4ASG" little endian
inline constexpr int32_t kGroupHeaderWords = 8;
inline constexpr int kGroupMaxRows = 32;  // rows of a group: one bit each in a token word
// Row uses a listed block needs on average (7 / 4) for the group to take the page-4 kernel: on the
// H200 a union block costs the page-4 kernel ~1 ns, a row's block the simple kernel 0.5-0.7 ns.
inline constexpr int32_t kGroupSharingNum = 7, kGroupSharingDen = 4;

inline constexpr int64_t group_capacity(int64_t max_blocks) { return max_blocks + 1; }  // blocks a row adds at most
inline constexpr int64_t group_table_offset() { return kGroupHeaderWords; }
inline constexpr int64_t group_blocks_offset(int64_t num_rows) { return kGroupHeaderWords + 4 * num_rows; }
inline constexpr int64_t group_tokw_offset(int64_t num_rows, int64_t max_blocks) {
  return (group_blocks_offset(num_rows) + 2 * num_rows * group_capacity(max_blocks) + 3) / 4 * 4;
}
inline constexpr int64_t group_plan_words(int64_t num_rows, int64_t max_blocks) {
  return group_tokw_offset(num_rows, max_blocks) + 4 * num_rows * group_capacity(max_blocks);
}

}  // namespace selkv::qsa
