// CPU tests of the C6 pack / patch argument rules (src/packed/packed_checks.cpp) and of
// packed_kv_workspace_size: every bad argument is rejected before any CUDA call, with a message
// naming the op and the argument; zero-row calls are no-ops that need no pointers.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "packed/packed_checks.h"
#include "packed/packed_layout.h"
#include "selkv/packed.h"

namespace selkv {
namespace {

// Fake, never dereferenced device pointers: each 16-byte step of `byte_offset` is its own 4 GiB
// region (so no two arguments overlap), and byte_offset % 16 is kept (misalignment tests).
template <typename T = void>
T* fake(size_t byte_offset = 0) {
  return reinterpret_cast<T*>(uintptr_t(1) << 44 | (byte_offset & ~size_t(15)) << 28 | (byte_offset & 15));
}
template <typename T = void>
T* at(const void* base, int64_t byte_offset) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) + byte_offset);
}

constexpr int32_t kB = 2, kS = 3, kK = 128;
const size_t kBytes = packed_kv_workspace_size(kB, kS, kK);

PackSelectedKvParams good_pack() {
  PackSelectedKvParams p;
  p.cache = PagedKvCache{fake(0), 10, 64, 64 * 656, KvFormat::kDsMlaFp8};
  p.indices = fake<const int32_t>(16);
  p.indices_batch_stride = kS * kK;
  p.indices_seq_stride = kK;
  p.batch = kB;
  p.seq_q = kS;
  p.topk = kK;
  p.topk_length = fake<const int32_t>(32);
  p.packed_kv = fake(48);
  p.packed_kv_bytes = kBytes;
  return p;
}

PatchPackedKvParams good_patch() {
  PatchPackedKvParams p;
  p.packed_kv = fake(0);
  p.packed_kv_bytes = kBytes;
  p.batch = kB;
  p.seq_q = kS;
  p.topk = kK;
  p.positions = fake<const int64_t>(16);
  p.records = fake<const uint8_t>(32);
  p.record_stride_bytes = 656;
  p.num_records = 6;
  return p;
}

void expect_status(const Status& st, StatusCode code, const char* op, const std::string& arg) {
  EXPECT_EQ(st.code(), code) << arg << ": " << st.to_string();
  EXPECT_NE(st.message().find(op), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(": " + arg + ":"), std::string::npos) << "expected argument '" << arg << "' in: "
                                                                   << st.message();
}

void expect_pack_invalid(const PackSelectedKvParams& p, const std::string& arg) {
  expect_status(check_pack_selected_kv(p), StatusCode::kInvalidArgument, "selkv::pack_selected_kv", arg);
}
void expect_patch_invalid(const PatchPackedKvParams& p, const std::string& arg) {
  expect_status(check_patch_packed_kv(p), StatusCode::kInvalidArgument, "selkv::patch_packed_kv", arg);
}

// ---- packed_kv_workspace_size / layout ------------------------------------------------------------
TEST(PackedWorkspaceSize, RecordsThenValidityWords) {
  // records, validity words, then the 16 bytes of shape words
  EXPECT_EQ(packed_kv_workspace_size(1, 1, 64), size_t(64 * 656 + 8 + 16));
  EXPECT_EQ(packed_kv_workspace_size(2, 3, 2048), size_t(6) * 2048 * 656 + 6 * 2048 / 8 + 16);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, 2048), size_t(1343488 + 256 + 16));  // ~1.28 MiB per row
  EXPECT_EQ(packed::packed_validity_offset(6, 2048), int64_t(6) * 2048 * 656);
  EXPECT_EQ(packed::packed_record_offset(5), 5 * 656);
  EXPECT_EQ(packed::packed_bytes(6, 2048), int64_t(packed_kv_workspace_size(2, 3, 2048)));
  EXPECT_EQ(packed::packed_validity_offset(1, 64) % 16, 0);
  EXPECT_EQ(packed::packed_shape_offset(6, 2048), int64_t(6) * 2048 * 656 + 6 * 2048 / 8);
  EXPECT_EQ(packed::packed_shape_offset(1, 64) % 8, 0);  // (8-byte aligned: K / 8 is a multiple of 8)
}

TEST(PackedWorkspaceSize, ZeroForInvalidOrEmptyShapes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(packed_kv_workspace_size(0, 4, 64), 0u);  // no rows
  EXPECT_EQ(packed_kv_workspace_size(4, 0, 64), 0u);
  EXPECT_EQ(packed_kv_workspace_size(-1, 1, 64), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, -1, 64), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, 0), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, -64), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, 100), 0u);  // not a multiple of 64
  EXPECT_EQ(packed_kv_workspace_size(1, 1, 32), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, (int64_t(1) << 30) + 64), 0u);
  // B * S_q * K < 2^31 entries: 2^31 - 2048 is the largest at K = 2048.
  EXPECT_EQ(packed_kv_workspace_size(1 << 20, 1, 2048), 0u);
  EXPECT_EQ(packed_kv_workspace_size(1, 1 << 20, 2048), 0u);
  EXPECT_EQ(packed_kv_workspace_size((1 << 20) - 1, 1, 2048), size_t((int64_t(1) << 31) - 2048) * 656 +
                                                                   size_t((int64_t(1) << 31) - 2048) / 8 + 16);
  EXPECT_EQ(packed_kv_workspace_size(1, 1, int64_t(1) << 30), size_t(int64_t(1) << 30) * 656 + (size_t(1) << 27) + 16);
  EXPECT_EQ(packed_kv_workspace_size(2, 1, int64_t(1) << 30), 0u);
  EXPECT_EQ(packed_kv_workspace_size(kMax, kMax, 64), 0u);  // no overflow
  EXPECT_EQ(packed_kv_workspace_size(kMax, 2, 1 << 20), 0u);
}

// ---- pack ----------------------------------------------------------------------------------------
TEST(PackChecks, AcceptsValid) {
  PackSelectedKvParams p = good_pack();
  EXPECT_TRUE(check_pack_selected_kv(p).ok()) << check_pack_selected_kv(p).to_string();
  p.topk_length = nullptr;
  EXPECT_TRUE(check_pack_selected_kv(p).ok());
  p.packed_kv_bytes = kBytes + 1000;  // larger is fine
  EXPECT_TRUE(check_pack_selected_kv(p).ok());
  // Broadcast index rows (stride 0) are inputs: allowed.
  p.indices_batch_stride = 0;
  p.indices_seq_stride = 0;
  EXPECT_TRUE(check_pack_selected_kv(p).ok());
  // An empty cache: every index is invalid, nothing is read, data may be null.
  p = good_pack();
  p.cache.num_blocks = 0;
  p.cache.data = nullptr;
  EXPECT_TRUE(check_pack_selected_kv(p).ok()) << check_pack_selected_kv(p).to_string();
  // Odd pages and a padded block stride.
  p = good_pack();
  p.cache.page_size = 61;
  p.cache.block_stride_bytes = 61 * 656 + 48;
  EXPECT_TRUE(check_pack_selected_kv(p).ok());
}

TEST(PackChecks, ZeroRowsTouchNothing) {
  for (auto [b, s] : {std::pair{0, 3}, std::pair{2, 0}, std::pair{0, 0}}) {
    PackSelectedKvParams p = good_pack();
    p.batch = b;
    p.seq_q = s;
    p.indices = nullptr;
    p.topk_length = nullptr;
    p.packed_kv = nullptr;
    p.packed_kv_bytes = 0;
    p.cache.data = nullptr;
    packed::Work work = packed::Work::kLaunch;
    EXPECT_TRUE(packed::check_pack(p, &work).ok()) << packed::check_pack(p, &work).to_string();
    EXPECT_EQ(work, packed::Work::kNone);
    // The shape and format rules still hold.
    p.topk = 96;
    expect_pack_invalid(p, "topk");
    p.topk = kK;
    p.cache.format = KvFormat::kNopeFp8;
    expect_pack_invalid(p, "cache.format");
  }
  packed::Work work = packed::Work::kNone;
  EXPECT_TRUE(packed::check_pack(good_pack(), &work).ok());
  EXPECT_EQ(work, packed::Work::kLaunch);
}

TEST(PackChecks, RejectsBadShapes) {
  { auto p = good_pack(); p.batch = -1; expect_pack_invalid(p, "batch"); }
  { auto p = good_pack(); p.seq_q = -2; expect_pack_invalid(p, "seq_q"); }
  for (int32_t k : {0, -64, 32, 100, 65, 2047}) {
    auto p = good_pack();
    p.topk = k;
    expect_pack_invalid(p, "topk");
  }
  { auto p = good_pack(); p.topk = (1 << 30) + 64; expect_pack_invalid(p, "topk"); }
  { auto p = good_pack(); p.batch = 1 << 16; p.seq_q = 1 << 10; p.topk = 2048; expect_pack_invalid(p, "batch"); }
  { auto p = good_pack(); p.batch = 1 << 20; p.seq_q = 1; p.topk = 2048; expect_pack_invalid(p, "batch"); }  // = 2^31
  { auto p = good_pack(); p.batch = 2; p.seq_q = 1; p.topk = 1 << 30; expect_pack_invalid(p, "batch"); }
}

TEST(PackChecks, RejectsBadCache) {
  { auto p = good_pack(); p.cache.format = KvFormat::kNopeFp8; p.cache.block_stride_bytes = 64 * 528;
    expect_pack_invalid(p, "cache.format"); }
  { auto p = good_pack(); p.cache.format = KvFormat(7); expect_pack_invalid(p, "cache.format"); }
  { auto p = good_pack(); p.cache.num_blocks = -1; expect_pack_invalid(p, "cache.num_blocks"); }
  { auto p = good_pack(); p.cache.page_size = 0; expect_pack_invalid(p, "cache.page_size"); }
  { auto p = good_pack(); p.cache.page_size = -3; expect_pack_invalid(p, "cache.page_size"); }
  { auto p = good_pack(); p.cache.block_stride_bytes = 64 * 656 - 16; expect_pack_invalid(p, "cache.block_stride_bytes"); }
  { auto p = good_pack(); p.cache.block_stride_bytes = 64 * 656 + 8; expect_pack_invalid(p, "cache.block_stride_bytes"); }
  { auto p = good_pack(); p.cache.num_blocks = int64_t(1) << 50; expect_pack_invalid(p, "cache.num_blocks"); }
  { auto p = good_pack(); p.cache.data = nullptr; expect_pack_invalid(p, "cache.data"); }
  { auto p = good_pack(); p.cache.data = fake(8); expect_pack_invalid(p, "cache.data"); }
}

TEST(PackChecks, RejectsBadPointers) {
  { auto p = good_pack(); p.indices = nullptr; expect_pack_invalid(p, "indices"); }
  { auto p = good_pack(); p.indices = fake<const int32_t>(18); expect_pack_invalid(p, "indices"); }
  { auto p = good_pack(); p.indices_batch_stride = -1; expect_pack_invalid(p, "indices"); }
  { auto p = good_pack(); p.indices_seq_stride = -kK; expect_pack_invalid(p, "indices"); }
  { auto p = good_pack(); p.topk_length = fake<const int32_t>(34); expect_pack_invalid(p, "topk_length"); }
  { auto p = good_pack(); p.packed_kv = nullptr; expect_pack_invalid(p, "packed_kv"); }
  { auto p = good_pack(); p.packed_kv = fake(52); expect_pack_invalid(p, "packed_kv"); }
  { auto p = good_pack(); p.packed_kv = fake(56); expect_pack_invalid(p, "packed_kv"); }  // 8-byte aligned only
}

TEST(PackChecks, BufferTooSmallStatesBothSizes) {
  auto p = good_pack();
  p.packed_kv_bytes = kBytes - 1;
  const Status st = check_pack_selected_kv(p);
  expect_status(st, StatusCode::kWorkspaceTooSmall, "selkv::pack_selected_kv", "packed_kv_bytes");
  EXPECT_NE(st.message().find("needs " + std::to_string(kBytes) + " bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got " + std::to_string(kBytes - 1)), std::string::npos) << st.message();
  // The validity words are part of the size: a buffer holding only the records is too small.
  p.packed_kv_bytes = size_t(kB) * kS * kK * 656;
  EXPECT_EQ(check_pack_selected_kv(p).code(), StatusCode::kWorkspaceTooSmall);
  p.packed_kv_bytes = 0;
  p.packed_kv = nullptr;
  EXPECT_EQ(check_pack_selected_kv(p).code(), StatusCode::kWorkspaceTooSmall);
}

TEST(PackChecks, RejectsOverlaps) {
  // packed_kv [base, base + kBytes) against the cache, indices and topk_length.
  const size_t cache_bytes = size_t(9) * 64 * 656 + 64 * 656;
  {  // packed_kv inside the cache
    auto p = good_pack();
    p.packed_kv = at(p.cache.data, 1024);
    expect_pack_invalid(p, "packed_kv");
  }
  {  // the cache's last page reaches into packed_kv; one byte earlier it does not
    auto p = good_pack();
    p.packed_kv = at(p.cache.data, int64_t(cache_bytes) - 16);
    expect_pack_invalid(p, "packed_kv");
    p.packed_kv = at(p.cache.data, int64_t(cache_bytes));
    EXPECT_TRUE(check_pack_selected_kv(p).ok()) << check_pack_selected_kv(p).to_string();
  }
  {  // the padded block stride past the last page is not read: no overlap there
    auto p = good_pack();
    p.cache.block_stride_bytes = 64 * 656 + 4096;
    p.packed_kv = at(p.cache.data, 9 * (64 * 656 + 4096) + 64 * 656);
    EXPECT_TRUE(check_pack_selected_kv(p).ok()) << check_pack_selected_kv(p).to_string();
  }
  {  // indices inside packed_kv (its last element), and just past it
    auto p = good_pack();
    p.indices = at<const int32_t>(p.packed_kv, int64_t(kBytes) - 4);
    expect_pack_invalid(p, "packed_kv");
    p.indices = at<const int32_t>(p.packed_kv, int64_t(kBytes));
    EXPECT_TRUE(check_pack_selected_kv(p).ok());
  }
  {  // indices' last element (strided) inside packed_kv
    auto p = good_pack();
    p.indices_batch_stride = 1 << 20;
    p.indices = at<const int32_t>(p.packed_kv, -int64_t(4) * ((1 << 20) + 2 * kK + kK - 1));
    expect_pack_invalid(p, "packed_kv");
  }
  {  // topk_length inside the validity words
    auto p = good_pack();
    p.topk_length = at<const int32_t>(p.packed_kv, int64_t(kBytes) - 8);
    expect_pack_invalid(p, "packed_kv");
  }
  {  // the error names the other argument
    auto p = good_pack();
    p.packed_kv = at(p.cache.data, 0);
    const Status st = check_pack_selected_kv(p);
    EXPECT_NE(st.message().find("overlaps cache"), std::string::npos) << st.message();
  }
}

// ---- patch ---------------------------------------------------------------------------------------
TEST(PatchChecks, AcceptsValid) {
  auto p = good_patch();
  EXPECT_TRUE(check_patch_packed_kv(p).ok()) << check_patch_packed_kv(p).to_string();
  p.record_stride_bytes = 672;
  EXPECT_TRUE(check_patch_packed_kv(p).ok());
  p.record_stride_bytes = 4096;
  EXPECT_TRUE(check_patch_packed_kv(p).ok());
  packed::Work work = packed::Work::kNone;
  EXPECT_TRUE(packed::check_patch(p, &work).ok());
  EXPECT_EQ(work, packed::Work::kLaunch);
}

TEST(PatchChecks, NoRecordsOrRowsTouchNothing) {
  for (auto [b, n] : {std::pair{kB, int64_t(0)}, std::pair{0, int64_t(6)}}) {
    PatchPackedKvParams p = good_patch();
    p.batch = b;
    p.num_records = n;
    p.packed_kv = nullptr;
    p.packed_kv_bytes = 0;
    p.positions = nullptr;
    p.records = nullptr;
    p.record_stride_bytes = 0;
    packed::Work work = packed::Work::kLaunch;
    EXPECT_TRUE(packed::check_patch(p, &work).ok()) << packed::check_patch(p, &work).to_string();
    EXPECT_EQ(work, packed::Work::kNone);
    p.topk = 0;
    expect_patch_invalid(p, "topk");
  }
}

TEST(PatchChecks, RejectsBadArguments) {
  { auto p = good_patch(); p.batch = -1; expect_patch_invalid(p, "batch"); }
  { auto p = good_patch(); p.seq_q = -1; expect_patch_invalid(p, "seq_q"); }
  { auto p = good_patch(); p.topk = 96; expect_patch_invalid(p, "topk"); }
  { auto p = good_patch(); p.topk = 0; expect_patch_invalid(p, "topk"); }
  { auto p = good_patch(); p.batch = 1 << 20; p.seq_q = 1; p.topk = 2048; expect_patch_invalid(p, "batch"); }
  { auto p = good_patch(); p.num_records = -1; expect_patch_invalid(p, "num_records"); }
  { auto p = good_patch(); p.packed_kv = nullptr; expect_patch_invalid(p, "packed_kv"); }
  { auto p = good_patch(); p.packed_kv = fake(8); expect_patch_invalid(p, "packed_kv"); }
  { auto p = good_patch(); p.positions = nullptr; expect_patch_invalid(p, "positions"); }
  { auto p = good_patch(); p.positions = fake<const int64_t>(20); expect_patch_invalid(p, "positions"); }
  { auto p = good_patch(); p.records = nullptr; expect_patch_invalid(p, "records"); }
  { auto p = good_patch(); p.records = fake<const uint8_t>(40); expect_patch_invalid(p, "records"); }
  { auto p = good_patch(); p.record_stride_bytes = 640; expect_patch_invalid(p, "record_stride_bytes"); }
  { auto p = good_patch(); p.record_stride_bytes = 0; expect_patch_invalid(p, "record_stride_bytes"); }
  { auto p = good_patch(); p.record_stride_bytes = 660; expect_patch_invalid(p, "record_stride_bytes"); }
  { auto p = good_patch(); p.num_records = int64_t(1) << 58; p.record_stride_bytes = 1024;
    expect_patch_invalid(p, "num_records"); }
}

TEST(PatchChecks, BufferTooSmallStatesBothSizes) {
  auto p = good_patch();
  p.packed_kv_bytes = 100;
  const Status st = check_patch_packed_kv(p);
  expect_status(st, StatusCode::kWorkspaceTooSmall, "selkv::patch_packed_kv", "packed_kv_bytes");
  EXPECT_NE(st.message().find("needs " + std::to_string(kBytes) + " bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got 100"), std::string::npos) << st.message();
}

TEST(PatchChecks, RejectsOverlaps) {
  {  // records inside packed_kv (e.g. patching from the buffer itself)
    auto p = good_patch();
    p.records = at<const uint8_t>(p.packed_kv, 656 * 3);
    expect_patch_invalid(p, "packed_kv");
  }
  {  // the last record's bytes reach into packed_kv; records' stride padding does not count
    auto p = good_patch();
    p.record_stride_bytes = 1024;
    p.records = at<const uint8_t>(p.packed_kv, -(5 * 1024 + 656) + 16);
    expect_patch_invalid(p, "packed_kv");
    p.records = at<const uint8_t>(p.packed_kv, -(5 * 1024 + 656));
    EXPECT_TRUE(check_patch_packed_kv(p).ok()) << check_patch_packed_kv(p).to_string();
  }
  {  // positions inside the validity words
    auto p = good_patch();
    p.positions = at<const int64_t>(p.packed_kv, int64_t(kBytes) - 8);
    expect_patch_invalid(p, "packed_kv");
    p.positions = at<const int64_t>(p.packed_kv, int64_t(kBytes));
    EXPECT_TRUE(check_patch_packed_kv(p).ok());
  }
}

}  // namespace
}  // namespace selkv
