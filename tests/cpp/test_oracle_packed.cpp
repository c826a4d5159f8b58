// CPU tests of the C6 pack / patch oracle (src/reference/packed.cpp) against hand-computed
// buffers: the byte layout (records at e * 656, then uint32 validity words), zero records for
// invalid entries, the topk_length clamp, every invalid-index class of DESIGN §2, strided and
// broadcast index rows, patch, and "a failed check writes nothing".
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "packed/packed_layout.h"
#include "reference/oracle.h"
#include "selkv/packed.h"

namespace selkv {
namespace {

constexpr int kRec = 656;

// Byte i of slot s's record: a pattern that differs between slots and between bytes.
uint8_t pattern(int64_t slot, int i) { return uint8_t(slot * 37 + i * 11 + 5); }

// A paged cache of `blocks` x `page` records with `pad` bytes of 0xEE after each page.
struct Cache {
  int64_t blocks;
  int32_t page;
  int64_t stride;
  std::vector<uint8_t> bytes;
  Cache(int64_t blocks_, int32_t page_, int64_t pad) : blocks(blocks_), page(page_), stride(page_ * kRec + pad) {
    bytes.assign(size_t(blocks * stride) + 16, 0xEE);
    for (int64_t s = 0; s < blocks * page; ++s) {
      uint8_t* rec = data() + (s / page) * stride + (s % page) * kRec;  // hand-computed address
      for (int i = 0; i < kRec; ++i) rec[i] = pattern(s, i);
    }
  }
  uint8_t* data() {  // 16-byte aligned start
    return bytes.data() + ((16 - reinterpret_cast<uintptr_t>(bytes.data()) % 16) % 16);
  }
  int64_t slots() const { return blocks * page; }
  PagedKvCache view() { return PagedKvCache{data(), blocks, page, stride, KvFormat::kDsMlaFp8}; }
};

// A 16-byte aligned host buffer of `bytes` + a 64-byte canary, poisoned with 0xAB.
struct Buffer {
  std::vector<uint8_t> mem;
  size_t bytes;
  explicit Buffer(size_t n) : mem(n + 64 + 16, 0xAB), bytes(n) {}
  uint8_t* data() { return mem.data() + ((16 - reinterpret_cast<uintptr_t>(mem.data()) % 16) % 16); }
  const uint8_t* record(int64_t e) { return data() + e * kRec; }
  uint32_t word(int64_t rows, int64_t K, int64_t w) {
    uint32_t v;
    std::memcpy(&v, data() + rows * K * kRec + 4 * w, 4);
    return v;
  }
  bool canary_intact() {
    for (size_t i = 0; i < 64; ++i)
      if (data()[bytes + i] != 0xAB) return false;
    return true;
  }
};

void expect_record(const uint8_t* got, int64_t slot, const char* what) {
  for (int i = 0; i < kRec; ++i) {
    const uint8_t want = slot < 0 ? 0 : pattern(slot, i);
    if (got[i] != want) {
      ADD_FAILURE() << what << ": byte " << i << " is " << int(got[i]) << ", want " << int(want)
                    << (slot < 0 ? " (zero record)" : "");
      return;
    }
  }
}

PackSelectedKvParams pack_params(Cache& c, const std::vector<int32_t>& idx, int B, int S, int K, Buffer& out,
                                 const int32_t* len = nullptr) {
  PackSelectedKvParams p;
  p.cache = c.view();
  p.indices = idx.data();
  p.indices_batch_stride = int64_t(S) * K;
  p.indices_seq_stride = K;
  p.batch = B;
  p.seq_q = S;
  p.topk = K;
  p.topk_length = len;
  p.packed_kv = out.data();
  p.packed_kv_bytes = out.bytes;
  return p;
}

TEST(OraclePacked, LayoutBytesAndValidityWords) {
  Cache c(5, 3, 32);  // 15 slots, odd page, padded stride
  constexpr int B = 1, S = 2, K = 64;
  std::vector<int32_t> idx(B * S * K);
  for (int r = 0; r < B * S; ++r)
    for (int k = 0; k < K; ++k) idx[size_t(r * K + k)] = (k * 7 + r * 3) % 15;  // all valid
  idx[5] = -1;       // row 0, k 5
  idx[64 + 33] = 15;  // row 1, k 33: == num_slots
  Buffer out(packed_kv_workspace_size(B, S, K));
  ASSERT_EQ(out.bytes, size_t(128 * kRec + 16 + 16));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, B, S, K, out)).ok());
  for (int e = 0; e < B * S * K; ++e) {
    const int32_t v = idx[size_t(e)];
    expect_record(out.record(e), v >= 0 && v < 15 ? v : -1, ("entry " + std::to_string(e)).c_str());
  }
  // Words (row 0: k 0-31, 32-63; row 1: ...): bit k % 32 of word e / 32.
  EXPECT_EQ(out.word(2, K, 0), ~(uint32_t(1) << 5));
  EXPECT_EQ(out.word(2, K, 1), 0xFFFFFFFFu);
  EXPECT_EQ(out.word(2, K, 2), 0xFFFFFFFFu);
  EXPECT_EQ(out.word(2, K, 3), ~(uint32_t(1) << 1));
  // The shape words after the validity words: fingerprint, B, S_q, K.
  uint32_t shape[4];
  std::memcpy(shape, out.data() + packed::packed_shape_offset(B * S, K), sizeof shape);
  EXPECT_EQ(shape[0], packed::packed_shape_fingerprint(B, S, K));
  EXPECT_EQ(shape[1], uint32_t(B));
  EXPECT_EQ(shape[2], uint32_t(S));
  EXPECT_EQ(shape[3], uint32_t(K));
  EXPECT_EQ(packed::packed_shape_offset(B * S, K) + 16, int64_t(out.bytes));
  EXPECT_TRUE(out.canary_intact());
}

TEST(OraclePacked, EveryInvalidIndexClassIsAZeroRecord) {
  Cache c(4, 2, 0);  // 8 slots
  constexpr int K = 64;
  const int32_t bad[] = {-1, -2, -7, INT_MIN, INT_MIN + 1, 8, 9, 1000, INT_MAX, INT_MAX - 1};
  std::vector<int32_t> idx(K);
  for (int k = 0; k < K; ++k) idx[size_t(k)] = k % 3 == 0 ? bad[(k / 3) % 10] : k % 8;
  Buffer out(packed_kv_workspace_size(1, 1, K));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, 1, 1, K, out)).ok());
  uint32_t want[2] = {0, 0};
  for (int k = 0; k < K; ++k) {
    const bool valid = k % 3 != 0;
    expect_record(out.record(k), valid ? idx[size_t(k)] : -1, ("k " + std::to_string(k)).c_str());
    if (valid) want[k / 32] |= uint32_t(1) << (k % 32);
  }
  EXPECT_EQ(out.word(1, K, 0), want[0]);
  EXPECT_EQ(out.word(1, K, 1), want[1]);
  EXPECT_TRUE(out.canary_intact());
}

TEST(OraclePacked, TopkLengthClamp) {
  Cache c(2, 64, 0);  // 128 slots
  constexpr int B = 5, S = 2, K = 128;
  std::vector<int32_t> idx(B * S * K);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t((i * 13) % 128);
  idx[size_t(2 * S * K + 10)] = -1;  // batch 2, s 0, k 10: invalid inside the length
  const int32_t len[B] = {-5, 0, 40, K + 77, INT_MIN};
  Buffer out(packed_kv_workspace_size(B, S, K));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, B, S, K, out, len)).ok());
  const int limit[B] = {0, 0, 40, K, 0};
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s) {
      const int64_t row = b * S + s;
      for (int k = 0; k < K; ++k) {
        const int64_t e = row * K + k;
        const int32_t v = idx[size_t(e)];
        const bool valid = k < limit[b] && v >= 0;
        expect_record(out.record(e), valid ? v : -1, ("b " + std::to_string(b) + " k " + std::to_string(k)).c_str());
      }
      for (int w = 0; w < K / 32; ++w) {
        uint32_t want = 0;
        for (int i = 0; i < 32; ++i) {
          const int k = w * 32 + i;
          if (k < limit[b] && idx[size_t(row * K + k)] >= 0) want |= uint32_t(1) << i;
        }
        EXPECT_EQ(out.word(B * S, K, row * (K / 32) + w), want) << "b " << b << " s " << s << " word " << w;
      }
    }
  // b = 2: k 0-31 valid but k 10, k 32-39 valid.
  EXPECT_EQ(out.word(B * S, K, 2 * S * (K / 32)), ~(uint32_t(1) << 10));
  EXPECT_EQ(out.word(B * S, K, 2 * S * (K / 32) + 1), 0xFFu);
  EXPECT_TRUE(out.canary_intact());
}

// Past topk_length an entry is invalid even when its index is a valid slot.
TEST(OraclePacked, EntriesPastLengthIgnoreTheirIndex) {
  Cache c(1, 64, 0);
  constexpr int K = 64;
  std::vector<int32_t> idx(K, 3);  // every index valid
  const int32_t len[1] = {1};
  Buffer out(packed_kv_workspace_size(1, 1, K));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, 1, 1, K, out, len)).ok());
  expect_record(out.record(0), 3, "k 0");
  for (int k = 1; k < K; ++k) expect_record(out.record(k), -1, "past length");
  EXPECT_EQ(out.word(1, K, 0), 1u);
  EXPECT_EQ(out.word(1, K, 1), 0u);
}

TEST(OraclePacked, StridedAndBroadcastIndexRows) {
  Cache c(3, 5, 48);  // 15 slots
  constexpr int B = 2, S = 3, K = 64;
  // [B, S, K] view with padding: seq stride K + 5, batch stride S * (K + 5) + 11.
  const int64_t ss = K + 5, bs = S * ss + 11;
  std::vector<int32_t> idx(size_t(B * bs), 0x7fff0000);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      for (int k = 0; k < K; ++k) idx[size_t(b * bs + s * ss + k)] = (b * 5 + s * 3 + k) % 16;  // 15 invalid
  Buffer out(packed_kv_workspace_size(B, S, K));
  auto p = pack_params(c, idx, B, S, K, out);
  p.indices_batch_stride = bs;
  p.indices_seq_stride = ss;
  ASSERT_TRUE(ref::pack_selected_kv(p).ok());
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      for (int k = 0; k < K; ++k) {
        const int32_t v = (b * 5 + s * 3 + k) % 16;
        expect_record(out.record((b * S + s) * K + k), v < 15 ? v : -1, "strided");
      }
  // Broadcast: one index row for every (b, s).
  Buffer out2(packed_kv_workspace_size(B, S, K));
  p.packed_kv = out2.data();
  p.indices_batch_stride = 0;
  p.indices_seq_stride = 0;
  ASSERT_TRUE(ref::pack_selected_kv(p).ok());
  for (int r = 0; r < B * S; ++r)
    for (int k = 0; k < K; ++k) expect_record(out2.record(r * K + k), k % 16 < 15 ? k % 16 : -1, "broadcast");
}

TEST(OraclePacked, DuplicatesAndEmptyCache) {
  Cache c(2, 2, 0);
  constexpr int K = 64;
  std::vector<int32_t> idx(K, 2);  // one slot, 64 times
  Buffer out(packed_kv_workspace_size(1, 1, K));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, 1, 1, K, out)).ok());
  for (int k = 0; k < K; ++k) expect_record(out.record(k), 2, "duplicate");
  EXPECT_EQ(out.word(1, K, 0), 0xFFFFFFFFu);
  // No blocks: every index is invalid; the cache is never read.
  auto p = pack_params(c, idx, 1, 1, K, out);
  p.cache.num_blocks = 0;
  p.cache.data = nullptr;
  ASSERT_TRUE(ref::pack_selected_kv(p).ok());
  for (int k = 0; k < K; ++k) expect_record(out.record(k), -1, "empty cache");
  EXPECT_EQ(out.word(1, K, 0), 0u);
  EXPECT_EQ(out.word(1, K, 1), 0u);
  EXPECT_TRUE(out.canary_intact());
}

TEST(OraclePacked, FailedChecksAndZeroRowsWriteNothing) {
  Cache c(2, 2, 0);
  constexpr int K = 64;
  std::vector<int32_t> idx(2 * K, 1);
  Buffer out(packed_kv_workspace_size(2, 1, K));
  auto p = pack_params(c, idx, 2, 1, K, out);
  p.packed_kv_bytes = out.bytes - 1;
  EXPECT_EQ(ref::pack_selected_kv(p).code(), StatusCode::kWorkspaceTooSmall);
  p.packed_kv_bytes = out.bytes;
  p.indices = nullptr;
  EXPECT_EQ(ref::pack_selected_kv(p).code(), StatusCode::kInvalidArgument);
  p.indices = idx.data();
  p.packed_kv = c.data() + 16;  // inside the cache
  EXPECT_EQ(ref::pack_selected_kv(p).code(), StatusCode::kInvalidArgument);
  p.packed_kv = out.data();
  p.batch = 0;  // no rows
  EXPECT_TRUE(ref::pack_selected_kv(p).ok());
  for (size_t i = 0; i < out.bytes + 64; ++i) ASSERT_EQ(out.data()[i], 0xAB) << "byte " << i;
}

// ---- patch ---------------------------------------------------------------------------------------
TEST(OraclePacked, PatchWritesRecordsAndSetsBits) {
  Cache c(4, 4, 0);  // 16 slots
  constexpr int B = 2, S = 1, K = 64;
  std::vector<int32_t> idx(B * S * K);
  for (int i = 0; i < B * K; ++i) idx[size_t(i)] = i % 2 ? -1 : i % 16;  // odd entries invalid
  Buffer out(packed_kv_workspace_size(B, S, K));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, B, S, K, out)).ok());
  ASSERT_EQ(out.word(2, K, 0), 0x55555555u);

  // Records of slots 11, 12, 13, 14 at a 672-byte stride; positions with padding and out-of-range.
  constexpr int64_t kStride = 672;
  std::vector<uint8_t> rec_mem(6 * kStride + 16, 0xCD);
  uint8_t* recs = rec_mem.data() + ((16 - reinterpret_cast<uintptr_t>(rec_mem.data()) % 16) % 16);
  for (int i = 0; i < 6; ++i)
    for (int b = 0; b < kRec; ++b) recs[i * kStride + b] = pattern(11 + i, b);
  const int64_t entries = B * S * K;
  const std::vector<int64_t> pos = {3, -1, 64 + 41, entries, INT64_MIN, 0};
  PatchPackedKvParams q;
  q.packed_kv = out.data();
  q.packed_kv_bytes = out.bytes;
  q.batch = B;
  q.seq_q = S;
  q.topk = K;
  q.positions = pos.data();
  q.records = recs;
  q.record_stride_bytes = kStride;
  q.num_records = int64_t(pos.size());
  ASSERT_TRUE(ref::patch_packed_kv(q).ok());
  for (int64_t e = 0; e < entries; ++e) {
    int64_t want = idx[size_t(e)] >= 0 ? idx[size_t(e)] : -1;
    if (e == 3) want = 11;
    if (e == 64 + 41) want = 13;
    if (e == 0) want = 16;
    expect_record(out.record(e), want, ("entry " + std::to_string(e)).c_str());
  }
  EXPECT_EQ(out.word(2, K, 0), 0x55555555u | 0x8u);
  EXPECT_EQ(out.word(2, K, 1), 0x55555555u);
  EXPECT_EQ(out.word(2, K, 2), 0x55555555u);
  EXPECT_EQ(out.word(2, K, 3), 0x55555555u | (uint32_t(1) << 9));
  EXPECT_TRUE(out.canary_intact());

  // A failed check writes nothing.
  const std::vector<uint8_t> before(out.data(), out.data() + out.bytes);
  q.record_stride_bytes = 650;
  EXPECT_EQ(ref::patch_packed_kv(q).code(), StatusCode::kInvalidArgument);
  q.record_stride_bytes = kStride;
  q.packed_kv_bytes = out.bytes - 8;
  EXPECT_EQ(ref::patch_packed_kv(q).code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_EQ(std::memcmp(before.data(), out.data(), out.bytes), 0);

  // A buffer packed for another shape of the same size (B * S_q * K): no record or validity bit is
  // written, and the K shape word is poisoned (every later decode of the buffer fails closed).
  q.packed_kv_bytes = out.bytes;
  q.batch = 1;
  q.seq_q = 2;
  ASSERT_TRUE(ref::patch_packed_kv(q).ok());
  const int64_t k_word = packed::packed_shape_offset(B * S, K) + 12;
  EXPECT_EQ(std::memcmp(before.data(), out.data(), size_t(k_word)), 0);
  uint32_t k_now;
  std::memcpy(&k_now, out.data() + k_word, 4);
  EXPECT_EQ(k_now, packed::kPoisonedTopk);
  EXPECT_EQ(std::memcmp(before.data() + k_word + 4, out.data() + k_word + 4, out.bytes - size_t(k_word) - 4), 0);
  // and the patch at the packed shape is now refused too (written nothing more)
  q.batch = B;
  q.seq_q = S;
  const std::vector<uint8_t> poisoned(out.data(), out.data() + out.bytes);
  ASSERT_TRUE(ref::patch_packed_kv(q).ok());
  EXPECT_EQ(std::memcmp(poisoned.data(), out.data(), out.bytes), 0);
}

// The shape words separate the shapes of one size (what the buffer's size cannot): the packed
// decode oracle gives NaN rows for a buffer packed for another shape of the same size and for a
// poisoned one, finite rows for its own shape.
TEST(OraclePacked, ShapeWordsFailClosed) {
  EXPECT_NE(packed::packed_shape_fingerprint(2, 1, 64), packed::packed_shape_fingerprint(1, 2, 64));
  EXPECT_NE(packed::packed_shape_fingerprint(2, 1, 64), packed::packed_shape_fingerprint(1, 1, 128));
  EXPECT_NE(packed::packed_shape_fingerprint(4, 4, 2048), packed::packed_shape_fingerprint(16, 1, 2048));
  EXPECT_EQ(packed_kv_workspace_size(2, 1, 64), packed_kv_workspace_size(1, 1, 128));
  const packed::PackedShape s = packed::packed_shape(2, 1, 64);
  EXPECT_TRUE(packed::packed_shape_matches(s.lo, s.hi, 2, 1, 64));
  EXPECT_FALSE(packed::packed_shape_matches(s.lo, s.hi, 1, 1, 128));
  EXPECT_FALSE(packed::packed_shape_matches(s.lo, s.hi ^ (uint64_t(1) << 40), 2, 1, 64));  // K word differs

  Cache c(4, 64, 0);
  for (int64_t s = 0; s < c.slots(); ++s) {  // finite records: small e4m3 codes, scales 1, RoPE 1.0
    uint8_t* rec = c.data() + s * kRec;
    for (int i = 0; i < 512; ++i) rec[i] = uint8_t((s + i) % 0x30);
    const float one = 1.f;
    for (int t = 0; t < 4; ++t) std::memcpy(rec + 512 + 4 * t, &one, 4);
    for (int i = 0; i < 64; ++i) {
      rec[528 + 2 * i] = 0x80;
      rec[529 + 2 * i] = 0x3f;
    }
  }
  std::vector<int32_t> idx(128);
  for (int e = 0; e < 128; ++e) idx[size_t(e)] = (e * 5) % 256;
  Buffer out(packed_kv_workspace_size(2, 1, 64));
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, 2, 1, 64, out)).ok());
  constexpr int H = 64;
  std::vector<uint16_t> q(size_t(2) * H * 576, 0x3c00);  // bf16 2^-7 everywhere
  std::vector<float> o(size_t(2) * H * 512), lse(size_t(2) * H);
  auto decode = [&](int B, int K) {
    std::fill(o.begin(), o.end(), 0.f);
    std::fill(lse.begin(), lse.end(), 0.f);
    ref::SparseDecodePackedRefArgs a;
    a.q = q.data();
    a.B = B;
    a.S_q = 1;
    a.H = H;
    a.packed_kv = out.data();
    a.packed_kv_bytes = out.bytes;
    a.K = K;
    a.sm_scale = 0.05f;
    a.out = o.data();
    a.lse = lse.data();
    ASSERT_TRUE(ref::check_sparse_decode_packed_args(a).ok());
    ref::sparse_decode_packed(a);
  };
  auto all = [](const std::vector<float>& v, size_t n, bool want_nan) {
    for (size_t i = 0; i < n; ++i)
      if (std::isnan(v[i]) != want_nan) return false;
    return true;
  };
  decode(2, 64);
  EXPECT_TRUE(all(o, o.size(), false) && all(lse, lse.size(), false)) << "its own shape: finite";
  decode(1, 128);
  EXPECT_TRUE(all(o, size_t(H) * 512, true) && all(lse, size_t(H), true)) << "another shape of its size: NaN";
  // poisoned by a patch at (1, 1, 128): its own shape now gives NaN too
  const int64_t pos = 0;
  std::vector<uint8_t> rec(kRec, 7);
  PatchPackedKvParams pp;
  pp.packed_kv = out.data();
  pp.packed_kv_bytes = out.bytes;
  pp.batch = 1;
  pp.seq_q = 1;
  pp.topk = 128;
  pp.positions = &pos;
  pp.records = rec.data();
  pp.record_stride_bytes = kRec;
  pp.num_records = 1;
  ASSERT_TRUE(ref::patch_packed_kv(pp).ok());
  decode(2, 64);
  EXPECT_TRUE(all(o, o.size(), true) && all(lse, lse.size(), true)) << "poisoned: NaN";
  // packed again: finite
  ASSERT_TRUE(ref::pack_selected_kv(pack_params(c, idx, 2, 1, 64, out)).ok());
  decode(2, 64);
  EXPECT_TRUE(all(o, o.size(), false)) << "packed again: finite";
}

}  // namespace
}  // namespace selkv
