// C4 selected-row dequant: CPU tests (shape rules, argument validation, oracle semantics).
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "reference/oracle.h"
#include "selkv/dequant.h"
#include "test_util.h"

namespace {

using namespace selkv;

TEST(DequantSelectedShapes, ModeAndWorkspaceRows) {
  EXPECT_EQ(dequant_selected_workspace_rows(64, 2048, 1 << 20), 64 * 2048);
  EXPECT_EQ(dequant_selected_mode(64, 2048, 1 << 20), DequantMode::kSelected);
  EXPECT_EQ(dequant_selected_workspace_rows(4096, 2048, 131072), 131072);
  EXPECT_EQ(dequant_selected_mode(4096, 2048, 131072), DequantMode::kFullPool);
  EXPECT_EQ(dequant_selected_mode(2, 64, 128), DequantMode::kFullPool);  // N == P: full pool
  EXPECT_EQ(dequant_selected_workspace_rows(0, 2048, 100), 0);
  EXPECT_EQ(dequant_selected_workspace_rows(5, 0, 100), 0);
  EXPECT_EQ(dequant_selected_workspace_rows(5, 7, 0), 0);
}

struct Fixture {
  alignas(16) uint8_t cache[16 * 656 * 4] = {};
  alignas(16) int32_t idx[4 * 64] = {};
  alignas(16) int32_t out_idx[4 * 64] = {};
  alignas(16) uint16_t ws[64 * 576] = {};
  DequantSelectedParams p;
  Fixture() {
    p.cache = PagedKvCache{cache, 4, 4, 4 * 656, KvFormat::kDsMlaFp8};  // P = 16
    p.indices = idx;
    p.indices_row_stride = 64;
    p.num_tokens = 1;
    p.topk = 8;  // N = 8 < 16: selected
    p.workspace = ws;
    p.workspace_rows = 8;
    p.workspace_row_stride = 576;
    p.out_indices = out_idx;
    p.out_indices_row_stride = 64;
  }
};

void expect_invalid(const DequantSelectedParams& p, const char* arg) {
  const Status st = check_dequant_selected(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << arg << ": " << st.to_string();
  EXPECT_NE(st.message().find(arg), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("selkv::dequant_selected_kv"), std::string::npos);
}

TEST(DequantSelectedChecks, AcceptsValid) {
  Fixture f;
  EXPECT_TRUE(check_dequant_selected(f.p).ok()) << check_dequant_selected(f.p).to_string();
  f.p.num_tokens = 0;
  f.p.indices = nullptr;
  EXPECT_TRUE(check_dequant_selected(f.p).ok());
}

TEST(DequantSelectedChecks, WorkspaceTooSmall) {
  Fixture f;
  f.p.workspace_rows = 7;
  Status st = check_dequant_selected(f.p);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  EXPECT_NE(st.message().find("need 8 rows"), std::string::npos) << st.message();
  f.p.num_tokens = 4;  // N = 32 >= 16: full pool needs 16
  f.p.workspace_rows = 15;
  st = check_dequant_selected(f.p);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_NE(st.message().find("need 16 rows"), std::string::npos) << st.message();
  f.p.workspace_rows = 16;
  EXPECT_TRUE(check_dequant_selected(f.p).ok());
}

TEST(DequantSelectedChecks, RejectsBadArguments) {
  { Fixture f; f.p.cache.format = KvFormat(7); expect_invalid(f.p, "cache.format"); }
  { Fixture f; f.p.cache.page_size = 0; expect_invalid(f.p, "cache.page_size"); }
  { Fixture f; f.p.cache.block_stride_bytes = 4 * 656 - 16; expect_invalid(f.p, "cache.block_stride_bytes"); }
  { Fixture f; f.p.cache.block_stride_bytes = 4 * 656 + 8; expect_invalid(f.p, "cache.block_stride_bytes"); }
  { Fixture f; f.p.cache.num_blocks = -1; expect_invalid(f.p, "cache.num_blocks"); }
  { Fixture f; f.p.cache.num_blocks = (int64_t(1) << 30); f.p.cache.page_size = 4; f.p.cache.block_stride_bytes = 4 * 656;
    expect_invalid(f.p, "cache.num_blocks"); }
  { Fixture f; f.p.cache.data = f.cache + 8; expect_invalid(f.p, "cache.data"); }
  { Fixture f; f.p.cache.data = nullptr; expect_invalid(f.p, "cache.data"); }
  { Fixture f; f.p.num_tokens = -1; expect_invalid(f.p, "num_tokens"); }
  { Fixture f; f.p.topk = -1; expect_invalid(f.p, "topk"); }
  { Fixture f; f.p.indices = nullptr; expect_invalid(f.p, "indices"); }
  { Fixture f; f.p.indices = reinterpret_cast<const int32_t*>(f.cache + 2); expect_invalid(f.p, "indices"); }
  { Fixture f; f.p.indices_row_stride = 7; expect_invalid(f.p, "indices_row_stride"); }
  { Fixture f; f.p.out_indices = nullptr; expect_invalid(f.p, "out_indices"); }
  { Fixture f; f.p.out_indices_row_stride = 7; expect_invalid(f.p, "out_indices_row_stride"); }
  { Fixture f; f.p.out_indices = f.idx; f.p.out_indices_row_stride = 65; f.p.indices_row_stride = 64;
    expect_invalid(f.p, "out_indices_row_stride"); }
  { Fixture f; f.p.topk_length = reinterpret_cast<const int32_t*>(f.cache + 1); expect_invalid(f.p, "topk_length"); }
  { Fixture f; f.p.workspace = nullptr; expect_invalid(f.p, "workspace"); }
  { Fixture f; f.p.workspace = f.ws + 1; expect_invalid(f.p, "workspace"); }
  { Fixture f; f.p.workspace_row_stride = 512; expect_invalid(f.p, "workspace_row_stride"); }
  { Fixture f; f.p.workspace_row_stride = 580; expect_invalid(f.p, "workspace_row_stride"); }
  { Fixture f; f.p.cache.format = KvFormat::kNopeFp8; f.p.cache.block_stride_bytes = 4 * 528;
    f.p.workspace_row_stride = 512; EXPECT_TRUE(check_dequant_selected(f.p).ok()); }
}

// Issue 15: outputs (workspace rows, out_indices) overlapping each other or an input.
TEST(DequantSelectedChecks, RejectsOverlaps) {
  { Fixture f; f.p.workspace = f.cache + 656; expect_invalid(f.p, "workspace"); }  // inside the cache
  { Fixture f; f.p.cache.data = f.ws + 576 * 7; expect_invalid(f.p, "workspace"); }
  { Fixture f; f.p.workspace = reinterpret_cast<uint8_t*>(f.idx) - 16; expect_invalid(f.p, "workspace"); }
  { Fixture f; f.p.out_indices = reinterpret_cast<int32_t*>(f.ws + 576); expect_invalid(f.p, "workspace"); }
  { Fixture f; alignas(16) static int32_t len[1]; f.p.topk_length = len; f.p.workspace = len; expect_invalid(f.p, "workspace"); }
  { Fixture f; f.p.out_indices = reinterpret_cast<int32_t*>(f.cache + 16); expect_invalid(f.p, "out_indices"); }
  { Fixture f; f.p.topk_length = f.out_idx + 3; expect_invalid(f.p, "out_indices"); }
  // Partial overlap with indices (shifted, or the same buffer at another stride) is not in place.
  { Fixture f; f.p.out_indices = f.idx + 4; expect_invalid(f.p, "out_indices"); }
  { Fixture f; f.p.num_tokens = 2; f.p.workspace_rows = 16; f.p.out_indices = f.idx + 64; expect_invalid(f.p, "out_indices"); }
  // In place (same pointer, same stride) stays allowed.
  { Fixture f; f.p.out_indices = f.idx; EXPECT_TRUE(check_dequant_selected(f.p).ok()) << check_dequant_selected(f.p).to_string(); }
  // Full pool reads the whole cache: a workspace right after it is fine, one inside it is not.
  { Fixture f; f.p.num_tokens = 2; f.p.workspace_rows = 16;
    f.p.workspace = f.cache + 4 * 4 * 656; EXPECT_TRUE(check_dequant_selected(f.p).ok()) << check_dequant_selected(f.p).to_string();
    f.p.workspace = f.cache + 4 * 4 * 656 - 16; expect_invalid(f.p, "workspace"); }
}

// Oracle semantics on a hand-made case: remap, -1 for every kind of invalid entry, duplicates.
TEST(DequantSelectedOracle, SelectedAndFullPoolSemantics) {
  Fixture f;
  std::mt19937_64 rng(7);
  std::vector<uint16_t> lat(512), rope(64);
  for (int s = 0; s < 16; ++s) {
    for (auto& x : lat) x = test::bf16(float(int(rng() % 200) - 100) / 16.f);
    for (auto& x : rope) x = test::bf16(float(int(rng() % 200) - 100) / 16.f);
    ref::encode_record(lat.data(), rope.data(), KvFormat::kDsMlaFp8, ScaleMode::kPow2,
                       f.cache + f.p.cache.slot_offset(s));
  }
  const int32_t row[8] = {3, -1, 16, 3, INT_MAX, 15, INT_MIN, 0};
  for (int k = 0; k < 8; ++k) f.idx[k] = row[k];
  for (auto& w : f.ws) w = 0xABCD;
  ASSERT_TRUE(ref::dequant_selected(f.p).ok());
  const int32_t want[8] = {0, -1, -1, 3, -1, 5, -1, 7};
  uint16_t dec[576];
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(f.out_idx[k], want[k]) << k;
    if (want[k] >= 0) {
      ref::decode_record(f.cache + f.p.cache.slot_offset(row[k]), KvFormat::kDsMlaFp8, dec);
      EXPECT_EQ(0, std::memcmp(dec, f.ws + size_t(k) * 576, sizeof(dec))) << k;
    } else {
      EXPECT_EQ(f.ws[size_t(k) * 576], 0xABCD) << "invalid row must stay untouched " << k;
    }
  }
  // topk_length cuts the row: entries k >= 2 invalid.
  const int32_t len = 2;
  f.p.topk_length = &len;
  ASSERT_TRUE(ref::dequant_selected(f.p).ok());
  EXPECT_EQ(f.out_idx[0], 0);
  for (int k = 2; k < 8; ++k) EXPECT_EQ(f.out_idx[k], -1);
  // Full pool: 2 rows x 8 = 16 >= P = 16; indices kept, invalid -> -1.
  f.p.topk_length = nullptr;
  f.p.num_tokens = 2;
  f.p.workspace_rows = 16;
  for (int k = 0; k < 8; ++k) f.idx[64 + k] = row[7 - k];
  ASSERT_TRUE(ref::dequant_selected(f.p).ok());
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(f.out_idx[k], (row[k] >= 0 && row[k] < 16) ? row[k] : -1);
    EXPECT_EQ(f.out_idx[64 + k], (row[7 - k] >= 0 && row[7 - k] < 16) ? row[7 - k] : -1);
  }
  for (int s = 0; s < 16; ++s) {
    ref::decode_record(f.cache + f.p.cache.slot_offset(s), KvFormat::kDsMlaFp8, dec);
    EXPECT_EQ(0, std::memcmp(dec, f.ws + size_t(s) * 576, sizeof(dec))) << s;
  }
}

// ---- model1_fp8 ---------------------------------------------------------------------------------

struct Model1Fixture {
  // 4 blocks of page 4: page_bytes = round_up(4 * 584, 576) = 2880; stride 2880 + 32.
  static constexpr int64_t kStride = 2880 + 32;
  alignas(16) uint8_t cache[4 * kStride] = {};
  alignas(16) int32_t idx[2 * 64] = {};
  alignas(16) int32_t out_idx[2 * 64] = {};
  alignas(16) uint16_t ws[16 * 512] = {};
  DequantSelectedParams p;
  Model1Fixture() {
    p.cache = PagedKvCache{cache, 4, 4, kStride, KvFormat::kModel1Fp8};  // P = 16
    p.indices = idx;
    p.indices_row_stride = 64;
    p.num_tokens = 1;
    p.topk = 8;
    p.workspace = ws;
    p.workspace_rows = 8;
    p.workspace_row_stride = 512;
    p.out_indices = out_idx;
    p.out_indices_row_stride = 64;
  }
};

TEST(DequantSelectedChecks, Model1Rules) {
  { Model1Fixture f; EXPECT_TRUE(check_dequant_selected(f.p).ok()) << check_dequant_selected(f.p).to_string(); }
  { Model1Fixture f; f.p.cache.block_stride_bytes = 4 * 584; expect_invalid(f.p, "cache.block_stride_bytes"); }
  { Model1Fixture f; f.p.cache.block_stride_bytes = 2880 - 16; expect_invalid(f.p, "cache.block_stride_bytes"); }
  { Model1Fixture f; f.p.workspace_row_stride = 448; expect_invalid(f.p, "workspace_row_stride"); }
  { Model1Fixture f; f.p.cache.format = KvFormat(5); expect_invalid(f.p, "cache.format"); }
  // The oracle applies the same rules.
  { Model1Fixture f; f.p.cache.block_stride_bytes = 4 * 584;
    EXPECT_EQ(ref::dequant_selected(f.p).code(), StatusCode::kInvalidArgument); }
  { Model1Fixture f; f.p.workspace_row_stride = 448;
    EXPECT_EQ(ref::dequant_selected(f.p).code(), StatusCode::kInvalidArgument); }
}

// Oracle C4 on model1_fp8: rows decode the token bytes where DESIGN §1 puts them (record at
// in_page * 576, scales at page_size * 576 + in_page * 8 of the slot's block), both modes.
TEST(DequantSelectedOracle, Model1SelectedAndFullPool) {
  Model1Fixture f;
  std::mt19937_64 rng(11);
  std::vector<uint16_t> lat(448), rope(64);
  std::vector<std::vector<uint8_t>> alone(16, std::vector<uint8_t>(584));
  for (int s = 0; s < 16; ++s) {
    for (auto& x : lat) x = test::bf16(float(int(rng() % 200) - 100) / 16.f);
    for (auto& x : rope) x = test::bf16(float(int(rng() % 200) - 100) / 16.f);
    ref::encode_record(lat.data(), rope.data(), KvFormat::kModel1Fp8, ScaleMode::kPow2, alone[size_t(s)].data());
    uint8_t* page = f.cache + (s / 4) * Model1Fixture::kStride;
    std::memcpy(page + (s % 4) * 576, alone[size_t(s)].data(), 576);
    std::memcpy(page + 4 * 576 + (s % 4) * 8, alone[size_t(s)].data() + 576, 8);
  }
  const int32_t row[8] = {3, -1, 16, 3, INT_MAX, 15, INT_MIN, 6};
  for (int k = 0; k < 8; ++k) f.idx[k] = row[k];
  for (auto& w : f.ws) w = 0xABCD;
  ASSERT_TRUE(ref::dequant_selected(f.p).ok());
  const int32_t want[8] = {0, -1, -1, 3, -1, 5, -1, 7};
  uint16_t dec[512];
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(f.out_idx[k], want[k]) << k;
    if (want[k] >= 0) {
      ref::decode_record(alone[size_t(row[k])].data(), KvFormat::kModel1Fp8, dec);
      EXPECT_EQ(0, std::memcmp(dec, f.ws + size_t(k) * 512, sizeof(dec))) << k;
    } else {
      EXPECT_EQ(f.ws[size_t(k) * 512], 0xABCD) << "invalid row must stay untouched " << k;
    }
  }
  f.p.num_tokens = 2;  // N = 16 >= P: full pool
  f.p.workspace_rows = 16;
  ASSERT_TRUE(ref::dequant_selected(f.p).ok());
  for (int s = 0; s < 16; ++s) {
    ref::decode_record(alone[size_t(s)].data(), KvFormat::kModel1Fp8, dec);
    EXPECT_EQ(0, std::memcmp(dec, f.ws + size_t(s) * 512, sizeof(dec))) << s;
  }
}

}  // namespace
