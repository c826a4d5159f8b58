// Attention oracle: golden decode vectors, a hand-computed prefill case, prefill == decode on the
// same keys, tail/garbage-index invariance and attn_sink.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "decode/decode_params.h"
#include "reference/oracle.h"
#include "test_util.h"

namespace selkv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// |got - want| <= rel * max(1, |want|); infinities must match exactly.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double rel) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return ::testing::AssertionFailure() << "[" << i << "] got " << g << " want " << w;
      continue;
    }
    if (!(std::fabs(g - w) <= rel * std::max(1.0, std::fabs(w))))
      return ::testing::AssertionFailure() << "[" << i << "] got " << g << " want " << w;
  }
  return ::testing::AssertionSuccess();
}

// ---- golden decode -----------------------------------------------------------------------------

class GoldenDecode : public ::testing::TestWithParam<bool> {};

TEST_P(GoldenDecode, MatchesVectors) {
  const bool dynamic = GetParam();
  const auto q = test::read_vector<uint16_t>("dec_q_bf16.bin");
  const auto cache = test::read_vector<uint8_t>("dec_cache_u8.bin");
  const auto indices = test::read_vector<int32_t>("dec_indices_i32.bin");
  const auto topk = test::read_vector<int32_t>("dec_topk_length_i32.bin");
  const char* out_name = dynamic ? "dec_dyn_out_f32.bin" : "dec_out_f32.bin";
  const char* lse_name = dynamic ? "dec_dyn_lse_f32.bin" : "dec_lse_f32.bin";
  const auto want_out = test::read_vector<float>(out_name);
  const auto want_lse = test::read_vector<float>(lse_name);
  SELKV_REQUIRE_VECTOR(q, "dec_q_bf16.bin");
  SELKV_REQUIRE_VECTOR(cache, "dec_cache_u8.bin");
  SELKV_REQUIRE_VECTOR(indices, "dec_indices_i32.bin");
  SELKV_REQUIRE_VECTOR(topk, "dec_topk_length_i32.bin");
  SELKV_REQUIRE_VECTOR(want_out, out_name);
  SELKV_REQUIRE_VECTOR(want_lse, lse_name);
  constexpr int B = 2, S_q = 2, H = 64, K = 128;
  ASSERT_EQ(q.size(), size_t(B * S_q * H * 576));
  ASSERT_EQ(cache.size(), size_t(9 * 61 * 656));
  ASSERT_EQ(indices.size(), size_t(B * S_q * K));
  ASSERT_EQ(topk.size(), size_t(B));
  ASSERT_EQ(want_out.size(), size_t(B * S_q * H * 512));
  ASSERT_EQ(want_lse.size(), size_t(B * S_q * H));

  std::vector<float> out(want_out.size(), std::nanf("")), lse(want_lse.size(), std::nanf(""));
  ref::SparseDecodeRefArgs a;
  a.q = q.data();
  a.B = B;
  a.S_q = S_q;
  a.H = H;
  a.cache = PagedKvCache{cache.data(), 9, 61, 61 * 656, KvFormat::kDsMlaFp8};
  a.indices = indices.data();
  a.K = K;
  a.topk_length = dynamic ? topk.data() : nullptr;
  a.sm_scale = float(std::pow(576.0, -0.55));
  a.out = out.data();
  a.lse = lse.data();
  ASSERT_TRUE(ref::check_sparse_decode_args(a).ok());
  ref::sparse_decode(a);

  // Both sides are fp64 results rounded to fp32: allow about one fp32 ulp.
  EXPECT_TRUE(close(out, want_out, 1e-7));
  EXPECT_TRUE(close(lse, want_lse, 1e-7));
  // The all-invalid row: lse exactly -inf and out exactly 0, as the vectors say.
  int empty_rows = 0;
  for (int r = 0; r < B * S_q * H; ++r) {
    if (want_lse[r] != -kInf) continue;
    ++empty_rows;
    EXPECT_EQ(lse[r], -kInf) << r;
    for (int c = 0; c < 512; ++c) ASSERT_EQ(out[size_t(r) * 512 + c], 0.f) << r;
  }
  EXPECT_GE(empty_rows, H);  // the vectors contain at least one all-invalid (b, s) row
}

INSTANTIATE_TEST_SUITE_P(FixedAndDynamic, GoldenDecode, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Dynamic" : "Fixed"; });

// ---- hand-computed prefill ---------------------------------------------------------------------

class HandPrefill : public ::testing::TestWithParam<int> {};

// H = 1, two keys: q = e0 + 2 e1 (+ e520 for d_qk 576), k0 = e0 + 3 e2 (+ 2 e520), k1 = e1 + 5 e2.
TEST_P(HandPrefill, TwoKeys) {
  const int D = GetParam();
  std::vector<uint16_t> q(D, 0), kv(3 * D, 0);
  q[0] = test::bf16(1.f);
  q[1] = test::bf16(2.f);
  kv[0] = test::bf16(1.f);
  kv[2] = test::bf16(3.f);
  kv[D + 1] = test::bf16(1.f);
  kv[D + 2] = test::bf16(5.f);
  kv[2 * D + 7] = test::bf16(100.f);  // key 2: never selected
  double s0 = 0.5 * 1, s1 = 0.5 * 2;
  if (D == 576) {  // RoPE dims count in the score but not in the value
    q[520] = test::bf16(1.f);
    kv[520] = test::bf16(2.f);
    s0 += 0.5 * 2;
  }
  // Invalid entries (-1, num_kv, INT_MAX, past topk_length) and a duplicate-free valid set.
  const std::vector<int32_t> idx = {0, -1, 3, 1, INT_MAX, 2};
  const std::vector<int32_t> topk = {5};
  std::vector<float> out(512, std::nanf("")), ml(1), lse(1);
  ref::SparsePrefillRefArgs a;
  a.q = q.data();
  a.T = 1;
  a.H = 1;
  a.d_qk = D;
  a.kv = kv.data();
  a.num_kv = 3;
  a.indices = idx.data();
  a.K = 6;
  a.topk_length = topk.data();
  a.sm_scale = 0.5f;
  a.out = out.data();
  a.max_logits = ml.data();
  a.lse = lse.data();
  ASSERT_TRUE(ref::check_sparse_prefill_args(a).ok());
  ref::sparse_prefill(a);

  const double m = std::max(s0, s1);
  const double z = std::exp(s0 - m) + std::exp(s1 - m);
  const double p0 = std::exp(s0 - m) / z, p1 = std::exp(s1 - m) / z;
  EXPECT_EQ(lse[0], float(m + std::log(z)));
  EXPECT_EQ(ml[0], float(m));
  std::vector<float> want(512, 0.f);
  want[0] = float(p0);
  want[1] = float(p1);
  want[2] = float(3 * p0 + 5 * p1);
  EXPECT_TRUE(close(out, want, 1e-7));
  for (int c = 3; c < 512; ++c) EXPECT_EQ(out[c], 0.f) << c;
}

INSTANTIATE_TEST_SUITE_P(Dims, HandPrefill, ::testing::Values(512, 576));

TEST(Prefill, DuplicatesCountEachTimeAndEmptyRows) {
  const int D = 512;
  std::vector<uint16_t> q(2 * D, 0), kv(2 * D, 0);
  q[0] = q[D] = test::bf16(1.f);
  kv[0] = test::bf16(1.f);         // key 0: score 1, value e0
  kv[D + 1] = test::bf16(1.f);     // key 1: score 0, value e1
  // Row 0 selects key 0 twice and key 1 once; row 1 has nothing valid.
  const std::vector<int32_t> idx = {0, 0, 1, -1, 2, INT_MIN};
  std::vector<float> out(2 * 512), ml(2), lse(2);
  ref::SparsePrefillRefArgs a;
  a.q = q.data();
  a.T = 2;
  a.H = 1;
  a.d_qk = D;
  a.kv = kv.data();
  a.num_kv = 2;
  a.indices = idx.data();
  a.K = 3;
  a.sm_scale = 1.f;
  a.out = out.data();
  a.max_logits = ml.data();
  a.lse = lse.data();
  ref::sparse_prefill(a);
  const double z = 2 * std::exp(1.0) + 1.0;
  EXPECT_FLOAT_EQ(out[0], float(2 * std::exp(1.0) / z));
  EXPECT_FLOAT_EQ(out[1], float(1.0 / z));
  EXPECT_FLOAT_EQ(lse[0], float(std::log(z)));
  EXPECT_EQ(ml[0], 1.f);
  EXPECT_EQ(lse[1], -kInf);
  EXPECT_EQ(ml[1], -kInf);
  for (int c = 0; c < 512; ++c) EXPECT_EQ(out[512 + c], 0.f);
}

// ---- prefill over the gathered bf16 cache == decode over the FP8 cache --------------------------

struct DecodeSetup {
  int B = 3, S_q = 2, H = 16, K = 128, page = 61;
  int64_t num_blocks = 7;
  std::vector<uint8_t> cache;
  std::vector<uint16_t> q;
  std::vector<int32_t> indices, topk;
  float sm_scale = float(std::pow(576.0, -0.55));
  int64_t num_slots() const { return num_blocks * page; }

  explicit DecodeSetup(std::mt19937_64& rng, ScaleMode mode = ScaleMode::kPow2) {
    // Poison every record (0xff = NaN E4M3 and NaN scale) and write only the slots a valid index
    // may select: any stray read of a poisoned slot turns the result into NaN.
    cache.assign(num_blocks * page * 656, 0xff);
    const int64_t live = num_slots() - 20;  // last 20 slots: never written, never selected
    std::vector<int64_t> slots(live);
    for (int64_t i = 0; i < live; ++i) slots[i] = i;
    const auto latent = test::randn_bf16(live * 512, 0.1f, rng);
    const auto rope = test::randn_bf16(live * 64, 0.1f, rng);
    WriteKvCacheParams w;
    w.latent = latent.data();
    w.latent_row_stride = 512;
    w.rope = rope.data();
    w.rope_row_stride = 64;
    w.slot_mapping = slots.data();
    w.num_tokens = live;
    w.cache = cache.data();
    w.num_blocks = num_blocks;
    w.page_size = page;
    w.block_stride_bytes = int64_t(page) * 656;
    w.scale_mode = mode;
    EXPECT_TRUE(ref::write_kv_cache(w).ok());
    q = test::randn_bf16(size_t(B) * S_q * H * 576, 1.f, rng);
    std::uniform_int_distribution<int32_t> slot(0, int32_t(live - 1));
    indices.resize(size_t(B) * S_q * K);
    for (auto& i : indices) i = slot(rng);
    const int32_t garbage[] = {-1, -7, INT_MAX, INT_MIN, int32_t(num_slots())};
    for (size_t i = 0; i < indices.size(); i += 9) indices[i] = garbage[(i / 9) % 5];
    for (int k = 0; k < K; ++k) indices[size_t(1 * S_q + 1) * K + k] = -1;  // all-invalid row
    topk = {K, 70, 1};
  }
  ref::SparseDecodeRefArgs args(std::vector<float>& out, std::vector<float>& lse,
                                bool dynamic) const {
    out.assign(size_t(B) * S_q * H * 512, std::nanf(""));
    lse.assign(size_t(B) * S_q * H, std::nanf(""));
    ref::SparseDecodeRefArgs a;
    a.q = q.data();
    a.B = B;
    a.S_q = S_q;
    a.H = H;
    a.cache = PagedKvCache{cache.data(), num_blocks, page, int64_t(page) * 656, KvFormat::kDsMlaFp8};
    a.indices = indices.data();
    a.K = K;
    a.topk_length = dynamic ? topk.data() : nullptr;
    a.sm_scale = sm_scale;
    a.out = out.data();
    a.lse = lse.data();
    return a;
  }
};

class PrefillMatchesDecode : public ::testing::TestWithParam<std::tuple<bool, ScaleMode>> {};

TEST_P(PrefillMatchesDecode, SameKeysSameResult) {
  const auto [dynamic, mode] = GetParam();
  std::mt19937_64 rng(test::test_seed());
  DecodeSetup s(rng, mode);
  std::vector<float> dec_out, dec_lse;
  ref::sparse_decode(s.args(dec_out, dec_lse, dynamic));

  // Dequantize the whole cache through the gather op (one request, identity block table).
  std::vector<int32_t> bt(s.num_blocks);
  for (int64_t i = 0; i < s.num_blocks; ++i) bt[i] = int32_t(i);
  const int32_t start = 0, len = int32_t(s.num_slots()), ws = 0;
  std::vector<uint16_t> kv(s.num_slots() * 576);
  GatherKvParams g;
  g.cache = s.cache.data();
  g.num_blocks = s.num_blocks;
  g.page_size = s.page;
  g.block_stride_bytes = int64_t(s.page) * 656;
  g.block_table = bt.data();
  g.block_table_row_stride = s.num_blocks;
  g.max_blocks_per_req = int32_t(s.num_blocks);
  g.seq_starts = &start;
  g.seq_lens = &len;
  g.ws_starts = &ws;
  g.num_reqs = 1;
  g.out = kv.data();
  g.out_row_stride = 576;
  g.out_rows = s.num_slots();
  ASSERT_TRUE(ref::gather_kv_bf16(g).ok());

  const int T = s.B * s.S_q;
  std::vector<int32_t> row_topk(T);
  for (int t = 0; t < T; ++t) row_topk[t] = s.topk[t / s.S_q];
  std::vector<float> out(size_t(T) * s.H * 512, std::nanf("")), ml(size_t(T) * s.H),
      lse(size_t(T) * s.H, std::nanf(""));
  ref::SparsePrefillRefArgs a;
  a.q = s.q.data();
  a.T = T;
  a.H = s.H;
  a.d_qk = 576;
  a.kv = kv.data();
  a.num_kv = s.num_slots();
  a.indices = s.indices.data();
  a.K = s.K;
  a.topk_length = dynamic ? row_topk.data() : nullptr;
  a.sm_scale = s.sm_scale;
  a.out = out.data();
  a.max_logits = ml.data();
  a.lse = lse.data();
  ref::sparse_prefill(a);

  for (float v : dec_out) ASSERT_FALSE(std::isnan(v)) << "decode read a poisoned slot";
  EXPECT_TRUE(close(out, dec_out, 1e-12));
  EXPECT_TRUE(close(lse, dec_lse, 1e-12));
  // The all-invalid row (b=1, s=1) and, in the dynamic case, b=2 with topk_length 1.
  for (int h = 0; h < s.H; ++h) {
    EXPECT_EQ(dec_lse[size_t(1 * s.S_q + 1) * s.H + h], -kInf);
    EXPECT_EQ(ml[size_t(1 * s.S_q + 1) * s.H + h], -kInf);
  }
  // max_logits is the largest valid score, below lse and within log(#valid) of it.
  for (size_t r = 0; r < ml.size(); ++r) {
    if (lse[r] == -kInf) continue;
    EXPECT_LE(ml[r], lse[r] + 1e-6f);
    EXPECT_GE(ml[r], lse[r] - std::log(float(s.K)) - 1e-5f);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, PrefillMatchesDecode,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(ScaleMode::kPow2, ScaleMode::kAmax)));

// Entries past topk_length are never looked at: poisoning them changes no bit.
TEST(Decode, TailPastTopkLengthIsInert) {
  std::mt19937_64 rng(test::test_seed() + 7);
  DecodeSetup s(rng);
  std::vector<float> out0, lse0, out1, lse1;
  ref::sparse_decode(s.args(out0, lse0, true));
  std::uniform_int_distribution<int32_t> any;
  for (int b = 0; b < s.B; ++b)
    for (int sq = 0; sq < s.S_q; ++sq)
      for (int k = s.topk[b]; k < s.K; ++k) {
        const int32_t poison[] = {INT_MAX, -1, any(rng), 0};
        s.indices[(size_t(b) * s.S_q + sq) * s.K + k] = poison[k % 4];
      }
  ref::sparse_decode(s.args(out1, lse1, true));
  EXPECT_EQ(std::memcmp(out0.data(), out1.data(), out0.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse0.data(), lse1.data(), lse0.size() * 4), 0);
}

TEST(Decode, AttnSinkScalesOutOnly) {
  std::mt19937_64 rng(test::test_seed() + 11);
  DecodeSetup s(rng);
  std::vector<float> out0, lse0, out1, lse1;
  ref::sparse_decode(s.args(out0, lse0, false));
  std::vector<float> sink(s.H);
  for (int h = 0; h < s.H; ++h) sink[h] = h == 0 ? -kInf : 0.3f * h - 2.f;
  auto a = s.args(out1, lse1, false);
  a.attn_sink = sink.data();
  ref::sparse_decode(a);
  EXPECT_EQ(lse0, lse1);
  for (size_t r = 0; r < lse0.size(); ++r) {
    const int h = int(r % s.H);
    const double f = lse0[r] == -kInf ? 0.0 : 1.0 / (1.0 + std::exp(double(sink[h]) - lse0[r]));
    for (int c = 0; c < 512; ++c) {
      const double want = out0[r * 512 + c] * f;
      ASSERT_NEAR(out1[r * 512 + c], want, 1e-6 * std::max(1.0, std::fabs(want))) << r << " " << c;
    }
  }
}

// empty_lse_pos_inf (FlashMLA's convention): an empty row's lse is +inf; every other bit as without.
TEST(Decode, EmptyLsePosInfChangesOnlyEmptyRows) {
  std::mt19937_64 rng(test::test_seed() + 13);
  DecodeSetup s(rng);
  std::vector<float> out0, lse0, out1, lse1;
  ref::sparse_decode(s.args(out0, lse0, true));
  auto a = s.args(out1, lse1, true);
  a.empty_lse_pos_inf = true;
  ref::sparse_decode(a);
  EXPECT_EQ(std::memcmp(out0.data(), out1.data(), out0.size() * 4), 0);
  int empty = 0;
  for (size_t r = 0; r < lse0.size(); ++r) {
    if (lse0[r] == -kInf) {
      ++empty;
      EXPECT_EQ(lse1[r], kInf) << r;
    } else {
      EXPECT_EQ(std::memcmp(&lse0[r], &lse1[r], 4), 0) << r;
    }
  }
  EXPECT_GE(empty, s.H);  // the setup's all-invalid row
}

TEST(Decode, ThreadCountDoesNotChangeBits) {
  std::mt19937_64 rng(test::test_seed() + 3);
  DecodeSetup s(rng);
  std::vector<float> out0, lse0, out1, lse1;
  ref::SparseDecodeRefArgs a1 = s.args(out0, lse0, true), a3 = s.args(out1, lse1, true);
  a1.threads = 1;
  a3.threads = 3;
  ref::sparse_decode(a1);
  ref::sparse_decode(a3);
  EXPECT_EQ(std::memcmp(out0.data(), out1.data(), out0.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse0.data(), lse1.data(), lse0.size() * 4), 0);
}

// DESIGN §2: NaN is never an empty row. A NaN that reaches a row's softmax (an E4M3 NaN code or a
// NaN scale in a valid record: every head; a NaN in one head of q: that head) gives out = NaN and
// lse = NaN (prefill: max_logits too); every other row and head keeps its bits, and a row with no
// valid slot keeps out 0, lse -inf even when its q is NaN.
TEST(Decode, NanReachingSoftmaxGivesNanRowOthersUnchanged) {
  for (bool dynamic : {false, true}) {
    std::mt19937_64 rng(test::test_seed() + 17);
    DecodeSetup s(rng);
    std::vector<float> out0, lse0;
    ref::sparse_decode(s.args(out0, lse0, dynamic));
    const PagedKvCache view{s.cache.data(), s.num_blocks, s.page, int64_t(s.page) * 656, KvFormat::kDsMlaFp8};
    // Record NaNs: slot a (row 0, entry 1: valid in both modes) gets an E4M3 NaN byte, slot b
    // (a later valid entry of row 4) a NaN scale.
    const int32_t slot_a = s.indices[1];
    int32_t slot_b = -1;
    for (int k = 2; k < s.K && slot_b < 0; ++k) {
      const int32_t v = s.indices[size_t(4) * s.K + k];
      if (v >= 0 && v < s.num_slots() - 20 && v != slot_a) slot_b = v;
    }
    ASSERT_TRUE(slot_a >= 0 && slot_b >= 0);
    s.cache[size_t(view.slot_offset(slot_a)) + 300] = 0x7F;
    const float nan = std::nanf("");
    std::memcpy(s.cache.data() + view.slot_offset(slot_b) + 512 + 4 * 2, &nan, 4);
    // q NaN: row 2 (b=1, s=0), head 5 only; and in the all-invalid row (b=1, s=1), head 0.
    const int rows = s.B * s.S_q;
    s.q[(size_t(2) * s.H + 5) * 576 + 17] = 0x7FC0;
    s.q[(size_t(3) * s.H + 0) * 576 + 3] = 0x7FC0;
    std::vector<float> out1, lse1;
    ref::sparse_decode(s.args(out1, lse1, dynamic));
    for (int r = 0; r < rows; ++r) {
      const int b = r / s.S_q;
      const int limit = dynamic ? std::clamp(s.topk[b], 0, s.K) : s.K;
      bool record_nan = false;
      for (int k = 0; k < limit; ++k) {
        const int32_t v = s.indices[size_t(r) * s.K + k];
        record_nan |= v == slot_a || v == slot_b;
      }
      for (int h = 0; h < s.H; ++h) {
        const size_t i = size_t(r) * s.H + h;
        const bool want_nan = record_nan || (r == 2 && h == 5);
        if (want_nan) {
          EXPECT_TRUE(std::isnan(lse1[i])) << "row " << r << " head " << h << " dyn " << dynamic;
          for (int c = 0; c < 512; ++c) ASSERT_TRUE(std::isnan(out1[i * 512 + c])) << r << " " << h << " " << c;
        } else {
          EXPECT_EQ(std::memcmp(&lse0[i], &lse1[i], 4), 0) << "row " << r << " head " << h;
          EXPECT_EQ(std::memcmp(&out0[i * 512], &out1[i * 512], 512 * 4), 0) << "row " << r << " head " << h;
        }
      }
    }
    EXPECT_TRUE(std::isnan(lse1[0]));  // row 0 selects slot a in both modes
    EXPECT_EQ(lse1[size_t(3) * s.H], -kInf);  // all-invalid row: NaN q never reaches a softmax
    for (int c = 0; c < 512; ++c) EXPECT_EQ(out1[size_t(3) * s.H * 512 + c], 0.f);
  }
}

TEST(Prefill, NanReachingSoftmaxGivesNanStats) {
  const int D = 512, H = 4, T = 3, K = 2;
  std::mt19937_64 rng(test::test_seed() + 23);
  std::vector<uint16_t> q = test::randn_bf16(size_t(T) * H * D, 1.f, rng);
  std::vector<uint16_t> kv = test::randn_bf16(size_t(3) * D, 0.1f, rng);
  // Token 0 reads keys {0, 1}, token 1 keys {1, 2}, token 2 keys {0, -1}.
  const std::vector<int32_t> idx = {0, 1, 1, 2, 0, -1};
  auto run = [&](std::vector<float>& out, std::vector<float>& ml, std::vector<float>& lse) {
    out.assign(size_t(T) * H * 512, 0.f);
    ml.assign(size_t(T) * H, 0.f);
    lse.assign(size_t(T) * H, 0.f);
    ref::SparsePrefillRefArgs a;
    a.q = q.data(); a.T = T; a.H = H; a.d_qk = D;
    a.kv = kv.data(); a.num_kv = 3; a.indices = idx.data(); a.K = K;
    a.sm_scale = 0.1f;
    a.out = out.data(); a.max_logits = ml.data(); a.lse = lse.data();
    ref::sparse_prefill(a);
  };
  std::vector<float> out0, ml0, lse0, out1, ml1, lse1;
  run(out0, ml0, lse0);
  kv[size_t(2) * D + 100] = 0x7FC0;      // key 2: token 1 only
  q[(size_t(2) * H + 3) * D + 7] = 0xFFC0;  // token 2, head 3
  run(out1, ml1, lse1);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const size_t i = size_t(t) * H + h;
      if (t == 1 || (t == 2 && h == 3)) {
        EXPECT_TRUE(std::isnan(lse1[i]) && std::isnan(ml1[i])) << t << " " << h;
        for (int c = 0; c < 512; ++c) ASSERT_TRUE(std::isnan(out1[i * 512 + c])) << t << " " << h;
      } else {
        EXPECT_EQ(std::memcmp(&lse0[i], &lse1[i], 4), 0) << t << " " << h;
        EXPECT_EQ(std::memcmp(&ml0[i], &ml1[i], 4), 0) << t << " " << h;
        EXPECT_EQ(std::memcmp(&out0[i * 512], &out1[i * 512], 512 * 4), 0) << t << " " << h;
      }
    }
}

TEST(AttentionArgs, RejectsBadParams) {
  std::vector<float> out, lse;
  std::mt19937_64 rng(5);
  DecodeSetup s(rng);
  auto a = s.args(out, lse, false);
  ASSERT_TRUE(ref::check_sparse_decode_args(a).ok());
  auto b = a;
  b.cache.format = KvFormat::kNopeFp8;
  EXPECT_EQ(ref::check_sparse_decode_args(b).code(), StatusCode::kInvalidArgument);
  b = a; b.q = nullptr;
  EXPECT_EQ(ref::check_sparse_decode_args(b).code(), StatusCode::kInvalidArgument);
  b = a; b.cache.page_size = 0;
  EXPECT_NE(ref::check_sparse_decode_args(b).message().find("page_size"), std::string::npos);
  b = a; b.K = -1;
  EXPECT_EQ(ref::check_sparse_decode_args(b).code(), StatusCode::kInvalidArgument);

  ref::SparsePrefillRefArgs p;
  p.T = 1; p.H = 1; p.d_qk = 256;
  EXPECT_NE(ref::check_sparse_prefill_args(p).message().find("d_qk"), std::string::npos);
  p.d_qk = 512;
  EXPECT_NE(ref::check_sparse_prefill_args(p).message().find("selkv::ref::sparse_prefill"),
            std::string::npos);  // q is null
}

}  // namespace
}  // namespace selkv

// The CPU decode's plan: one part, zeros except the clamped lengths snapshot.
TEST(OracleDecodePlan, OnePartPlanWithTheLengthsSnapshot) {
  const int32_t lens[3] = {-5, 70, 1000};
  selkv::DecodeShape shape{3, 2, 64, 128, lens, 0};
  const size_t ints = size_t(selkv::decode::md_ints(6, 3));
  std::vector<int32_t> buf(ints + 4, 7);
  selkv::DecodeMetadata md;
  ASSERT_TRUE(selkv::ref::make_decode_metadata(shape, buf.data(), buf.size() * 4, &md).ok());
  EXPECT_TRUE(md.valid);
  EXPECT_EQ(md.num_sm_parts, 1);
  EXPECT_EQ(md.min_blocks_per_part, 1);
  const int32_t* snap = buf.data() + selkv::decode::md_lengths_offset(6);
  EXPECT_EQ(snap[0], 0);
  EXPECT_EQ(snap[1], 70);
  EXPECT_EQ(snap[2], 128);
  for (size_t i = 0; i < buf.size(); ++i)
    if (buf.data() + i < snap || buf.data() + i >= snap + 3) EXPECT_EQ(buf[i], 0) << i;
  // too small a buffer names it and states the size; zero rows need none
  const selkv::Status s = selkv::ref::make_decode_metadata(shape, buf.data(), 16, &md);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("buffer: needs"), std::string::npos) << s.to_string();
  EXPECT_FALSE(md.valid);
  selkv::DecodeShape empty{0, 2, 64, 128, nullptr, 0};
  EXPECT_TRUE(selkv::ref::make_decode_metadata(empty, nullptr, 0, &md).ok());
}
