// MODEL1 sparse decode oracle (C5 with model1_fp8 and the extra cache): a hand-computed case
// (V is the whole 512-dim key, RoPE included), the union of two selections == one concatenated
// selection over a combined cache, NaN-poisoned unselected records, empty selections, the plan's
// snapshot of both lengths and the argument rules.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "decode/decode_params.h"
#include "model1_decode_util.h"
#include "reference/oracle.h"
#include "selkv/decode.h"
#include "test_util.h"

namespace selkv {
namespace {

using test::Model1DecodeCase;
constexpr float kInf = std::numeric_limits<float>::infinity();
using M1 = KvFormatTraits<KvFormat::kModel1Fp8>;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// H = 2, one key in the main cache and one in the extra cache, values exactly representable
// (powers of two: the pow2 quantization is exact), so the expected result is plain fp64 math.
// q_h . k: head 0 sees NoPE dim 3 and RoPE dim 448 + 5; V dims 448.. (RoPE) reach the output.
TEST(Model1DecodeOracle, HandComputedUnionOfTwoCaches) {
  const int page = 3, page2 = 2;
  std::vector<uint8_t> c1(size_t(2 * M1::page_bytes(page)), 0xff), c2(size_t(3 * M1::page_bytes(page2)), 0xff);
  const PagedKvCache v1{c1.data(), 2, page, M1::page_bytes(page), KvFormat::kModel1Fp8};
  const PagedKvCache v2{c2.data(), 3, page2, M1::page_bytes(page2), KvFormat::kModel1Fp8};
  // key A (main slot 4): NoPE[3] = 1, RoPE[5] = 2; key B (extra slot 5): NoPE[3] = 0.5, RoPE[5] = -1, NoPE[100] = 4
  std::vector<uint16_t> lat(448, test::bf16(0.f)), rope(64, test::bf16(0.f));
  lat[3] = test::bf16(1.f);
  rope[5] = test::bf16(2.f);
  ref::encode_slot(lat.data(), rope.data(), ScaleMode::kPow2, v1, c1.data(), 4);
  lat[3] = test::bf16(0.5f);
  lat[100] = test::bf16(4.f);
  rope[5] = test::bf16(-1.f);
  ref::encode_slot(lat.data(), rope.data(), ScaleMode::kPow2, v2, c2.data(), 5);
  // q: head 0 = e3 + e(448+5), head 1 = 2 e100
  std::vector<uint16_t> q(2 * 512, test::bf16(0.f));
  q[3] = test::bf16(1.f);
  q[448 + 5] = test::bf16(1.f);
  q[512 + 100] = test::bf16(2.f);
  std::vector<int32_t> idx(64, -1), idx2(64, -1);
  idx[10] = 4;
  idx[11] = 6;  // past the main cache (6 slots): invalid
  idx2[0] = 5;
  idx2[1] = -3;
  std::vector<float> out(2 * 512), lse(2);
  ref::SparseDecodeRefArgs a;
  a.q = q.data();
  a.B = a.S_q = 1;
  a.H = 2;
  a.cache = v1;
  a.indices = idx.data();
  a.K = 64;
  a.extra_cache = v2;
  a.extra_indices = idx2.data();
  a.K2 = 64;
  a.sm_scale = 0.5f;
  a.out = out.data();
  a.lse = lse.data();
  ASSERT_TRUE(ref::check_sparse_decode_args(a).ok()) << ref::check_sparse_decode_args(a).to_string();
  ref::sparse_decode(a);
  // head 0: sA = 0.5 * (1 + 2) = 1.5, sB = 0.5 * (0.5 - 1) = -0.25; head 1: sA = 0, sB = 0.5 * 8 = 4
  const double s[2][2] = {{1.5, -0.25}, {0.0, 4.0}};
  for (int h = 0; h < 2; ++h) {
    const double m = std::max(s[h][0], s[h][1]);
    const double ea = std::exp(s[h][0] - m), eb = std::exp(s[h][1] - m), l = ea + eb;
    const double pa = ea / l, pb = eb / l;
    EXPECT_NEAR(lse[size_t(h)], m + std::log(l), 1e-6);
    const float* o = &out[size_t(h) * 512];
    EXPECT_NEAR(o[3], pa * 1.0 + pb * 0.5, 1e-6) << h;
    EXPECT_NEAR(o[100], pb * 4.0, 1e-6) << h;
    EXPECT_NEAR(o[448 + 5], pa * 2.0 - pb * 1.0, 1e-6) << h;  // V includes the RoPE dims
    EXPECT_EQ(o[0], 0.f);
    EXPECT_EQ(o[511], 0.f);
  }
}

// The union of the two selections is one selection over a combined cache: every valid entry of
// either cache copied (record + scales) into a page-1 cache, main entries first, the extra ones
// after; invalid entries and those past either length become -1. The same keys in the same order
// give the same bits.
struct UnionParam {
  bool dyn1, dyn2, sink;
  int page, page2;
};
class Model1DecodeOracleUnion : public ::testing::TestWithParam<UnionParam> {};

TEST_P(Model1DecodeOracleUnion, EqualsConcatenatedSelection) {
  const UnionParam up = GetParam();
  std::mt19937_64 rng(test::test_seed() + up.page * 31 + up.page2);
  Model1DecodeCase::Spec sp;
  sp.B = 4;
  sp.H = 16;
  sp.K = 128;
  sp.K2 = 192;
  sp.page = up.page;
  sp.page2 = up.page2;
  sp.dyn1 = up.dyn1;
  sp.dyn2 = up.dyn2;
  sp.sink = up.sink;
  const Model1DecodeCase c(sp, rng);
  std::vector<float> out, lse;
  const ref::SparseDecodeRefArgs a = c.args(out, lse);
  ASSERT_TRUE(ref::check_sparse_decode_args(a).ok()) << ref::check_sparse_decode_args(a).to_string();
  ref::sparse_decode(a);

  // Combined cache: page 1, slot = main slot or main_slots + extra slot.
  const int64_t n1 = c.main.num_slots(), n2 = c.extra.num_slots();
  const int64_t stride1 = M1::page_bytes(1);
  std::vector<uint8_t> comb(size_t((n1 + n2) * stride1), 0xff);
  auto copy_token = [&](const test::Model1Cache& src, int64_t slot, int64_t dst_slot) {
    const PagedKvCache v = src.view();
    uint8_t* dst = comb.data() + dst_slot * stride1;
    std::memcpy(dst + M1::record_offset(0), src.bytes.data() + v.slot_offset(slot), M1::kRecordStride);
    std::memcpy(dst + M1::scale_offset(0, 1), src.bytes.data() + v.scale_offset(slot), M1::kScaleStride);
  };
  for (int64_t s = 0; s < n1; ++s) copy_token(c.main, s, s);
  for (int64_t s = 0; s < n2; ++s) copy_token(c.extra, s, n1 + s);
  const int KT = c.K + c.K2;
  std::vector<int32_t> cidx(size_t(c.B) * c.S_q * KT, -1);
  for (int b = 0; b < c.B; ++b)
    for (int s = 0; s < c.S_q; ++s) {
      const size_t row = size_t(b) * c.S_q + s;
      const int l1 = c.dyn1 ? std::max(0, std::min(c.K, c.len1[size_t(b)])) : c.K;
      const int l2 = c.dyn2 ? std::max(0, std::min(c.K2, c.len2[size_t(b)])) : c.K2;
      for (int k = 0; k < l1; ++k) {
        const int32_t i = c.idx[row * c.K + k];
        if (i >= 0 && i < n1) cidx[row * KT + k] = i;
      }
      for (int k = 0; k < l2; ++k) {
        const int32_t i = c.idx2[row * c.K2 + k];
        if (i >= 0 && i < n2) cidx[row * KT + c.K + k] = int32_t(n1 + i);
      }
    }
  std::vector<float> out2(c.out_size()), lse2(c.lse_size());
  ref::SparseDecodeRefArgs b = a;
  b.cache = PagedKvCache{comb.data(), n1 + n2, 1, stride1, KvFormat::kModel1Fp8};
  b.indices = cidx.data();
  b.K = KT;
  b.topk_length = nullptr;
  b.extra_cache = PagedKvCache{};
  b.extra_indices = nullptr;
  b.K2 = 0;
  b.extra_topk_length = nullptr;
  b.out = out2.data();
  b.lse = lse2.data();
  ASSERT_TRUE(ref::check_sparse_decode_args(b).ok());
  ref::sparse_decode(b);
  EXPECT_TRUE(same_bits(out, out2));
  EXPECT_TRUE(same_bits(lse, lse2));
  // No poisoned (NaN) record was read, and the all-invalid row (1) is 0 / -inf.
  for (float v : out) ASSERT_FALSE(std::isnan(v));
  for (float v : lse) ASSERT_FALSE(std::isnan(v));
  for (int h = 0; h < c.H; ++h) EXPECT_EQ(lse[size_t(1) * c.H + h], -kInf);
}

INSTANTIATE_TEST_SUITE_P(Variants, Model1DecodeOracleUnion,
                         ::testing::Values(UnionParam{false, false, false, 61, 2}, UnionParam{true, false, true, 64, 2},
                                           UnionParam{false, true, false, 2, 64}, UnionParam{true, true, true, 69, 61},
                                           UnionParam{true, true, false, 576, 53}));

// Empty selections: main empty + extra valid == extra alone over the same keys; both empty ->
// 0 / -inf; an extra cache with K2 > 0 and every length 0 == no extra cache.
TEST(Model1DecodeOracle, EmptySelectionsInEitherCache) {
  std::mt19937_64 rng(test::test_seed() + 7);
  Model1DecodeCase::Spec sp;
  sp.B = 2;
  sp.S_q = 1;
  sp.H = 8;
  sp.K = 64;
  sp.K2 = 64;
  sp.page = 64;
  sp.page2 = 2;
  sp.empty_row = -1;
  sp.dyn1 = sp.dyn2 = true;
  Model1DecodeCase c(sp, rng);
  std::vector<float> out, lse, out2, lse2;
  // both lengths 0 -> 0 / -inf
  c.len1 = {0, 0};
  c.len2 = {0, 0};
  ref::sparse_decode(c.args(out, lse));
  for (float v : out) EXPECT_EQ(v, 0.f);
  for (float v : lse) EXPECT_EQ(v, -kInf);
  // main length 0, extra full == the extra's entries as the main cache
  c.len2 = {64, 64};
  ref::sparse_decode(c.args(out, lse));
  Model1DecodeCase d = c;
  d.main = c.extra;
  d.idx = c.idx2;
  d.len1 = c.len2;
  d.K2 = 0;
  d.dyn2 = false;
  ref::sparse_decode(d.args(out2, lse2));
  EXPECT_TRUE(same_bits(out, out2));
  EXPECT_TRUE(same_bits(lse, lse2));
  // extra lengths 0 == no extra cache
  c.len1 = {64, 40};
  c.len2 = {0, 0};
  ref::sparse_decode(c.args(out, lse));
  Model1DecodeCase e = c;
  e.K2 = 0;
  e.dyn2 = false;
  ref::sparse_decode(e.args(out2, lse2));
  EXPECT_TRUE(same_bits(out, out2));
  EXPECT_TRUE(same_bits(lse, lse2));
}

// A NaN in a selected record of the extra cache makes the row NaN (DESIGN §2), the other rows
// keep their bits.
TEST(Model1DecodeOracle, NanInSelectedExtraRecordGivesNanRow) {
  std::mt19937_64 rng(test::test_seed() + 11);
  Model1DecodeCase::Spec sp;
  sp.B = 2;
  sp.S_q = 1;
  sp.H = 8;
  sp.K = 64;
  sp.K2 = 64;
  sp.empty_row = -1;
  Model1DecodeCase c(sp, rng);
  std::vector<float> out, lse, out2, lse2;
  ref::sparse_decode(c.args(out, lse));
  Model1DecodeCase d = c;
  // a slot row 1 selects in the extra cache and row 0 does not
  int32_t slot = -1;
  for (int k = 0; k < 64 && slot < 0; ++k) {
    const int32_t i = d.idx2[size_t(64 + k)];
    if (i < 0 || i >= d.extra.live) continue;
    bool in_row0 = false;
    for (int j = 0; j < 64; ++j) in_row0 |= d.idx2[size_t(j)] == i;
    if (!in_row0) slot = i;
  }
  ASSERT_GE(slot, 0);
  d.extra.bytes[size_t(d.extra.view().scale_offset(slot)) + 2] = 0xff;  // NaN scale of tile 2
  ref::sparse_decode(d.args(out2, lse2));
  for (int h = 0; h < 8; ++h) {
    EXPECT_TRUE(std::isnan(lse2[size_t(8 + h)]));
    EXPECT_EQ(lse2[size_t(h)], lse[size_t(h)]);
  }
  EXPECT_EQ(std::memcmp(out.data(), out2.data(), 8 * 512 * sizeof(float)), 0);
}

TEST(Model1DecodeOracle, ArgumentRules) {
  std::mt19937_64 rng(test::test_seed() + 13);
  Model1DecodeCase::Spec sp;
  sp.B = 1;
  sp.S_q = 1;
  sp.H = 4;
  sp.K = 64;
  sp.K2 = 64;
  const Model1DecodeCase c(sp, rng);
  std::vector<float> out, lse;
  auto expect_arg = [](const Status& st, const char* arg) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(std::string(": ") + arg + ":"), std::string::npos) << st.to_string();
  };
  {
    auto a = c.args(out, lse);
    EXPECT_TRUE(ref::check_sparse_decode_args(a).ok());
  }
  {
    auto a = c.args(out, lse);
    a.extra_cache.format = KvFormat::kDsMlaFp8;
    expect_arg(ref::check_sparse_decode_args(a), "extra_cache.format");
  }
  {
    // an extra cache with ds_mla_fp8 records is not supported (the kernels are built without one)
    auto a = c.args(out, lse);
    a.cache.format = a.extra_cache.format = KvFormat::kDsMlaFp8;
    a.cache.block_stride_bytes = a.extra_cache.block_stride_bytes = int64_t(1) << 20;
    expect_arg(ref::check_sparse_decode_args(a), "extra_cache");
  }
  {
    auto a = c.args(out, lse);
    a.extra_indices = nullptr;
    expect_arg(ref::check_sparse_decode_args(a), "extra_indices");
  }
  {
    auto a = c.args(out, lse);
    a.extra_cache.block_stride_bytes = M1::page_bytes(a.extra_cache.page_size) - 16;
    expect_arg(ref::check_sparse_decode_args(a), "extra_cache");
  }
  {
    auto a = c.args(out, lse);
    a.K2 = 0;
    const int32_t len = 3;
    a.extra_topk_length = &len;
    expect_arg(ref::check_sparse_decode_args(a), "extra_topk_length");
  }
  {
    auto a = c.args(out, lse);
    a.K2 = -64;
    expect_arg(ref::check_sparse_decode_args(a), "K2");
  }
  {
    auto a = c.args(out, lse);
    a.cache.format = KvFormat::kNopeFp8;
    expect_arg(ref::check_sparse_decode_args(a), "cache.format");
  }
  {
    // the oracle writes nothing when the check fails
    auto a = c.args(out, lse);
    a.extra_indices = nullptr;
    ref::sparse_decode(a);
    for (float v : lse) EXPECT_TRUE(std::isnan(v));
  }
}

// The CPU plan keeps K2 and the extra cache's clamped lengths where the GPU scheduler does.
TEST(Model1DecodeOracle, PlanSnapshotsBothLengths) {
  const int32_t len[3] = {5, -4, 900}, len2[3] = {0, 64, 1000};
  DecodeShape shape{3, 2, 64, 128, len, 1};
  shape.extra_topk = 256;
  shape.extra_topk_length = len2;
  const size_t bytes = decode_metadata_size(3, 2);
  EXPECT_EQ(bytes, (size_t(decode::md_ints(6, 3)) * 4 + 15) & ~size_t(15));
  std::vector<int32_t> buf(bytes / 4, 77);
  DecodeMetadata md;
  ASSERT_TRUE(ref::make_decode_metadata(shape, buf.data(), bytes, &md).ok());
  EXPECT_EQ(md.shape.extra_topk, 256);
  EXPECT_EQ(md.shape.extra_topk_length, len2);
  EXPECT_EQ(buf[size_t(decode::md_extra_offset(6, 3))], 256);
  const int32_t* l1 = buf.data() + decode::md_lengths_offset(6);
  const int32_t* l2 = buf.data() + decode::md_extra_lengths_offset(6, 3);
  EXPECT_EQ(l1[0], 5);
  EXPECT_EQ(l1[1], 0);
  EXPECT_EQ(l1[2], 128);
  EXPECT_EQ(l2[0], 0);
  EXPECT_EQ(l2[1], 64);
  EXPECT_EQ(l2[2], 256);
}

// The header rules for plans with an extra cache: the extra magic, K2 and a total within
// rows * (K + K2) / 64; kernels without an extra cache reject such a plan.
TEST(Model1DecodeOracle, HeaderRulesWithAnExtraCache) {
  int32_t h[8];
  decode::md_write_header(h, /*total=*/6 * 2, /*np=*/4, /*rows=*/6, /*min_blocks=*/2, decode::DecodeCut::kBalanced, 0,
                          /*topk=*/128);
  EXPECT_TRUE(decode::md_header_ok(h, 6, 128, 2, 8));
  EXPECT_TRUE(decode::md_header_ok_extra(h, 0, 6, 128, 0, 2, 8));
  EXPECT_FALSE(decode::md_header_ok_extra(h, 64, 6, 128, 64, 2, 8));  // magic of a plan without extra
  h[0] = 6 * 3;  // K / 64 + K2 / 64 = 3 blocks per row
  EXPECT_FALSE(decode::md_header_ok(h, 6, 128, 2, 8));
  h[3] = decode::kMdMagicExtra;
  EXPECT_FALSE(decode::md_header_ok(h, 6, 128, 2, 8));
  EXPECT_TRUE(decode::md_header_ok_extra(h, 64, 6, 128, 64, 2, 8));
  EXPECT_FALSE(decode::md_header_ok_extra(h, 128, 6, 128, 64, 2, 8));  // K2 differs
  h[0] = 6 * 3 + 1;  // more than rows * (K + K2) / 64 blocks
  EXPECT_FALSE(decode::md_header_ok_extra(h, 64, 6, 128, 64, 2, 8));
  // The fixed schedule of a call with an extra cache walks K / 64 + K2 / 64 blocks per row.
  const decode::FixedSchedule fs(6, 128 + 64, 2, 8);
  EXPECT_EQ(fs.blocks_per_row, 3);
  EXPECT_EQ(fs.total, 18);
}

}  // namespace
}  // namespace selkv
