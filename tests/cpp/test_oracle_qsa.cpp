// C8 QSA oracle (ref::qsa_sparse_prefill) and the page-4 group plan reference (ref::qsa_group_plan,
// ref::qsa_plan) against hand-computed cases. Most cases use K = 0 (every score 0, a uniform softmax), so out is the plain
// mean of the V rows the row may use and lse = log(count): which tokens are used shows directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa_test_util.h"
#include "reference/oracle.h"

namespace {

using namespace selkv;
using qsa_test::Problem;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// V of token slot (page, slot) of every head and dim = value(page, slot); K = 0.
float tag(int64_t page, int64_t slot) { return float(page * 64 + slot % 64) * 0.25f; }
void tag_v(Problem& pr) {
  for (int64_t pg = 0; pg < pr.pages; ++pg)
    for (int64_t s = 0; s < pr.P; ++s)
      for (int h = 0; h < pr.Hkv; ++h) {
        uint16_t* v = pr.vptr(pg, s, h);
        for (int d = 0; d < pr.D; ++d) v[d] = pr.h(tag(pg, s) + float(h) * 100.f);
      }
}

// The uniform-softmax expectation of row r, head h: mean of V over the given (page, slot) list.
void expect_mean(const Problem& pr, int64_t r, int h, const std::vector<std::pair<int, int>>& used) {
  const int kvh = h / (pr.Hq / pr.Hkv);
  const float* lse = pr.lse.data() + r * pr.Hq + h;
  const uint16_t* o = pr.out.data() + (r * pr.Hq + h) * pr.D;
  if (used.empty()) {
    EXPECT_EQ(*lse, kNegInf) << "row " << r << " head " << h;
    for (int d = 0; d < pr.D; ++d) ASSERT_EQ(o[d], 0) << "row " << r << " head " << h << " d " << d;  // exact +0
    return;
  }
  double sum = 0;
  for (auto [pg, s] : used) sum += pr.f(pr.h(tag(pg, s) + float(kvh) * 100.f));
  const uint16_t want = pr.h(float(sum / double(used.size())));
  EXPECT_FLOAT_EQ(*lse, float(std::log(double(used.size())))) << "row " << r << " head " << h;
  for (int d = 0; d < pr.D; ++d) ASSERT_EQ(o[d], want) << "row " << r << " head " << h << " d " << d;
}

std::vector<std::pair<int, int>> tokens_on(const std::vector<int32_t>& table, int P, std::vector<int64_t> toks) {
  std::vector<std::pair<int, int>> v;
  for (int64_t t : toks) v.push_back({table[size_t(t / P)], int(t % P)});
  return v;
}

// Both forms give the same result; returns after running the expanded one.
void run_both(Problem& pr) {
  pr.p.form = QsaSelectionForm::kCompact;
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p, 1).ok());
  const auto out_c = pr.out;
  const auto lse_c = pr.lse;
  pr.p.form = QsaSelectionForm::kExpanded;
  const Status st = ref::qsa_sparse_prefill(pr.p, 2);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(pr.out, out_c) << "expanded != compact";
  EXPECT_EQ(0, std::memcmp(pr.lse.data(), lse_c.data(), lse_c.size() * 4)) << "expanded != compact (lse)";
}

TEST(OracleQsa, PartialTailsZeroToThreeAndGqa) {
  Problem pr;
  pr.R = 4;
  pr.Hq = 4;
  pr.Hkv = 2;
  pr.build();
  pr.table = {2, 0, 3, 1};
  pr.lens[0] = 64;
  tag_v(pr);
  // Position 7: blocks {0, 1} complete, tail 8..7 empty; 8, 9, 10: tails of 1, 2, 3 tokens.
  for (int r = 0; r < 4; ++r) pr.select(r, 0, 7 + r, {1, 0});
  run_both(pr);
  for (int r = 0; r < 4; ++r) {
    std::vector<int64_t> toks = {4, 5, 6, 7, 0, 1, 2, 3};
    for (int t = 8; t <= 7 + r; ++t) toks.push_back(t);
    for (int h = 0; h < 4; ++h) expect_mean(pr, r, h, tokens_on(pr.table, pr.P, toks));  // kv head h / 2
    EXPECT_EQ(ref::qsa_row_entries(pr.p, r).size(), toks.size());
  }
}

TEST(OracleQsa, StalePositionsBadRequestsAndBadTableEntries) {
  Problem pr;
  pr.R = 7;
  pr.num_req = 2;
  pr.width = 3;
  pr.build();
  // Row stride 4 > width 3: the padding column holds real pages, and t / P >= width must not read it.
  pr.table = {1, -1, 2, 0,   // request 0: logical page 1 unmapped
              3, 4, 0, 2};   // request 1: logical page 1 -> page 4 = num_pages: out of range
  pr.p.block_table = pr.table.data();
  pr.p.block_table_stride = 4;
  pr.lens = {40, 64};
  tag_v(pr);
  pr.select(0, 0, 33, {1});          // seq 40 but the row is stale: fine, tokens < 40 all valid
  pr.select(1, 0, 45, {2, 9});       // tail 44, 45 past seq_len; block 2 (8..11) fine, block 9 (36..39) logical page 2
  pr.lens[0] = 38;                   // ... and now only 36, 37 of block 9 are live
  pr.select(2, 0, 20, {4, 1});       // block 4 = tokens 16..19 -> logical page 1 = -1: skipped
  pr.select(3, 1, 20, {4, 0});       // request 1: logical page 1 -> 4 (out of range): skipped; tail 20 too
  pr.select(4, -1, 9, {0, 1});       // bad request ids: inert
  pr.select(5, 2, 9, {0, 1});
  pr.select(6, 1, 9, {12, 13});      // t / P >= width (48.. / 16 = 3)
  run_both(pr);
  for (int h = 0; h < pr.Hq; ++h) {
    expect_mean(pr, 0, h, tokens_on(pr.table, 16, {4, 5, 6, 7, 32, 33}));
    expect_mean(pr, 1, h, tokens_on(pr.table, 16, {8, 9, 10, 11, 36, 37}));
    expect_mean(pr, 2, h, tokens_on(pr.table, 16, {4, 5, 6, 7}));
    expect_mean(pr, 3, h, {{3, 0}, {3, 1}, {3, 2}, {3, 3}});
    expect_mean(pr, 4, h, {});
    expect_mean(pr, 5, h, {});
    expect_mean(pr, 6, h, {{3, 8}, {3, 9}});  // only the tail 8, 9 of request 1
  }
}

TEST(OracleQsa, ExpandedEntriesAreEachOneTerm) {
  // The expanded form is read entry by entry: -1 and garbage columns are skipped, a repeated token
  // counts twice.
  Problem pr;
  pr.R = 1;
  pr.build();
  pr.lens[0] = 64;
  tag_v(pr);
  pr.p.form = QsaSelectionForm::kExpanded;
  int32_t* s = pr.sel.data();
  s[0] = 5;
  s[1] = -1;
  s[2] = 5;
  s[3] = 1 << 30;
  s[4] = std::numeric_limits<int32_t>::min();
  s[18] = 17;  // the last column
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
  expect_mean(pr, 0, 0, {{0, 5}, {0, 5}, {1, 1}});
}

TEST(OracleQsa, EmptyRowsAreExactZeroAndMinusInf) {
  Problem pr;
  pr.build();  // every selection -1, positions 0 (tail: token 0), lens 0: nothing is live
  std::mt19937_64 rng(1);
  pr.fill_random(rng);
  run_both(pr);
  for (int r = 0; r < pr.R; ++r)
    for (int h = 0; h < pr.Hq; ++h) {
      EXPECT_EQ(pr.lse[size_t(r * pr.Hq + h)], kNegInf);
      for (int d = 0; d < pr.D; ++d) EXPECT_EQ(pr.out[size_t((r * pr.Hq + h) * pr.D + d)], 0);
    }
}

// Independent fp64 attention over an explicit token list (random data, real scores).
void expect_attention(const Problem& pr, int64_t r, const std::vector<std::pair<int, int>>& used) {
  Problem& m = const_cast<Problem&>(pr);
  for (int h = 0; h < pr.Hq; ++h) {
    const int kvh = h / (pr.Hq / pr.Hkv);
    std::vector<double> s;
    for (auto [pg, sl] : used) {
      double dot = 0;
      const uint16_t* k = m.kptr(pg, sl, kvh);
      for (int d = 0; d < pr.D; ++d) dot += double(pr.f(pr.q[size_t((r * pr.Hq + h) * pr.D + d)])) * pr.f(k[d]);
      s.push_back(dot * double(pr.p.scale));
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double x : s) sum += std::exp(x - mx);
    EXPECT_NEAR(pr.lse[size_t(r * pr.Hq + h)], mx + std::log(sum), 1e-5);
    for (int d = 0; d < pr.D; ++d) {
      double o = 0;
      for (size_t i = 0; i < used.size(); ++i) o += std::exp(s[i] - mx) * pr.f(m.vptr(used[i].first, used[i].second, kvh)[d]);
      ASSERT_EQ(pr.out[size_t((r * pr.Hq + h) * pr.D + d)], pr.h(float(o / sum))) << "row " << r << " h " << h << " d " << d;
    }
  }
}

class OracleQsaPages : public ::testing::TestWithParam<std::tuple<int, QsaDtype, int>> {};

TEST_P(OracleQsaPages, InterleavedEqualsSeparateAndMatchesDirectAttention) {
  const auto [P, dtype, D] = GetParam();
  std::vector<uint16_t> outs[2];
  std::vector<float> lses[2];
  for (int il = 0; il < 2; ++il) {
    Problem pr;
    pr.dtype = dtype;
    pr.D = D;
    pr.P = P;
    pr.R = 3;
    pr.Hq = 6;
    pr.Hkv = 1;
    pr.pages = 5;
    pr.width = 4;
    pr.K = 8;
    pr.interleaved = il == 1;
    pr.build();
    pr.table = {3, 0, 4, 1};  // nonmonotonic
    pr.lens[0] = 3 * P + 6;
    std::mt19937_64 rng(42);
    pr.fill_random(rng);
    const int64_t last = 3 * P + 5;
    pr.select(0, 0, 10, {2, 0, 1});
    pr.select(1, 0, int32_t(last), {int32_t(P / 4), int32_t(3 * P / 4), 0, int32_t(last / 4) - 1});
    pr.select(2, 0, int32_t(P + 1), {int32_t(P / 4) - 1});
    run_both(pr);
    auto on = [&](std::vector<int64_t> t) { return tokens_on(pr.table, P, t); };
    expect_attention(pr, 0, on({8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
    std::vector<int64_t> t1;
    for (int64_t b : {int64_t(P / 4), int64_t(3 * P / 4), int64_t(0), last / 4 - 1})
      for (int i = 0; i < 4; ++i) t1.push_back(4 * b + i);
    for (int64_t t = 4 * ((last + 1) / 4); t <= last; ++t) t1.push_back(t);
    expect_attention(pr, 1, on(t1));
    expect_attention(pr, 2, on({P - 4, P - 3, P - 2, P - 1, P, P + 1}));
    outs[il] = pr.out;
    lses[il] = pr.lse;
  }
  EXPECT_EQ(outs[0], outs[1]) << "interleaved != separate";
  EXPECT_EQ(0, std::memcmp(lses[0].data(), lses[1].data(), lses[0].size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Geometry, OracleQsaPages,
                         ::testing::Values(std::make_tuple(16, QsaDtype::kFp16, 256), std::make_tuple(16, QsaDtype::kBf16, 128),
                                           std::make_tuple(784, QsaDtype::kFp16, 256), std::make_tuple(784, QsaDtype::kBf16, 128)));

TEST(OracleQsa, NanOutsideTheSelectionDoesNotLeakNanInsideDoes) {
  Problem pr;
  pr.Hq = 4;
  pr.Hkv = 2;
  pr.R = 2;
  pr.build();
  pr.lens[0] = 30;
  std::mt19937_64 rng(7);
  pr.fill_random(rng);
  pr.select(0, 0, 9, {1});   // tokens 4..7, 8, 9
  pr.select(1, 0, 13, {0});  // tokens 0..3, 12, 13
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
  const auto clean_out = pr.out;
  const auto clean_lse = pr.lse;
  // NaN in every unselected slot of K and V (pages 1..3 entirely, slots 10, 11, 14, 15 of page 0),
  // and in unselected tokens past seq_len that the table maps (page 1 = logical page 1).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t pg = 0; pg < pr.pages; ++pg)
    for (int64_t s = 0; s < pr.P; ++s) {
      const bool used = pg == 0 && s <= 13 && s != 10 && s != 11;
      if (used) continue;
      for (int h = 0; h < pr.Hkv; ++h)
        for (int d = 0; d < pr.D; ++d) pr.kptr(pg, s, h)[d] = pr.vptr(pg, s, h)[d] = pr.h(nan);
    }
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
  EXPECT_EQ(pr.out, clean_out);
  EXPECT_EQ(0, std::memcmp(pr.lse.data(), clean_lse.data(), clean_lse.size() * 4));
  // NaN in K of a selected token (row 0's token 9, kv head 1): heads 2, 3 of row 0 NaN (out, lse).
  pr.kptr(0, 9, 1)[5] = pr.h(nan);
  // NaN in V of a selected token of row 1 (token 12, kv head 0): out NaN, lse finite, heads 0, 1.
  pr.vptr(0, 12, 0)[3] = pr.h(nan);
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
  for (int r = 0; r < 2; ++r)
    for (int h = 0; h < 4; ++h) {
      const bool nan_row = r == 0 && h >= 2;       // K: the whole row / head, lse too
      const bool nan_d3 = r == 1 && h < 2;         // V: the dims the NaN sits in
      EXPECT_EQ(std::isnan(pr.lse[size_t(r * 4 + h)]), nan_row) << r << " " << h;
      for (int d = 0; d < pr.D; ++d) {
        const float o = pr.f(pr.out[size_t((r * 4 + h) * pr.D + d)]);
        if (nan_row || (nan_d3 && d == 3)) {
          ASSERT_TRUE(std::isnan(o)) << r << " " << h << " " << d;
        } else {
          ASSERT_EQ(pr.out[size_t((r * 4 + h) * pr.D + d)], clean_out[size_t((r * 4 + h) * pr.D + d)]);
        }
      }
    }
  // NaN in q of one head: that head only.
  pr.vptr(0, 12, 0)[3] = 0;
  pr.kptr(0, 9, 1)[5] = 0;
  pr.q[size_t((1 * 4 + 3) * pr.D)] = pr.h(nan);
  ASSERT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
  for (int h = 0; h < 4; ++h) EXPECT_EQ(std::isnan(pr.lse[size_t(4 + h)]), h == 3);
}

TEST(OracleQsa, FullWidthSelection2051) {
  Problem pr;
  pr.R = 2;
  pr.K = 512;
  pr.P = 64;
  pr.pages = 40;
  pr.width = 40;
  pr.build();
  std::mt19937_64 rng(3);
  pr.fill_random(rng, 0.1f);
  pr.lens[0] = 2500;
  std::vector<int32_t> blocks;
  for (int b = 0; b < 512; ++b) blocks.push_back(511 - b);
  pr.select(0, 0, 2049, blocks);  // tail 2048, 2049
  pr.select(1, 0, 2050, blocks);  // tail 2048..2050: all 2051 columns used
  EXPECT_EQ(pr.sel[2 * 2051 - 1], 2050);
  run_both(pr);
  EXPECT_EQ(ref::qsa_row_entries(pr.p, 1).size(), 2051u);
  std::vector<std::pair<int, int>> used;
  for (auto e : ref::qsa_row_entries(pr.p, 1)) used.push_back({e.page, e.slot});
  expect_attention(pr, 1, used);
}

// ---- page-4 group plan (src/qsa/qsa_group_layout.h) ---------------------------------------------

// The hand example of the group plan's tests: 4 rows over 2 requests with a -1 table entry, a
// partially live block, a causal partial block and a bad request.
void plan_example(Problem& pr) {
  pr.R = 4;
  pr.num_req = 2;
  pr.width = 4;
  pr.pages = 6;
  pr.K = 6;
  pr.build();
  pr.table = {3, 1, 5, -1,  // request 0
              2, 0, 4, 1};
  pr.lens = {60, 30};
  pr.select(0, 0, 42, {9, 1, 5, 0, 13});  // blocks 9 (page 5, slot 4), 1 (3, 4), 5 (1, 4), 0 (3, 0), 13 (table -1)
  pr.select(1, 0, 50, {12, 14});          // logical page 3 = -1: both dropped; tail 48..50 (page -1) dropped
  pr.select(2, 1, 29, {7, 6});            // request 1, len 30: tail 28, 29; block 7 = 28..31 partially live
  pr.select(3, 5, 9, {0, 1});             // bad request: empty
}


struct GroupBlock {
  int32_t page, base;
  uint32_t w[4];
};

// Group g of a group plan: its blocks, and its {first, count, bad} entry.
std::vector<GroupBlock> group_blocks(const std::vector<int32_t>& gp, int64_t R, int64_t K, int64_t g, int32_t* bad) {
  const int32_t* ge = gp.data() + qsa::group_table_offset() + 4 * g;
  *bad = ge[2];
  std::vector<GroupBlock> out;
  for (int32_t i = 0; i < ge[1]; ++i) {
    GroupBlock b;
    b.page = gp[size_t(qsa::group_blocks_offset(R) + 2 * (ge[0] + i))];
    b.base = gp[size_t(qsa::group_blocks_offset(R) + 2 * (ge[0] + i) + 1)];
    for (int t = 0; t < 4; ++t) b.w[t] = uint32_t(gp[size_t(qsa::group_tokw_offset(R, K) + 4 * (ge[0] + i) + t)]);
    out.push_back(b);
  }
  return out;
}

// ---- the public plan (qsa_plan) ----------------------------------------------------------------

// A row whose expanded selection is not made of 4-token blocks: one of its 4-column groups holds
// valid tokens of two blocks, or a valid token twice (compact selections are blocks by construction).
bool irregular_row(const Problem& pr, int64_t r) {
  if (pr.p.form != QsaSelectionForm::kExpanded) return false;
  std::set<int64_t> valid;
  for (const auto& e : ref::qsa_row_entries(pr.p, r)) valid.insert(e.token);
  const int64_t cols = qsa_expanded_cols(pr.K);
  for (int64_t c0 = 0; c0 < cols; c0 += 4) {
    std::vector<int64_t> toks;
    for (int64_t c = c0; c < std::min<int64_t>(c0 + 4, cols); ++c) {
      const int64_t t = pr.sel[size_t(r * cols + c)];
      if (valid.count(t)) toks.push_back(t);
    }
    for (size_t i = 1; i < toks.size(); ++i)
      if (toks[i] / 4 != toks[0] / 4) return true;
    std::sort(toks.begin(), toks.end());
    if (std::adjacent_find(toks.begin(), toks.end()) != toks.end()) return true;
  }
  return false;
}

std::vector<int32_t> make_plan(Problem& pr) {
  std::vector<int32_t> md(qsa_metadata_size(pr.R, pr.K) / 4, 0x55555555);
  const Status st = ref::qsa_plan(pr.p, md.data(), md.size() * 4);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return md;
}

// The public plan is the group plan of the page-4 route's grouping (qsa_page4_max_rows of Hq /
// Hkv) with groups that share too little handed over, every word of qsa_metadata_size written.
TEST(OracleQsaPlan, IsTheGroupPlanOfTheRouteGrouping) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> u(0, 1 << 20);
  for (auto [hq, hkv] : {std::pair{6, 1}, std::pair{16, 2}, std::pair{8, 8}, std::pair{4, 4}}) {
    Problem pr;
    pr.R = 70;
    pr.Hq = hq;
    pr.Hkv = hkv;
    pr.num_req = 2;
    pr.width = 6;
    pr.pages = 9;
    pr.K = 12;
    pr.build();
    pr.lens = {90, 40};
    for (int64_t r = 0; r < pr.R; ++r) {
      std::vector<int32_t> blocks;
      for (int i = u(rng) % (pr.K + 1); i > 0; --i) blocks.push_back(u(rng) % 24);
      pr.select(r, u(rng) % 3, u(rng) % 100, blocks);
    }
    for (auto form : {QsaSelectionForm::kExpanded, QsaSelectionForm::kCompact}) {
      pr.p.form = form;
      const auto md = make_plan(pr);
      const auto gp = ref::qsa_group_plan(pr.p, qsa::qsa_page4_max_rows(hq / hkv), /*hand_over=*/true);
      ASSERT_EQ(md.size(), gp.size());
      EXPECT_EQ(md, gp) << "Hq " << hq << " Hkv " << hkv;
      EXPECT_EQ(md[3], qsa::qsa_page4_max_rows(hq / hkv));
    }
  }
}

// Rows whose expanded selection is not made of 4-token blocks are bad rows of the plan (no token
// bits; the fix-up pass computes them); holes and any order within a block are fine.
TEST(OracleQsaPlan, IrregularExpandedRowsAreBad) {
  Problem pr;
  pr.R = 3;
  pr.build();
  pr.lens[0] = 64;
  pr.p.form = QsaSelectionForm::kExpanded;
  int32_t* s = pr.sel.data();
  const int64_t cols = qsa_expanded_cols(pr.K);
  s[0] = 4, s[1] = 5, s[2] = 9;                                   // row 0: one group spans blocks 1 and 2
  s[cols + 0] = 4, s[cols + 1] = 4;                               // row 1: a repeated token in one group
  s[2 * cols + 0] = 6, s[2 * cols + 1] = -1, s[2 * cols + 2] = 4;  // row 2: block 1, tokens 6 and 4
  s[2 * cols + 4] = 0;                                            // and block 0, token 0
  pr.pos[2] = 30;  // causal partial block 7: not selected
  const auto md = ref::qsa_group_plan(pr.p, qsa::qsa_page4_max_rows(pr.Hq / pr.Hkv));
  EXPECT_TRUE(irregular_row(pr, 0));
  EXPECT_TRUE(irregular_row(pr, 1));
  EXPECT_FALSE(irregular_row(pr, 2));
  int32_t bad;
  const auto b = group_blocks(md, 3, pr.K, 0, &bad);
  EXPECT_EQ(bad, 3);  // rows 0 and 1
  ASSERT_EQ(b.size(), 2u);  // row 2's blocks 0 and 1, ascending logical order
  EXPECT_EQ(b[0].base, 0);
  EXPECT_EQ(b[1].base, 4);
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(b[0].w[t], t == 0 ? 4u : 0u) << t;
    EXPECT_EQ(b[1].w[t], t == 0 || t == 2 ? 4u : 0u) << t;
  }
}

// ---- the group plan itself ----

// hand_over (qsa_plan's rule): a group whose blocks' row uses are under kGroupSharingNum /
// kGroupSharingDen of its block count lists nothing and flags every row; one that shares enough
// is listed as without it. Rows 0-3 select the same 3 blocks (12 uses, 3 blocks), rows 4-7 3
// blocks each, all different (12 uses, 12 blocks); groups of 4.
TEST(OracleQsaGroupPlan, GroupsThatShareLittleAreHandedOver) {
  Problem pr;
  pr.R = 8;
  pr.num_req = 1;
  pr.width = 6;
  pr.pages = 6;
  pr.K = 3;
  pr.build();
  pr.lens = {96};
  for (int64_t r = 0; r < pr.R; ++r) {
    const int32_t b0 = r < 4 ? 0 : 3 * int32_t(r - 4);
    pr.select(r, 0, 95, {b0, b0 + 1, b0 + 2});
  }
  for (auto form : {QsaSelectionForm::kExpanded, QsaSelectionForm::kCompact}) {
    pr.p.form = form;
    const auto all = ref::qsa_group_plan(pr.p, 4);
    const auto route = ref::qsa_group_plan(pr.p, 4, /*hand_over=*/true);
    int32_t bad;
    // The causal partial block of position 95 is empty (96 tokens = 24 complete blocks).
    EXPECT_EQ(group_blocks(all, pr.R, pr.K, 0, &bad).size(), 3u);
    EXPECT_EQ(group_blocks(route, pr.R, pr.K, 0, &bad).size(), 3u);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(group_blocks(all, pr.R, pr.K, 1, &bad).size(), 12u);
    EXPECT_EQ(bad, 0);
    EXPECT_TRUE(group_blocks(route, pr.R, pr.K, 1, &bad).empty());
    EXPECT_EQ(bad, 0xF);
    // The handed-over group's room is all zero, as if it had listed nothing.
    for (int64_t k = 2 * (pr.K + 1) * 2; k < 2 * (pr.K + 1) * 4; ++k)
      EXPECT_EQ(route[size_t(qsa::group_blocks_offset(pr.R) + k)], 0) << k;
  }
}

// plan_example: row 0's blocks in ascending logical order (0, 1, 5, 9, then its causal partial block
// 10 with 3 tokens), row 1 with nothing valid, row 2 bad (block 7 selected, and its causal partial
// block is block 7 again), row 3 of a bad request (nothing valid, not bad).
TEST(OracleQsaGroupPlan, LogicalOrderPartialLastBadRows) {
  Problem pr;
  plan_example(pr);
  for (auto form : {QsaSelectionForm::kExpanded, QsaSelectionForm::kCompact}) {
    pr.p.form = form;
    const auto gp4 = ref::qsa_group_plan(pr.p, 4);
    ASSERT_EQ(int64_t(gp4.size()), qsa::group_plan_words(4, pr.K));
    EXPECT_EQ(std::vector<int32_t>(gp4.begin(), gp4.begin() + 8),
              (std::vector<int32_t>{qsa::kGroupMagic, 4, int32_t(pr.K), 4, 1, 0, 0, 0}));
    int32_t bad;
    const auto b = group_blocks(gp4, 4, pr.K, 0, &bad);
    EXPECT_EQ(bad, 4);
    const std::vector<std::tuple<int, int, uint32_t>> want = {
        {3, 0, 0xF}, {3, 4, 0xF}, {1, 4, 0xF}, {5, 4, 0xF}, {5, 8, 0x7}};
    ASSERT_EQ(b.size(), want.size());
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i].page, std::get<0>(want[i])) << i;
      EXPECT_EQ(b[i].base, std::get<1>(want[i])) << i;
      for (int t = 0; t < 4; ++t) EXPECT_EQ(b[i].w[t], (std::get<2>(want[i]) >> t) & 1u) << i << " token " << t;
    }
    const auto gp2 = ref::qsa_group_plan(pr.p, 2);
    EXPECT_EQ(gp2[4], 2);  // groups
    EXPECT_EQ(group_blocks(gp2, 4, pr.K, 0, &bad).size(), want.size());
    EXPECT_EQ(bad, 0);
    EXPECT_TRUE(group_blocks(gp2, 4, pr.K, 1, &bad).empty());
    EXPECT_EQ(bad, 1);
    EXPECT_EQ(gp2[size_t(qsa::group_table_offset() + 4)], 2 * int32_t(pr.K + 1));  // group 1's first block
  }
}

// Random selections (duplicates, out-of-range ids, stale positions, bad requests, clamped
// counts), every group size: a row is bad exactly when its expanded selection is irregular or its
// entries repeat a token (a block selected twice); every other row's tokens in the group plan are
// exactly the oracle's entries; no token bit belongs to a row outside the group or a bad row.
TEST(OracleQsaGroupPlan, CoversExactlyTheOracleEntries) {
  std::mt19937_64 rng(13);
  Problem pr;
  pr.R = 64;
  pr.num_req = 3;
  pr.width = 6;
  pr.pages = 9;
  pr.P = 16;
  pr.K = 24;
  pr.form = QsaSelectionForm::kCompact;
  pr.build();
  std::uniform_int_distribution<int> u(0, 1 << 20);
  for (auto& t : pr.table) t = u(rng) % 11 - 1;
  pr.lens = {70, 96, 5};
  for (int64_t r = 0; r < pr.R; ++r) {
    const int rq = (r / 3 + u(rng) % 2) % 4;  // runs of one request, some interleaving; 3 is bad
    const int32_t position = u(rng) % 110 - 3;
    std::vector<int32_t> blocks;
    const int nb = u(rng) % (pr.K + 1);
    for (int i = 0; i < nb; ++i) {
      const int32_t b = u(rng) % 30 - 2;
      // Mostly distinct blocks; now and then a block twice (the row is then bad).
      if (std::find(blocks.begin(), blocks.end(), b) == blocks.end() || u(rng) % 16 == 0) blocks.push_back(b);
    }
    pr.select(r, rq, position, blocks);
    if (u(rng) % 5 == 0) pr.counts[size_t(r)] = pr.K + 7;
  }
  int64_t bad_rows = 0, good_rows = 0;
  for (auto form : {QsaSelectionForm::kCompact, QsaSelectionForm::kExpanded}) {
    pr.p.form = form;
    for (int rpg : {1, 5, 7, 32}) {
      const auto gp = ref::qsa_group_plan(pr.p, rpg);
      const int64_t groups = (pr.R + rpg - 1) / rpg;
      ASSERT_EQ(gp[3], rpg);
      ASSERT_EQ(gp[4], groups);
      for (int64_t g = 0; g < groups; ++g) {
        int32_t bad;
        const auto blocks = group_blocks(gp, pr.R, pr.K, g, &bad);
        const int rows = int(std::min<int64_t>(rpg, pr.R - g * rpg));
        ASSERT_EQ(gp[size_t(qsa::group_table_offset() + 4 * g)], g * rpg * (pr.K + 1));
        ASSERT_LE(int64_t(blocks.size()), rows * (pr.K + 1));
        for (const auto& b : blocks) {
          uint32_t any = 0;
          for (int t = 0; t < 4; ++t) any |= b.w[t];
          ASSERT_NE(any, 0u) << "group " << g;
          ASSERT_EQ(any & (uint32_t(bad) | ~((rows == 32 ? 0u : 1u << rows) - 1u)), 0u) << "group " << g;
          ASSERT_EQ(b.base % 4, 0);
        }
        for (int j = 0; j < rows; ++j) {
          const int64_t r = g * rpg + j;
          std::vector<std::pair<int, int>> got, want;
          std::vector<int64_t> tokens;  // logical: two blocks on one physical page are two blocks
          for (const auto& b : blocks)
            for (int t = 0; t < 4; ++t)
              if (b.w[t] >> j & 1u) got.push_back({b.page, b.base + t});
          for (auto e : ref::qsa_row_entries(pr.p, r)) {
            want.push_back({e.page, e.slot});
            tokens.push_back(e.token);
          }
          std::sort(got.begin(), got.end());
          std::sort(want.begin(), want.end());
          std::sort(tokens.begin(), tokens.end());
          const bool repeats = std::adjacent_find(tokens.begin(), tokens.end()) != tokens.end();
          const bool expect_bad = irregular_row(pr, r) || repeats;
          ASSERT_EQ((bad >> j & 1) != 0, expect_bad) << "row " << r << " rpg " << rpg;
          if (expect_bad) {
            ASSERT_TRUE(got.empty()) << "row " << r;
            ++bad_rows;
          } else {
            ASSERT_EQ(got, want) << "row " << r << " rpg " << rpg;
            ++good_rows;
          }
        }
      }
    }
  }
  EXPECT_GT(bad_rows, 0);
  EXPECT_GT(good_rows, 2 * bad_rows);
}

}  // namespace
