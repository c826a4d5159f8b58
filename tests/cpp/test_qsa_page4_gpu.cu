// C8 SM90 page-4 kernel (qsa::qsa_sparse_prefill_page4: the page-4 kernel over the GPU plan, then
// the simple kernel's fix-up pass) against the fp64 oracle with DESIGN §5 tolerances and against
// the exact simple kernel, on the generator of qsa_gpu_util.h (every garbage class, NaN in every
// cache slot no valid entry uses). Also: rows grouped 1..max per CTA, overlapping and duplicated
// selections, rows the page-4 kernel must hand to the fix-up (irregular rows, a plan of another
// call, out-of-range plan entries and counts, a NaN V only another row of the group selected),
// groups split between CTAs (with a workspace) and whole groups a CTA (without), graph replay,
// and Qwen's shape at 4096 rows.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_group_plan.h"
#include "qsa/qsa_page4.h"
#include "qsa_gpu_util.h"
#include "qsa_test_util.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"
#include "test_util.h"

namespace {

using namespace selkv;
using namespace qsa_gpu_test;
using qsa_test::Problem;
using test::DevBuf;

// Rows one page-4 CTA groups for rows_per_cta (0: the default of the call's Hq / Hkv).
int group_rows(const QsaSparsePrefillParams& p, int rows_per_cta) {
  return rows_per_cta != 0 ? rows_per_cta : qsa::qsa_page4_max_rows(p.num_q_heads / p.num_kv_heads);
}

// The GPU group plan of dp's selection in `form` for the page-4 route's grouping (hand_over: the
// route's rule for groups that share too little; without it every group is listed).
std::unique_ptr<DevBuf> gpu_plan(const DeviceProblem& dp, QsaSelectionForm form, size_t* bytes, int rows_per_cta = 0,
                                 bool hand_over = false) {
  QsaSparsePrefillParams p = dp.p;
  p.form = form;
  *bytes = size_t(qsa::group_plan_words(p.num_rows, p.max_blocks)) * 4;
  auto md = std::make_unique<DevBuf>(*bytes);
  const Status st = qsa::qsa_group_plan(p, group_rows(p, rows_per_cta), md->ptr, *bytes, nullptr, hand_over);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return md;
}

// Groups of dp's expanded-form GPU plan with the route's rule that list blocks.
int64_t listed_groups(const DeviceProblem& dp) {
  size_t bytes = 0;
  const auto md = gpu_plan(dp, QsaSelectionForm::kExpanded, &bytes, 0, /*hand_over=*/true);
  if (!test::sync_or_abort(nullptr, "listed_groups")) return 0;
  const std::vector<int32_t> plan = test::down<int32_t>(*md, bytes / 4);
  const int64_t groups = plan[4];
  int64_t n = 0;
  for (int64_t g = 0; g < groups; ++g) n += plan[size_t(qsa::group_table_offset() + 4 * g + 1)] > 0 ? 1 : 0;
  return n;
}

// The page-4 route on dp in `form`, over `md` (null: a fresh GPU group plan of the same form and
// grouping). split: with a workspace (every SM an equal share of the tiles, groups split between
// CTAs); without one every CTA takes whole groups.
Result run_page4(DeviceProblem& dp, const Problem& pr, QsaSelectionForm form, const std::string& what,
                 int rows_per_cta = 0, const DevBuf* md = nullptr, bool split = true) {
  size_t bytes = 0;
  std::unique_ptr<DevBuf> own;
  if (md == nullptr) {
    own = gpu_plan(dp, form, &bytes, rows_per_cta);
    md = own.get();
  }
  std::unique_ptr<DevBuf> ws;
  if (split) {
    ws = std::make_unique<DevBuf>(qsa_workspace_size(dp.p.head_dim));
    EXPECT_EQ(cudaMemset(ws->ptr, 0xA5, ws->bytes), cudaSuccess);  // no initial contents are needed
  }
  return run_gpu_with(dp, pr, form, what, [&](QsaSparsePrefillParams p) {
    p.metadata = md->ptr;
    p.metadata_bytes = md->bytes;
    if (ws) {
      p.workspace = ws->ptr;
      p.workspace_bytes = ws->bytes;
    }
    return qsa::qsa_sparse_prefill_page4(p, nullptr, rows_per_cta);
  });
}

// Page-4 vs the oracle and vs the simple kernel; expanded == compact bit for bit (the same plan
// bytes); separate == interleaved bit for bit.
void check_page4_config(Config c, uint64_t seed) {
  const std::string what = c.name() + " seed " + std::to_string(seed);
  Result bits[2];
  for (int il = 0; il < 2; ++il) {
    c.interleaved = il == 1;
    std::mt19937_64 rng(seed);
    Problem pr = make_problem(c, rng);
    poison_unused(pr);
    DeviceProblem dp(pr);
    const std::string w = what + (il ? " interleaved" : " separate");
    pr.p.form = QsaSelectionForm::kExpanded;
    const Result ref = run_oracle(pr);
    const Result ge = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " page4 expanded");
    const Result gc = run_page4(dp, pr, QsaSelectionForm::kCompact, w + " page4 compact");
    const Result whole = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " page4 whole groups", 0, nullptr, false);
    const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, w + " simple", true);
    const int64_t empty = expect_close(pr, ge, ref, w + " page4 vs oracle");
    EXPECT_GT(empty, 0) << w << ": the problem should hold empty rows";
    expect_close(pr, ge, simple, w + " page4 vs simple");
    expect_close(pr, whole, ref, w + " page4 whole groups vs oracle");
    EXPECT_TRUE(test::bits_equal(ge.out, gc.out)) << w << ": expanded vs compact out";
    EXPECT_TRUE(test::bits_equal(ge.lse, gc.lse)) << w << ": expanded vs compact lse";
    bits[il] = ge;
  }
  EXPECT_TRUE(test::bits_equal(bits[0].out, bits[1].out)) << what << ": separate vs interleaved out";
  EXPECT_TRUE(test::bits_equal(bits[0].lse, bits[1].lse)) << what << ": separate vs interleaved lse";
}

TEST(QsaPage4Gpu, MatchesOracleAndSimpleAcrossDtypeHeadDimGroupAndPageSize) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(seed));
  for (QsaDtype dt : {QsaDtype::kFp16, QsaDtype::kBf16})
    for (int D : {256, 128})
      for (int G : {1, 2, 3, 6, 8}) {
        Config c;
        c.dtype = dt;
        c.D = D;
        c.G = G;
        c.Hkv = G >= 6 ? 1 : 2;
        c.P = (G % 2 == 0) ? 16 : 784;
        c.R = 40;  // more than one group of rows for every G
        check_page4_config(c, seed + uint64_t(G * 1000 + D + int(dt)));
      }
}

TEST(QsaPage4Gpu, LongSelectionsManyTiles) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 7;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  Config c;
  c.P = 784;
  c.K = 96;
  c.max_len = 1600;
  c.R = 40;
  c.G = 4;
  c.Hkv = 2;
  check_page4_config(c, seed);
  c.P = 16;
  c.dtype = QsaDtype::kBf16;
  check_page4_config(c, seed + 1);
}

// Neighbouring rows of one request select mostly the same blocks (what the grouping is for), some
// rows list a block twice (two softmax terms), rows of two requests share a group. Every
// rows_per_cta from 1 to the maximum gives the oracle's result.
TEST(QsaPage4Gpu, OverlappingAndDuplicatedSelectionsAnyRowsPerCta) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 29);
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (int G : {1, 6}) {
    Config c;
    c.G = G;
    c.Hkv = G == 1 ? 2 : 1;
    c.K = 64;
    c.R = 70;
    c.num_req = 2;
    c.max_len = 1200;
    Problem pr = make_problem(c, rng);
    // Rows 0..R-1: request r < 50 ? 0 : 1, consecutive positions; each row keeps ~90% of the
    // previous row's blocks (a random one replaced per row), and every 7th row lists a block twice.
    pr.lens[0] = pr.lens[1] = 1100;
    std::vector<int32_t> blocks;
    for (int64_t r = 0; r < pr.R; ++r) {
      const int rq = r < 50 ? 0 : 1;
      const int32_t pos = 900 + int32_t(r % 50);
      const int32_t complete = (pos + 1) / 4;
      if (blocks.empty() || r == 50) {
        blocks.clear();
        std::set<int32_t> s;
        while (int(s.size()) < c.K - 1) s.insert(int32_t(rng() % uint64_t(complete)));
        blocks.assign(s.begin(), s.end());
      } else {
        blocks[rng() % blocks.size()] = int32_t(rng() % uint64_t(complete));
      }
      std::vector<int32_t> sel = blocks;
      if (r % 7 == 3) sel.push_back(sel[sel.size() / 2]);  // a duplicate: counted twice
      std::shuffle(sel.begin(), sel.end(), rng);
      std::fill(pr.sel.begin() + r * qsa_expanded_cols(c.K), pr.sel.begin() + (r + 1) * qsa_expanded_cols(c.K), -1);
      std::fill(pr.ids.begin() + r * c.K, pr.ids.begin() + (r + 1) * c.K, -1);
      pr.select(r, rq, pos, sel);
    }
    poison_unused(pr);
    DeviceProblem dp(pr);
    const Result ref = run_oracle(pr);
    const int max_rows = qsa::qsa_page4_max_rows(G);
    for (int rows : {1, 2, 5, max_rows - 1, max_rows, 0}) {
      const std::string w = "G" + std::to_string(G) + " rows_per_cta " + std::to_string(rows);
      const Result g = run_page4(dp, pr, QsaSelectionForm::kCompact, w, rows);
      expect_close(pr, g, ref, w);
    }
  }
}

// Long contexts whose rows' blocks spread over thousands of block keys (a permuted block table over
// ~2500 pages: many merge windows, most of them sparse), and rows whose groups all keep 3 of their 4
// tokens (every entry a partial block, each block's token masks differ between rows).
TEST(QsaPage4Gpu, MergeWindowsAndPartialBlocks) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 37;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (int D : {256, 128})
    for (int G : {1, 6}) {
      Config c;
      c.D = D;
      c.G = G;
      c.Hkv = 1;
      c.P = 16;
      c.K = 256;
      c.num_req = 2;
      c.max_len = D == 256 ? 20000 : 6000;
      c.R = 40;
      std::mt19937_64 rng(seed + uint64_t(D + G));
      Problem pr = make_problem(c, rng);
      const int64_t cols = qsa_expanded_cols(c.K);
      // Rows of one request in a group select the group's first such row's complete blocks (their
      // own partial blocks kept), so the groups share enough to be listed (kGroupSharingNum).
      const int rows = qsa::qsa_page4_max_rows(G);
      for (int64_t r = 0; r < c.R; ++r)
        for (int64_t r0 = r - r % rows; r0 < r; ++r0)
          if (pr.req[size_t(r0)] == pr.req[size_t(r)]) {
            std::copy_n(pr.sel.begin() + r0 * cols, 4 * c.K, pr.sel.begin() + r * cols);
            break;
          }
      for (int64_t r = 8; r < 24; ++r)
        for (int k = 0; k < c.K; ++k) pr.sel[size_t(r * cols + 4 * k + 3)] = -1;
      poison_unused(pr);
      DeviceProblem dp(pr);
      pr.p.form = QsaSelectionForm::kExpanded;
      const std::string w = c.name();
      const Result ref = run_oracle(pr);
      const Result g = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " page4");
      const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, w + " simple", true);
      expect_close(pr, g, ref, w + " page4 vs oracle");
      expect_close(pr, g, simple, w + " page4 vs simple");
      expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, w + " plan");
      EXPECT_GT(listed_groups(dp), 0) << w << ": some groups should be listed";
    }
}

// A group whose rows share too little (row uses of its blocks under kGroupSharingNum /
// kGroupSharingDen times its block count) lists no block and flags every row: the fix-up pass (the simple kernel) serves it
// whole and exactly. Random 64-block selections of ~5000-block contexts (sharing ~1) beside one
// group whose rows all select the same blocks: the plan (GPU == CPU reference) lists that group
// alone; page-4 route == oracle and == the simple kernel.
TEST(QsaPage4Gpu, GroupsThatShareLittleGoToTheFixUpWhole) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 41;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (QsaDtype dt : {QsaDtype::kFp16, QsaDtype::kBf16}) {
    Config c;
    c.dtype = dt;
    c.D = 256;
    c.G = 6;
    c.Hkv = 1;
    c.P = 16;
    c.K = 64;
    c.num_req = 2;
    c.max_len = 20000;
    c.R = 40;
    std::mt19937_64 rng(seed + uint64_t(dt));
    Problem pr = make_problem(c, rng);
    const int64_t cols = qsa_expanded_cols(c.K);
    const int rows = qsa::qsa_page4_max_rows(c.G);
    // Group 1: the longest request's last position, K blocks spread over its context, the partial block.
    const int q = pr.lens[0] >= pr.lens[1] ? 0 : 1;
    const int32_t pos = pr.lens[size_t(q)] - 1, nblk = (pos + 1) / 4;
    ASSERT_GE(nblk, c.K) << "the generator's longest request should hold K blocks";
    for (int64_t r = rows; r < 2 * rows; ++r) {
      pr.req[size_t(r)] = q;
      pr.pos[size_t(r)] = pos;
      int32_t* row = pr.sel.data() + r * cols;
      for (int k = 0; k < c.K; ++k)
        for (int i = 0; i < 4; ++i) row[4 * k + i] = 4 * (k * (nblk / c.K)) + i;
      for (int i = 0; i < 3; ++i) row[4 * c.K + i] = 4 * nblk + i <= pos ? 4 * nblk + i : -1;
    }
    poison_unused(pr);
    DeviceProblem dp(pr);
    pr.p.form = QsaSelectionForm::kExpanded;
    const std::string w = c.name();
    expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, w + " plan");
    size_t bytes = 0;
    const auto md = gpu_plan(dp, QsaSelectionForm::kExpanded, &bytes, 0, /*hand_over=*/true);
    ASSERT_TRUE(test::sync_or_abort(nullptr, w));
    const std::vector<int32_t> plan = test::down<int32_t>(*md, bytes / 4);
    for (int64_t g = 0; g * rows < c.R; ++g) {
      const int32_t* ge = plan.data() + qsa::group_table_offset() + 4 * g;
      const int n = int(std::min<int64_t>(rows, c.R - g * rows));
      if (g == 1) {
        EXPECT_GT(ge[1], 0) << w << ": the sharing group is listed";
      } else {
        EXPECT_EQ(ge[1], 0) << w << ": group " << g << " shares too little to be listed";
        EXPECT_EQ(uint32_t(ge[2]), (1u << n) - 1u) << w << ": group " << g << " all rows to the fix-up";
      }
    }
    const Result ref = run_oracle(pr);
    const Result g4 = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " page4", 0, md.get());
    const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, w + " simple", true);
    expect_close(pr, g4, ref, w + " page4 vs oracle");
    expect_close(pr, g4, simple, w + " page4 vs simple");
  }
}

// Rows the page-4 kernel cannot serve go through the fix-up pass and stay exact: rows the group
// plan marks bad (irregular expanded groups), a group entry out of place or with a count out of
// range (every row of the group), a block outside the cache or the page (every row of the group),
// and a plan whose header names another call (every row).
TEST(QsaPage4Gpu, FlaggedRowsAreRecomputedExactly) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 31);
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  Config c;
  c.R = 100;  // 5 groups of 21 rows (G 3): groups 1-3 below exist and hold blocks
  c.G = 3;
  c.Hkv = 2;
  Problem pr = make_problem(c, rng);
  // Rows 1 and 2: irregular expanded groups (a repeated token; tokens of two blocks).
  const int64_t cols = qsa_expanded_cols(pr.K);
  for (int64_t r : {1, 2}) {
    pr.req[size_t(r)] = 1;
    pr.pos[size_t(r)] = 100;
    std::fill(pr.sel.begin() + r * cols, pr.sel.begin() + (r + 1) * cols, -1);
  }
  pr.lens[1] = std::max(pr.lens[1], 128);
  pr.table[size_t(pr.width + 0)] = 0;  // real pages under the tokens used below (P = 16)
  pr.table[size_t(pr.width + 2)] = 1;
  const int32_t irregular[2][8] = {{8, 9, 10, 10, 40, 41, 42, 43}, {8, 9, 12, 13, 40, 41, 42, 43}};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 8; ++i) pr.sel[size_t((r + 1) * cols + i)] = irregular[r][i];
  poison_unused(pr);
  DeviceProblem dp(pr);
  pr.p.form = QsaSelectionForm::kExpanded;
  const Result ref = run_oracle(pr);
  size_t bytes = 0;
  std::unique_ptr<DevBuf> md = gpu_plan(dp, QsaSelectionForm::kExpanded, &bytes);
  const std::vector<int32_t> plan = test::down<int32_t>(*md, bytes / 4);
  const int rows = group_rows(dp.p, 0);  // 21 for G 3: rows 1 and 2 are in group 0
  ASSERT_EQ(plan[size_t(qsa::group_table_offset() + 2)] & 6, 6) << "rows 1 and 2 bad";
  expect_close(pr, run_page4(dp, pr, QsaSelectionForm::kExpanded, "bad rows", 0, md.get()), ref, "bad rows");

  // Corrupted group entries and blocks, in groups 1-3 (groups with blocks).
  const int64_t groups = (pr.R + rows - 1) / rows;
  ASSERT_GE(groups, 4);
  for (int64_t g = 1; g < 4; ++g) ASSERT_GT(plan[size_t(qsa::group_table_offset() + 4 * g + 1)], 0) << g;
  std::vector<int32_t> bad = plan;
  const int64_t first2 = plan[size_t(qsa::group_table_offset() + 8)], first3 = plan[size_t(qsa::group_table_offset() + 12)];
  bad[size_t(qsa::group_table_offset() + 4 + 1)] = rows * int32_t(pr.K + 1) + 5;  // group 1: count past its room
  bad[size_t(qsa::group_blocks_offset(pr.R) + 2 * first2)] = int32_t(pr.pages) + 7;  // group 2: a page past the cache
  bad[size_t(qsa::group_blocks_offset(pr.R) + 2 * first3 + 1)] = pr.P;             // group 3: a slot past the page
  md->upload(bad);
  expect_close(pr, run_page4(dp, pr, QsaSelectionForm::kExpanded, "corrupted plan", 0, md.get()), ref,
               "corrupted plan");
  bad = plan;
  bad[size_t(qsa::group_table_offset() + 4)] += 1;  // group 1's first block out of place
  md->upload(bad);
  expect_close(pr, run_page4(dp, pr, QsaSelectionForm::kExpanded, "misplaced group", 0, md.get()), ref,
               "misplaced group");

  // A plan of another row count, or of another grouping: every row is recomputed by the fix-up.
  for (int word : {1, 3}) {
    bad = plan;
    bad[size_t(word)] += 1;
    md->upload(bad);
    expect_close(pr, run_page4(dp, pr, QsaSelectionForm::kExpanded, "foreign header", 0, md.get()), ref,
                 "foreign header " + std::to_string(word));
  }
}

// NaN in the V of a token only one row selected: that row's heads are NaN, the other rows of its
// group (which did not select the token) are exact. NaN in q or in a K: that pair / row only.
TEST(QsaPage4Gpu, NanStaysInTheRowThatSelectedIt) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 37);
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  Config c;
  c.R = 20;
  c.G = 2;
  c.Hkv = 1;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  // A token of row a that no other row uses.
  int64_t a = -1;
  ref::QsaEntry tok{};
  for (int64_t r = 0; r < pr.R && a < 0; ++r)
    for (const ref::QsaEntry& e : ref::qsa_row_entries(pr.p, r)) {
      bool shared = false;
      for (int64_t o = 0; o < pr.R && !shared; ++o)
        if (o != r)
          for (const ref::QsaEntry& f : ref::qsa_row_entries(pr.p, o))
            if (f.page == e.page && f.slot == e.slot) shared = true;
      if (!shared) {
        a = r;
        tok = e;
        break;
      }
    }
  ASSERT_GE(a, 0);
  const uint16_t nan = 0x7E00;
  pr.vptr(tok.page, tok.slot, 0)[3] = nan;
  int64_t b = -1;  // another row with entries: NaN in its q, head 1
  for (int64_t r = 0; r < pr.R && b < 0; ++r)
    if (r != a && !ref::qsa_row_entries(pr.p, r).empty()) b = r;
  ASSERT_GE(b, 0);
  pr.q[size_t((b * pr.Hq + 1) * pr.D + 9)] = nan;
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  EXPECT_TRUE(std::isnan(pr.f(ref.out[size_t(a * pr.Hq * pr.D + 3)])));
  EXPECT_TRUE(std::isnan(ref.lse[size_t(b * pr.Hq + 1)]));
  for (int rows : {0, 1}) {
    const std::string w = "nan rows_per_cta " + std::to_string(rows);
    Result g = run_page4(dp, pr, QsaSelectionForm::kExpanded, w, rows);
    ASSERT_EQ(g.out.size(), ref.out.size()) << w;
    // Row a: NaN exactly where the oracle has it (element 3 of its heads), then compared as a
    // whole with the NaN elements set aside.
    Result want = ref;
    for (int64_t i = a * pr.Hq * pr.D; i < (a + 1) * pr.Hq * pr.D; ++i) {
      EXPECT_EQ(std::isnan(pr.f(g.out[size_t(i)])), std::isnan(pr.f(want.out[size_t(i)]))) << w << " element " << i;
      if (std::isnan(pr.f(want.out[size_t(i)]))) g.out[size_t(i)] = want.out[size_t(i)] = 0;
    }
    expect_close(pr, g, want, w);
  }
}

TEST(QsaPage4Gpu, GraphReplayEqualsEagerBitwise) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 41);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.R = 64;
  c.K = 32;
  c.max_len = 400;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result eager = run_page4(dp, pr, QsaSelectionForm::kCompact, "eager");
  const size_t md_bytes = size_t(qsa::group_plan_words(pr.R, pr.K)) * 4;
  DevBuf md(md_bytes);
  QsaSparsePrefillParams p = dp.p;
  p.form = QsaSelectionForm::kCompact;
  p.metadata = md.ptr;
  p.metadata_bytes = md_bytes;
  DevBuf ws(qsa_workspace_size(p.head_dim));  // (allocated before the capture)
  p.workspace = ws.ptr;
  p.workspace_bytes = ws.bytes;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Cleared on `s` (non-blocking: a legacy-stream memset could land after the replays' writes).
  CUDA_OK(cudaMemsetAsync(dp.out->ptr, 0, dp.out->bytes, s));
  CUDA_OK(cudaMemsetAsync(dp.lse->ptr, 0, dp.lse->bytes, s));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status ps = qsa::qsa_group_plan(p, group_rows(p, 0), md.ptr, md_bytes, s);
  const Status as = qsa::qsa_sparse_prefill_page4(p, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(ps.ok()) << ps.to_string();
  ASSERT_TRUE(as.ok()) << as.to_string();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) {
    CUDA_OK(cudaGraphLaunch(exec, s));
    ASSERT_TRUE(test::sync_or_abort(s, "graph replay"));
    EXPECT_TRUE(test::bits_equal(test::down<uint16_t>(*dp.out, pr.out.size()), eager.out)) << "replay " << i;
    EXPECT_TRUE(test::bits_equal(test::down<float>(*dp.lse, pr.lse.size()), eager.lse)) << "replay " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// No lse pointer: the same out bits, lse untouched.
TEST(QsaPage4Gpu, WithoutLseSameOut) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 43);
  Config c;
  Problem pr = make_problem(c, rng);
  DeviceProblem dp(pr);
  size_t bytes = 0;
  std::unique_ptr<DevBuf> md = gpu_plan(dp, QsaSelectionForm::kExpanded, &bytes);
  const Result with = run_page4(dp, pr, QsaSelectionForm::kExpanded, "with lse", 0, md.get());
  dp.p.lse = nullptr;
  const Result without = run_page4(dp, pr, QsaSelectionForm::kExpanded, "without lse", 0, md.get());
  EXPECT_TRUE(test::bits_equal(without.out, with.out));
  ASSERT_FALSE(without.lse.empty());
  uint32_t w;
  std::memcpy(&w, &without.lse[0], 4);
  EXPECT_EQ(w, 0x55555555u) << "lse written although null";
}

// Groups split between CTAs (a workspace; far more CTAs than tiles at small R, so many shares are
// empty or one tile) merge in piece order: two runs give the same bits, and both agree with the
// oracle, as whole groups a CTA do, for one group up to many.
TEST(QsaPage4Gpu, SplitGroupsMergeDeterministically) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 53;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(seed));
  for (int R : {1, 7, 10, 64, 300}) {
    std::mt19937_64 rng(seed + uint64_t(R));
    Config c;
    c.G = 6;
    c.Hkv = 2;
    c.R = R;
    c.K = 64;
    c.max_len = 1200;
    Problem pr = make_problem(c, rng);
    poison_unused(pr);
    DeviceProblem dp(pr);
    const std::string w = "R " + std::to_string(R);
    const Result ref = run_oracle(pr);
    const Result a = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " split a");
    const Result b = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " split b");
    const Result whole = run_page4(dp, pr, QsaSelectionForm::kExpanded, w + " whole", 0, nullptr, false);
    expect_close(pr, a, ref, w + " split vs oracle");
    expect_close(pr, whole, ref, w + " whole vs oracle");
    EXPECT_TRUE(test::bits_equal(a.out, b.out)) << w << ": split out differs between runs";
    EXPECT_TRUE(test::bits_equal(a.lse, b.lse)) << w << ": split lse differs between runs";
  }
}

// Qwen's shape (Hq 6 / Hkv 1, D 256, page 16, K 512, interleaved K/V) at 4096 rows, most rows a
// full 512-block selection of their request's live blocks: page-4 vs the oracle and the simple kernel.
TEST(QsaPage4Gpu, QwenShape4096Rows) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  std::mt19937_64 rng(test::test_seed() + 47);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.K = 512;
  c.R = 4096;
  c.num_req = 4;
  c.max_len = 4096;
  c.interleaved = true;
  Problem pr = make_problem(c, rng);
  for (int64_t r = 0; r < pr.R; ++r) {
    if (r % 9 == 0) continue;  // keep the generator's garbage rows
    const int rq = int(r * c.num_req / pr.R);  // consecutive rows of one request, as in a prefill
    const int32_t pos = 2048 + int32_t(rng() % 2000);
    std::vector<int32_t> all((pos + 1) / 4);
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(all.size(), 512));
    std::fill(pr.sel.begin() + r * qsa_expanded_cols(c.K), pr.sel.begin() + (r + 1) * qsa_expanded_cols(c.K), -1);
    pr.select(r, rq, pos, all);
  }
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  const Result g = run_page4(dp, pr, QsaSelectionForm::kExpanded, "4096 page4");
  expect_close(pr, g, ref, "4096 rows, page4 vs oracle");
  const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 simple", true);
  expect_close(pr, g, simple, "4096 rows, page4 vs simple");
}

}  // namespace
