// Oracle semantics of the cache ops C1-C3 on small hand-built cases with known answers.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference/oracle.h"
#include "test_util.h"

namespace selkv {
namespace {

constexpr uint8_t kSentinel = 0xcd;
constexpr uint16_t kRowSentinel = 0xabcd;

// Random bf16 latent/rope rows for `n` tokens.
struct Tokens {
  std::vector<uint16_t> latent, rope;
  Tokens(int64_t n, std::mt19937_64& rng)
      : latent(test::randn_bf16(n * 512, 1.f, rng)), rope(test::randn_bf16(n * 64, 1.f, rng)) {}
  std::vector<uint8_t> record(int64_t t, KvFormat f, ScaleMode m) const {
    std::vector<uint8_t> r(fmt::record_bytes(f));
    ref::encode_record(&latent[t * 512], &rope[t * 64], f, m, r.data());
    return r;
  }
};

// Bytes a page occupies, spelled out per DESIGN §1 (model1_fp8: 584 bytes a token, padded to a
// multiple of 576).
int64_t page_bytes_of(KvFormat f, int64_t page) {
  return f == KvFormat::kModel1Fp8 ? (page * 584 + 575) / 576 * 576 : page * fmt::record_bytes(f);
}

// Places a token's record_bytes(f) bytes (as encode_record lays them out alone) into a paged
// buffer: contiguous for the in-record formats; model1_fp8's 576 record bytes at in_page * 576
// and its 8 scale bytes at page * 576 + in_page * 8.
void place_token(std::vector<uint8_t>& buf, KvFormat f, int64_t page, int64_t stride, int64_t slot,
                 const std::vector<uint8_t>& rec) {
  uint8_t* base = &buf[size_t((slot / page) * stride)];
  const int64_t in_page = slot % page;
  if (f == KvFormat::kModel1Fp8) {
    std::memcpy(base + in_page * 576, rec.data(), 576);
    std::memcpy(base + page * 576 + in_page * 8, rec.data() + 576, 8);
  } else {
    std::memcpy(base + in_page * int64_t(rec.size()), rec.data(), rec.size());
  }
}

bool is_invalid_argument(const Status& st, const std::string& op, const std::string& arg) {
  return st.code() == StatusCode::kInvalidArgument &&
         st.message().find(op) != std::string::npos && st.message().find(arg) != std::string::npos;
}

// ---- C1 ----------------------------------------------------------------------------------------

class WriteKvCache : public ::testing::TestWithParam<std::tuple<KvFormat, int>> {};

TEST_P(WriteKvCache, WritesValidSlotsOnly) {
  const auto [format, page] = GetParam();
  std::mt19937_64 rng(test::test_seed());
  const int rb = fmt::record_bytes(format);
  const int64_t num_blocks = 3, num_slots = num_blocks * page;
  const int64_t stride = page_bytes_of(format, page) + 48;  // padded blocks: the padding stays untouched
  std::vector<uint8_t> cache(num_blocks * stride, kSentinel);
  const std::vector<int64_t> slots = {0, -1, num_slots - 1, num_slots, -7, 1, INT64_MAX,
                                      num_slots + 5, INT64_MIN};
  const int64_t T = int64_t(slots.size());
  // Rows strided by 520 / 72 elements to exercise the row strides.
  Tokens tok(T, rng);
  std::vector<uint16_t> latent(T * 520, 0), rope(T * 72, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&latent[t * 520], &tok.latent[t * 512], 1024);
    std::memcpy(&rope[t * 72], &tok.rope[t * 64], 128);
  }
  WriteKvCacheParams p;
  p.latent = latent.data();
  p.latent_row_stride = 520;
  p.rope = fmt::has_rope(format) ? rope.data() : nullptr;
  p.rope_row_stride = 72;
  p.slot_mapping = slots.data();
  p.num_tokens = T;
  p.cache = cache.data();
  p.num_blocks = num_blocks;
  p.page_size = page;
  p.block_stride_bytes = stride;
  p.format = format;
  p.scale_mode = ScaleMode::kPow2;
  ASSERT_TRUE(ref::write_kv_cache(p).ok());

  std::vector<uint8_t> expected(cache.size(), kSentinel);
  auto place = [&](int64_t slot, int64_t t) {
    const auto r = tok.record(t, format, ScaleMode::kPow2);
    ASSERT_EQ(int64_t(r.size()), rb);
    place_token(expected, format, page, stride, slot, r);
  };
  place(0, 0);
  place(num_slots - 1, 2);
  place(1, 5);
  EXPECT_EQ(cache, expected);
}

INSTANTIATE_TEST_SUITE_P(FormatsAndPages, WriteKvCache,
                         ::testing::Combine(::testing::Values(KvFormat::kDsMlaFp8, KvFormat::kNopeFp8,
                                                                KvFormat::kModel1Fp8),
                                            ::testing::Values(1, 2, 61, 64, 69)));

// model1_fp8 argument rules of C1 (the oracle; the GPU op's checks: test_cache_checks.cpp).
TEST(WriteKvCacheArgs, Model1RejectsBadParams) {
  std::vector<uint16_t> latent(448), rope(64);
  std::vector<int64_t> slots = {0};
  const int64_t pb = page_bytes_of(KvFormat::kModel1Fp8, 4);  // 4 * 584 = 2336 -> 2880
  ASSERT_EQ(pb, 2880);
  std::vector<uint8_t> cache(static_cast<size_t>(pb));
  WriteKvCacheParams p;
  p.latent = latent.data();
  p.latent_row_stride = 448;
  p.rope = rope.data();
  p.rope_row_stride = 64;
  p.slot_mapping = slots.data();
  p.num_tokens = 1;
  p.cache = cache.data();
  p.num_blocks = 1;
  p.page_size = 4;
  p.block_stride_bytes = pb;
  p.format = KvFormat::kModel1Fp8;
  ASSERT_TRUE(ref::write_kv_cache(p).ok());
  const std::string op = "selkv::ref::write_kv_cache";
  auto q = p; q.scale_mode = ScaleMode::kAmax;  // UE8M0 holds powers of two only
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "scale_mode"));
  q = p; q.latent_row_stride = 447;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "latent_row_stride"));
  q = p; q.rope = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "rope"));
  q = p; q.block_stride_bytes = 4 * 584;  // the unpadded page: too small
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "block_stride_bytes"));
  q = p; q.format = KvFormat(3);
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "format"));
}

TEST(WriteKvCacheArgs, RejectsBadParams) {
  std::vector<uint16_t> latent(512), rope(64);
  std::vector<int64_t> slots = {0};
  std::vector<uint8_t> cache(656 * 4);
  WriteKvCacheParams p;
  p.latent = latent.data();
  p.latent_row_stride = 512;
  p.rope = rope.data();
  p.rope_row_stride = 64;
  p.slot_mapping = slots.data();
  p.num_tokens = 1;
  p.cache = cache.data();
  p.num_blocks = 1;
  p.page_size = 4;
  p.block_stride_bytes = 656 * 4;
  ASSERT_TRUE(ref::write_kv_cache(p).ok());
  const std::string op = "selkv::ref::write_kv_cache";
  auto q = p; q.page_size = 0;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "page_size"));
  q = p; q.latent = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "latent"));
  q = p; q.rope = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "rope"));
  q = p; q.slot_mapping = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "slot_mapping"));
  q = p; q.num_tokens = -1;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "num_tokens"));
  q = p; q.block_stride_bytes = 656 * 4 - 1;
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "block_stride_bytes"));
  q = p; q.format = KvFormat::kNopeFp8;  // a rope pointer for nope_fp8 is a caller mistake
  EXPECT_TRUE(is_invalid_argument(ref::write_kv_cache(q), op, "rope"));
  q.rope = nullptr;
  EXPECT_TRUE(ref::write_kv_cache(q).ok());
}

// ---- C2 ----------------------------------------------------------------------------------------

struct ConvertCase {
  std::vector<int32_t> indices;       // [rows, stride]
  std::vector<int32_t> req_ids;
  std::vector<int32_t> block_table;   // [num_reqs, bt_stride]
  ConvertIndicesParams p;
  std::vector<int32_t> out, counts;
  void run(bool compact, int64_t out_rows) {
    out.assign(out_rows * p.out_row_stride, 0x5a5a5a5a);
    counts.assign(out_rows, 0x5a5a5a5a);
    p.req_local_indices = indices.data();
    p.req_id_per_token = req_ids.data();
    p.block_table = block_table.data();
    p.out_slots = out.data();
    p.valid_counts = counts.data();
    p.compact = compact;
    ASSERT_TRUE(ref::convert_req_indices_to_slots(p).ok());
  }
  std::vector<int32_t> row(int64_t t) const {
    return {out.begin() + t * p.out_row_stride, out.begin() + t * p.out_row_stride + p.topk};
  }
};

// page_size 2, 8 blocks; req 0 -> blocks [5, 1, 7], req 1 -> [2, 9 (bad), -1 (bad)].
ConvertCase page2_case() {
  ConvertCase c;
  c.block_table = {5, 1, 7, 3,   // column 3 is past max_blocks_per_req: never used
                   2, 9, -1, 3};
  c.indices = {0, 1, 2, 5, 6, -1, 77, 77,           // req 0
               3, 0, 2, 4, -5, 1, 77, 77,           // req 1
               0, 1, 2, 3, 4, 5, 77, 77,            // req id 2: out of range
               0, 1, 2, 3, 4, INT_MAX, 77, 77,      // req id -1
               0, 1, 2, 3, 4, 5, 77, 77};           // past num_tokens: never read
  c.req_ids = {0, 1, 2, -1, 0, 0, 0};  // longer than num_tokens
  c.p.indices_row_stride = 8;
  c.p.block_table_row_stride = 4;
  c.p.num_reqs = 2;
  c.p.max_blocks_per_req = 3;
  c.p.num_tokens = 4;
  c.p.topk = 6;
  c.p.page_size = 2;
  c.p.num_blocks = 8;
  c.p.out_row_stride = 7;
  return c;
}

TEST(ConvertIndices, Page2KnownAnswer) {
  ConvertCase c = page2_case();
  c.run(/*compact=*/false, /*out_rows=*/5);
  using V = std::vector<int32_t>;
  EXPECT_EQ(c.row(0), (V{10, 11, 2, 15, -1, -1}));
  EXPECT_EQ(c.row(1), (V{-1, 4, -1, -1, -1, 5}));
  EXPECT_EQ(c.row(2), (V{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(c.row(3), (V{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(c.counts, (V{4, 2, 0, 0, 0x5a5a5a5a}));
  // Row padding and rows past num_tokens are untouched.
  for (int64_t t = 0; t < 5; ++t) EXPECT_EQ(c.out[t * 7 + 6], 0x5a5a5a5a);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(c.out[4 * 7 + k], 0x5a5a5a5a);
}

// token_seq_lens bounds each row's positions: pos >= len is -1 (compaction and counts follow).
TEST(ConvertIndices, SeqLensBoundThePositions) {
  ConvertCase c = page2_case();
  const std::vector<int32_t> lens = {5, 1, 6, 6, 0, 0};  // row 0: positions < 5; row 1: < 1
  c.p.token_seq_lens = lens.data();
  c.run(/*compact=*/false, 5);
  using V = std::vector<int32_t>;
  EXPECT_EQ(c.row(0), (V{10, 11, 2, -1, -1, -1}));  // position 5 (slot 15) and 6 cut
  EXPECT_EQ(c.row(1), (V{-1, 4, -1, -1, -1, -1}));  // position 0 kept, 1 (slot 5) cut
  EXPECT_EQ(c.counts, (V{3, 1, 0, 0, 0x5a5a5a5a}));
  c.run(/*compact=*/true, 5);
  EXPECT_EQ(c.row(0), (V{10, 11, 2, -1, -1, -1}));
  EXPECT_EQ(c.row(1), (V{4, -1, -1, -1, -1, -1}));
  // a negative or zero length: nothing of the row is valid
  const std::vector<int32_t> none = {0, -7, 0, 0};
  c.p.token_seq_lens = none.data();
  c.run(false, 5);
  EXPECT_EQ(c.counts, (V{0, 0, 0, 0, 0x5a5a5a5a}));
}

TEST(ConvertIndices, CompactionKeepsOrder) {
  ConvertCase c = page2_case();
  c.run(/*compact=*/true, 5);
  using V = std::vector<int32_t>;
  EXPECT_EQ(c.row(0), (V{10, 11, 2, 15, -1, -1}));
  EXPECT_EQ(c.row(1), (V{4, 5, -1, -1, -1, -1}));
  EXPECT_EQ(c.row(2), (V{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(c.row(3), (V{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(c.counts, (V{4, 2, 0, 0, 0x5a5a5a5a}));
  for (int k = 0; k < 6; ++k) EXPECT_EQ(c.out[4 * 7 + k], 0x5a5a5a5a);
}

TEST(ConvertIndices, Page61KnownAnswer) {
  ConvertCase c;
  c.block_table = {3, 0, 4};
  c.indices = {60, 61, 122, 0, 183, 121, INT_MAX, -1};
  c.req_ids = {0};
  c.p.indices_row_stride = 8;
  c.p.block_table_row_stride = 3;
  c.p.num_reqs = 1;
  c.p.max_blocks_per_req = 3;
  c.p.num_tokens = 1;
  c.p.topk = 8;
  c.p.page_size = 61;
  c.p.num_blocks = 5;
  c.p.out_row_stride = 8;
  c.run(false, 1);
  EXPECT_EQ(c.row(0), (std::vector<int32_t>{3 * 61 + 60, 0, 4 * 61, 3 * 61, -1, 60, -1, -1}));
  EXPECT_EQ(c.counts[0], 5);
  c.run(true, 1);
  EXPECT_EQ(c.row(0), (std::vector<int32_t>{3 * 61 + 60, 0, 4 * 61, 3 * 61, 60, -1, -1, -1}));
  EXPECT_EQ(c.counts[0], 5);
}

TEST(ConvertIndices, EmptyAndBadArgs) {
  ConvertCase c = page2_case();
  c.p.num_tokens = 0;
  c.run(false, 2);
  EXPECT_EQ(c.out, std::vector<int32_t>(14, 0x5a5a5a5a));
  const std::string op = "selkv::ref::convert_req_indices_to_slots";
  ConvertCase d = page2_case();
  d.run(false, 5);
  auto p = d.p;
  p.page_size = 0;
  EXPECT_TRUE(is_invalid_argument(ref::convert_req_indices_to_slots(p), op, "page_size"));
  p = d.p; p.req_id_per_token = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::convert_req_indices_to_slots(p), op, "req_id_per_token"));
  p = d.p; p.out_slots = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::convert_req_indices_to_slots(p), op, "out_slots"));
  p = d.p; p.num_tokens = -3;
  EXPECT_TRUE(is_invalid_argument(ref::convert_req_indices_to_slots(p), op, "num_tokens"));
  p = d.p; p.out_row_stride = 5;
  EXPECT_TRUE(is_invalid_argument(ref::convert_req_indices_to_slots(p), op, "out_row_stride"));
}

// ---- C3 ----------------------------------------------------------------------------------------

// A paged cache whose slot s holds encode(token s); num_blocks pages of `page` tokens.
struct FilledCache {
  KvFormat format;
  int page;
  int64_t num_blocks, stride;
  Tokens tok;
  std::vector<uint8_t> bytes;
  FilledCache(KvFormat f, int page_size, int64_t blocks, std::mt19937_64& rng)
      : format(f), page(page_size), num_blocks(blocks),
        stride(page_bytes_of(f, page_size) + 16), tok(blocks * page_size, rng),
        bytes(blocks * stride, kSentinel) {
    std::vector<int64_t> slots(num_blocks * page);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
    WriteKvCacheParams p;
    p.latent = tok.latent.data();
    p.latent_row_stride = 512;
    p.rope = fmt::has_rope(format) ? tok.rope.data() : nullptr;
    p.rope_row_stride = 64;
    p.slot_mapping = slots.data();
    p.num_tokens = int64_t(slots.size());
    p.cache = bytes.data();
    p.num_blocks = num_blocks;
    p.page_size = page;
    p.block_stride_bytes = stride;
    p.format = format;
    EXPECT_TRUE(ref::write_kv_cache(p).ok());
  }
  std::vector<uint16_t> row(int64_t slot) const {  // what a reader must return for `slot`
    std::vector<uint16_t> r(fmt::dequant_dim(format));
    ref::decode_record(tok.record(slot, format, ScaleMode::kPow2).data(), format, r.data());
    return r;
  }
  GatherKvParams params() const {
    GatherKvParams p;
    p.cache = bytes.data();
    p.num_blocks = num_blocks;
    p.page_size = page;
    p.block_stride_bytes = stride;
    p.format = format;
    return p;
  }
};

class GatherKv : public ::testing::TestWithParam<KvFormat> {};

// Page 61, 5 blocks. Every expected slot is written out literally.
TEST_P(GatherKv, Page61KnownAnswer) {
  const KvFormat format = GetParam();
  std::mt19937_64 rng(test::test_seed());
  FilledCache c(format, 61, 5, rng);
  const int dim = fmt::dequant_dim(format), stride = dim + 8;
  const std::vector<int32_t> bt = {2, 0, 1,     // req 0
                                   4, 3, 2,     // req 1 (zero length)
                                   1, 3, 99,    // req 2: block 2 is bad
                                   0, 4, 3};    // req 3: runs past max_blocks_per_req
  const std::vector<int32_t> starts = {50, 5, 100, 181};
  const std::vector<int32_t> lens = {30, 0, 40, 4};
  const std::vector<int32_t> ws = {0, 30, 30, 70};
  const int64_t out_rows = 73, alloc_rows = 80;
  std::vector<uint16_t> out(alloc_rows * stride, kRowSentinel);
  GatherKvParams p = c.params();
  p.block_table = bt.data();
  p.block_table_row_stride = 3;
  p.max_blocks_per_req = 3;
  p.seq_starts = starts.data();
  p.seq_lens = lens.data();
  p.ws_starts = ws.data();
  p.num_reqs = 4;
  p.out = out.data();
  p.out_row_stride = stride;
  p.out_rows = out_rows;
  ASSERT_TRUE(ref::gather_kv_bf16(p).ok());

  std::vector<std::vector<uint16_t>> want(alloc_rows);  // empty = untouched
  const std::vector<uint16_t> zeros(dim, 0);
  for (int i = 0; i < 30; ++i) {  // req 0: positions 50..79 -> block 2 (50..60), block 0 (61..79)
    const int pos = 50 + i;
    want[i] = c.row(pos < 61 ? 2 * 61 + pos : 0 * 61 + (pos - 61));
  }
  for (int i = 0; i < 40; ++i) {  // req 2: positions 100..139 -> block 3 (100..121), bad (122..)
    const int pos = 100 + i;
    want[30 + i] = pos < 122 ? c.row(3 * 61 + (pos - 61)) : zeros;
  }
  // req 3: positions 181, 182 -> block 3 offsets 59, 60; 183 -> block index 3: missing;
  // 184 would land in row 73 >= out_rows: not written.
  want[70] = c.row(3 * 61 + 59);
  want[71] = c.row(3 * 61 + 60);
  want[72] = zeros;
  for (int64_t r = 0; r < alloc_rows; ++r) {
    for (int d = 0; d < stride; ++d) {
      const uint16_t expect = (want[r].empty() || d >= dim) ? kRowSentinel : want[r][d];
      ASSERT_EQ(out[r * stride + d], expect) << "row " << r << " col " << d;
    }
  }
}

// Page 2 with a request starting mid-page; a negative workspace row is never written.
TEST_P(GatherKv, Page2StartInsidePage) {
  const KvFormat format = GetParam();
  std::mt19937_64 rng(test::test_seed() + 1);
  FilledCache c(format, 2, 6, rng);
  const int dim = fmt::dequant_dim(format);
  const std::vector<int32_t> bt = {5, 1, 3, 0, -1,
                                   4, 4, 4, 4, 4};
  const std::vector<int32_t> starts = {3, 0};
  const std::vector<int32_t> lens = {6, 2};
  const std::vector<int32_t> ws = {0, -2};  // req 1 lands on rows -2, -1: never written
  std::vector<uint16_t> out(8 * dim, kRowSentinel);
  GatherKvParams p = c.params();
  p.block_table = bt.data();
  p.block_table_row_stride = 5;
  p.max_blocks_per_req = 5;
  p.seq_starts = starts.data();
  p.seq_lens = lens.data();
  p.ws_starts = ws.data();
  p.num_reqs = 2;
  p.out = out.data();
  p.out_row_stride = dim;
  p.out_rows = 8;
  ASSERT_TRUE(ref::gather_kv_bf16(p).ok());
  // positions 3..8 -> (blk1 off1)=1*2+1, (blk2 off0)=6, 7, (blk3)=0, 1, (blk4 = -1) zeros
  const std::vector<int64_t> slots = {3, 6, 7, 0, 1, -1};
  for (int r = 0; r < 8; ++r) {
    std::vector<uint16_t> got(out.begin() + r * dim, out.begin() + (r + 1) * dim);
    if (r >= 6) EXPECT_EQ(got, std::vector<uint16_t>(dim, kRowSentinel)) << r;
    else if (slots[r] < 0) EXPECT_EQ(got, std::vector<uint16_t>(dim, 0)) << r;
    else EXPECT_EQ(got, c.row(slots[r])) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GatherKv,
                         ::testing::Values(KvFormat::kDsMlaFp8, KvFormat::kNopeFp8, KvFormat::kModel1Fp8));

// The oracle's reader against the independent layout: every slot of a model1_fp8 cache written by
// the oracle's C1 decodes (C3) to the token's record decoded alone, and the bytes sit where
// DESIGN §1 puts them.
TEST(GatherKv, Model1PagedBytesAndRows) {
  std::mt19937_64 rng(test::test_seed() + 7);
  for (int page : {1, 2, 61, 64}) {
    FilledCache c(KvFormat::kModel1Fp8, page, 3, rng);
    std::vector<uint8_t> want(c.bytes.size(), kSentinel);
    for (int64_t s = 0; s < 3 * page; ++s) {
      place_token(want, c.format, page, c.stride, s, c.tok.record(s, c.format, ScaleMode::kPow2));
    }
    for (int64_t b = 0; b < 3; ++b) {  // the zero pad byte of each token is written
      for (int64_t i = 0; i < page; ++i) ASSERT_EQ(want[size_t(b * c.stride + page * 576 + 8 * i + 7)], 0);
    }
    ASSERT_EQ(c.bytes, want) << "page " << page;
  }
}

TEST(GatherKvArgs, RejectsBadParams) {
  std::mt19937_64 rng(1);
  FilledCache c(KvFormat::kDsMlaFp8, 4, 1, rng);
  const std::vector<int32_t> bt = {0}, starts = {0}, lens = {4}, ws = {0};
  std::vector<uint16_t> out(4 * 576);
  GatherKvParams p = c.params();
  p.block_table = bt.data();
  p.block_table_row_stride = 1;
  p.max_blocks_per_req = 1;
  p.seq_starts = starts.data();
  p.seq_lens = lens.data();
  p.ws_starts = ws.data();
  p.num_reqs = 1;
  p.out = out.data();
  p.out_row_stride = 576;
  p.out_rows = 4;
  ASSERT_TRUE(ref::gather_kv_bf16(p).ok());
  const std::string op = "selkv::ref::gather_kv_bf16";
  auto q = p; q.page_size = 0;
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "page_size"));
  q = p; q.out_row_stride = 512;  // too narrow for 576
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "out_row_stride"));
  q = p; q.seq_lens = nullptr;
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "seq_lens"));
  q = p; q.out_rows = -1;
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "out_rows"));
}

TEST(GatherKvArgs, Model1RejectsBadParams) {
  std::mt19937_64 rng(2);
  FilledCache c(KvFormat::kModel1Fp8, 4, 1, rng);
  const std::vector<int32_t> bt = {0}, starts = {0}, lens = {4}, ws = {0};
  std::vector<uint16_t> out(4 * 512);
  GatherKvParams p = c.params();
  p.block_table = bt.data();
  p.block_table_row_stride = 1;
  p.max_blocks_per_req = 1;
  p.seq_starts = starts.data();
  p.seq_lens = lens.data();
  p.ws_starts = ws.data();
  p.num_reqs = 1;
  p.out = out.data();
  p.out_row_stride = 512;
  p.out_rows = 4;
  ASSERT_TRUE(ref::gather_kv_bf16(p).ok());
  const std::string op = "selkv::ref::gather_kv_bf16";
  auto q = p; q.out_row_stride = 448;  // rows are 448 NoPE + 64 RoPE = 512 wide
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "out_row_stride"));
  q = p; q.block_stride_bytes = 4 * 584;  // unpadded page
  EXPECT_TRUE(is_invalid_argument(ref::gather_kv_bf16(q), op, "block_stride_bytes"));
}

}  // namespace
}  // namespace selkv
