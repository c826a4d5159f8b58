// LSE merge oracle: merging per-shard attention equals attention over the union of the shards.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/oracle.h"
#include "test_util.h"

namespace selkv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct PrefillResult {
  std::vector<float> out, lse;
};

struct Problem {
  int T = 4, H = 8, D = 576, K = 96;
  int64_t num_kv = 300;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> indices;
  explicit Problem(std::mt19937_64& rng) {
    q = test::randn_bf16(size_t(T) * H * D, 1.f, rng);
    kv = test::randn_bf16(size_t(num_kv) * D, 0.1f, rng);
    std::uniform_int_distribution<int32_t> idx(0, int32_t(num_kv - 1));
    indices.resize(size_t(T) * K);
    for (auto& i : indices) i = idx(rng);
    for (size_t i = 0; i < indices.size(); i += 11) indices[i] = (i & 1) ? -1 : INT_MAX;
  }
  PrefillResult run(const std::vector<int32_t>& idx) const {
    PrefillResult r{std::vector<float>(size_t(T) * H * 512), std::vector<float>(size_t(T) * H)};
    ref::SparsePrefillRefArgs a;
    a.q = q.data();
    a.T = T;
    a.H = H;
    a.d_qk = D;
    a.kv = kv.data();
    a.num_kv = num_kv;
    a.indices = idx.data();
    a.K = K;
    a.sm_scale = float(std::pow(double(D), -0.55));
    a.out = r.out.data();
    a.lse = r.lse.data();
    ref::sparse_prefill(a);
    return r;
  }
  // Shard s keeps the entries k with shard_of(t, k) == s; the rest become -1.
  template <typename F>
  std::vector<PrefillResult> shards(int n, F shard_of) const {
    std::vector<PrefillResult> res;
    for (int s = 0; s < n; ++s) {
      std::vector<int32_t> idx(indices);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
          if (shard_of(t, k) != s) idx[size_t(t) * K + k] = -1;
      res.push_back(run(idx));
    }
    return res;
  }
};

PrefillResult merge(const std::vector<PrefillResult>& parts, int64_t rows) {
  std::vector<float> outs, lses;
  for (const auto& p : parts) {
    outs.insert(outs.end(), p.out.begin(), p.out.end());
    lses.insert(lses.end(), p.lse.begin(), p.lse.end());
  }
  PrefillResult r{std::vector<float>(rows * 512, std::nanf("")), std::vector<float>(rows, std::nanf(""))};
  EXPECT_TRUE(ref::check_lse_merge_args(outs.data(), lses.data(), int(parts.size()), rows, 512,
                                        r.out.data()).ok());
  ref::lse_merge(outs.data(), lses.data(), int(parts.size()), rows, 512, r.out.data(), r.lse.data());
  return r;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << i;
      continue;
    }
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), tol * std::max(1.0, std::fabs(double(want[i]))))
        << i << " got " << got[i] << " want " << want[i];
  }
}

class LseMergeShards : public ::testing::TestWithParam<int> {};

TEST_P(LseMergeShards, EqualsAttentionOverUnion) {
  const int n = GetParam();
  std::mt19937_64 rng(test::test_seed() + n);
  Problem p(rng);
  const auto full = p.run(p.indices);
  const int64_t rows = int64_t(p.T) * p.H;
  // Interleaved shards (k mod n) and contiguous chunks; in the chunked split, row 0's last shard
  // gets nothing valid (its lse is -inf and it must contribute nothing).
  for (int variant = 0; variant < 2; ++variant) {
    auto parts = variant == 0 ? p.shards(n, [&](int, int k) { return k % n; })
                              : p.shards(n, [&](int t, int k) {
                                  if (t == 0) return k < p.K / 2 ? 0 : (n > 1 ? n - 2 : 0);
                                  return k * n / p.K;
                                });
    if (variant == 1 && n > 1) {
      for (int h = 0; h < p.H; ++h) ASSERT_EQ(parts[n - 1].lse[h], -kInf);
    }
    const auto m = merge(parts, rows);
    expect_close(m.out, full.out, 2e-6);
    expect_close(m.lse, full.lse, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, LseMergeShards, ::testing::Values(1, 2, 3));

TEST(LseMerge, SingleShardIsIdentity) {
  std::mt19937_64 rng(test::test_seed());
  Problem p(rng);
  const auto full = p.run(p.indices);
  const auto m = merge({full}, int64_t(p.T) * p.H);
  EXPECT_EQ(m.out, full.out);
  EXPECT_EQ(m.lse, full.lse);
}

TEST(LseMerge, SpecialRows) {
  const float nan = std::nanf("");
  // 3 shards x 5 rows x dim 2. Row 0: all -inf; row 1: one finite shard; row 2: +inf in shard 1
  // and 2; row 3: a NaN lse; row 4: -inf shard carrying NaN out, must not leak.
  const std::vector<float> lses = {-kInf, -kInf, 0.f,  1.f, -kInf,
                                   -kInf, 2.f,   kInf, 1.f, 0.f,
                                   -kInf, -kInf, kInf, nan, std::log(3.f)};
  std::vector<float> outs(3 * 5 * 2);
  for (size_t i = 0; i < outs.size(); ++i) outs[i] = float(i);
  outs[(0 * 5 + 4) * 2] = nan;
  outs[(0 * 5 + 4) * 2 + 1] = nan;
  std::vector<float> out(10, -99.f), lse(5, -99.f);
  ref::lse_merge(outs.data(), lses.data(), 3, 5, 2, out.data(), lse.data());
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], 0.f);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(out[2], outs[(1 * 5 + 1) * 2]);
  EXPECT_EQ(out[3], outs[(1 * 5 + 1) * 2 + 1]);
  EXPECT_EQ(lse[1], 2.f);
  EXPECT_EQ(out[4], outs[(1 * 5 + 2) * 2]);  // first +inf shard wins
  EXPECT_EQ(out[5], outs[(1 * 5 + 2) * 2 + 1]);
  EXPECT_EQ(lse[2], kInf);
  EXPECT_TRUE(std::isnan(out[6]) && std::isnan(out[7]) && std::isnan(lse[3]));
  // Row 4: shards 1 (lse 0, weight 1) and 2 (lse log 3, weight 3).
  EXPECT_FLOAT_EQ(out[8], (outs[(1 * 5 + 4) * 2] + 3 * outs[(2 * 5 + 4) * 2]) / 4);
  EXPECT_FLOAT_EQ(out[9], (outs[(1 * 5 + 4) * 2 + 1] + 3 * outs[(2 * 5 + 4) * 2 + 1]) / 4);
  EXPECT_FLOAT_EQ(lse[4], std::log(4.f));
}

TEST(LseMerge, PosInfIsEmptyFlag) {
  // 2 shards x 3 rows x dim 2. Row 0: +inf and finite; row 1: +inf and -inf; row 2: +inf, NaN.
  const float nan = std::nanf("");
  const std::vector<float> lses = {kInf, kInf, kInf, 1.f, -kInf, nan};
  std::vector<float> outs = {nan, nan, 7.f, 8.f, 9.f, 10.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<float> out(6, -99.f), lse(3, -99.f);
  ref::lse_merge(outs.data(), lses.data(), 2, 3, 2, out.data(), lse.data(), /*pos_inf_is_empty=*/true);
  EXPECT_EQ(out[0], 1.f);  // the +inf shard (NaN out) is skipped: shard 1 alone
  EXPECT_EQ(out[1], 2.f);
  EXPECT_EQ(lse[0], 1.f);
  EXPECT_EQ(out[2], 0.f);  // both empty
  EXPECT_EQ(out[3], 0.f);
  EXPECT_EQ(lse[1], -kInf);
  EXPECT_TRUE(std::isnan(out[4]) && std::isnan(out[5]) && std::isnan(lse[2]));  // NaN stays
  // Default: +inf wins.
  ref::lse_merge(outs.data(), lses.data(), 2, 3, 2, out.data(), lse.data());
  EXPECT_TRUE(std::isnan(out[0]));  // the first +inf shard's out, copied
  EXPECT_EQ(lse[0], kInf);
  EXPECT_EQ(out[2], 7.f);
  EXPECT_EQ(out[3], 8.f);
  EXPECT_EQ(lse[1], kInf);
  EXPECT_TRUE(std::isnan(lse[2]));
}

TEST(LseMerge, RejectsBadParams) {
  std::vector<float> x(4);
  EXPECT_EQ(ref::check_lse_merge_args(x.data(), x.data(), 0, 1, 2, x.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ref::check_lse_merge_args(x.data(), nullptr, 1, 1, 2, x.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ref::check_lse_merge_args(x.data(), x.data(), 1, -1, 2, x.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ref::check_lse_merge_args(nullptr, nullptr, 1, 0, 2, nullptr).ok());
}

}  // namespace
}  // namespace selkv
