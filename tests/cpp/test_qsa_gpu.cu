// C8 QSA sparse prefill on the GPU against the oracle (ref::qsa_sparse_prefill, fp64, on the same
// Params with host pointers) with DESIGN §5 tolerances, and the GPU plan (qsa_plan, the group
// plan) against its reference ref::qsa_plan byte for byte. Random problems carry every garbage class of DESIGN §2
// and selkv/qsa.h: bad request ids, stale positions past seq_len, blocks past the live length,
// negative / huge block ids, block-table entries -1 / num_pages / INT_MAX / INT_MIN, logical pages
// past the table width, non-monotonic tables, partial tails of 0-3 tokens and empty rows; every
// cache slot that no valid entry points at is NaN, so a stray read shows. Expanded and compact
// forms, separate and interleaved K/V give the same bits; graph replay equals eager bit for bit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_group_plan.h"
#include "qsa/qsa_simple.h"
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

// One Config end to end: the oracle (expanded, and compact equal to it), the GPU on both forms
// (equal bits, within tolerance), the plan of both forms, and (for the layout pair) separate and
// interleaved K/V equal bit for bit.
void check_config(Config c, uint64_t seed) {
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
    const Result ge = run_gpu(dp, pr, QsaSelectionForm::kExpanded, w + " expanded");
    const Result gc = run_gpu(dp, pr, QsaSelectionForm::kCompact, w + " compact");
    const int64_t empty = expect_close(pr, ge, ref, w + " expanded");
    EXPECT_GT(empty, 0) << w << ": the problem should hold empty rows";
    EXPECT_TRUE(test::bits_equal(ge.out, gc.out)) << w << ": expanded vs compact out";
    EXPECT_TRUE(test::bits_equal(ge.lse, gc.lse)) << w << ": expanded vs compact lse";
    if (il == 0) {
      expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, w + " plan expanded");
      expect_plan_equal(dp, pr, QsaSelectionForm::kCompact, w + " plan compact");
    }
    bits[il] = ge;
  }
  EXPECT_TRUE(test::bits_equal(bits[0].out, bits[1].out)) << what << ": separate vs interleaved out";
  EXPECT_TRUE(test::bits_equal(bits[0].lse, bits[1].lse)) << what << ": separate vs interleaved lse";
}

// Selections narrower and wider than kQsaSimpleWideMinBlocks (K = 16, 160). These small grids run
// 12 warps a CTA on an H200; SimpleChunkStreamsAcrossGridSizes and SimpleSkipsChunksWithoutTokens
// run the 2- and 4-warp CTAs.
TEST(QsaGpu, MatchesOracleAcrossDtypeHeadDimGroupAndPageSize) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(seed));
  for (int K : {16, 160})
    for (QsaDtype dt : {QsaDtype::kFp16, QsaDtype::kBf16})
      for (int D : {256, 128})
        for (int G : {1, 2, 6, 8}) {
          Config c;
          c.K = K;
          c.max_len = K == 16 ? c.max_len : 1600;
          c.dtype = dt;
          c.D = D;
          c.G = G;
          c.Hkv = G == 8 ? 1 : 2;
          c.P = (G % 2 == 0) ? 16 : 784;
          if (!test::full_grid() && !(G == 2 && D == 256)) continue;
          check_config(c, seed + uint64_t(G * 1000 + D + int(dt) + K));
        }
}

// The SIMT form (what bf16 takes below SM80, which the H200 never routes to) on Hopper through
// qsa_sparse_prefill_simt: against the oracle, both forms of the selection the same bits.
TEST(QsaGpu, SimtFormMatchesOracle) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 3;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (QsaDtype dt : {QsaDtype::kFp16, QsaDtype::kBf16})
    for (int D : {256, 128})
      for (int G : {1, 6}) {
        Config c;
        c.dtype = dt;
        c.D = D;
        c.G = G;
        c.K = 96;
        c.max_len = 1600;
        c.interleaved = G == 6;
        std::mt19937_64 rng(seed + uint64_t(D + G + int(dt)));
        Problem pr = make_problem(c, rng);
        poison_unused(pr);
        DeviceProblem dp(pr);
        const std::string w = c.name() + " SIMT";
        pr.p.form = QsaSelectionForm::kExpanded;
        const Result ref = run_oracle(pr);
        const auto simt = [](QsaSparsePrefillParams p) { return qsa::qsa_sparse_prefill_simt(p, nullptr); };
        const Result ge = run_gpu_with(dp, pr, QsaSelectionForm::kExpanded, w + " expanded", simt);
        const Result gc = run_gpu_with(dp, pr, QsaSelectionForm::kCompact, w + " compact", simt);
        EXPECT_GT(expect_close(pr, ge, ref, w + " expanded"), 0) << w << ": the problem should hold empty rows";
        EXPECT_TRUE(test::bits_equal(ge.out, gc.out)) << w << ": expanded vs compact out";
        EXPECT_TRUE(test::bits_equal(ge.lse, gc.lse)) << w << ": expanded vs compact lse";
      }
}

TEST(QsaGpu, PageSize784AndLongSelections) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 7;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (int K : {96, 160}) {  // below and above kQsaSimpleWideMinBlocks
    Config c;
    c.P = 784;
    c.K = K;
    c.max_len = 1600;
    c.R = 40;
    c.G = 4;
    c.Hkv = 2;
    check_config(c, seed + uint64_t(K));
    c.P = 16;
    c.dtype = QsaDtype::kBf16;
    check_config(c, seed + uint64_t(K) + 1);
  }
}

// The simple kernel's warp streams in every CTA size, which the launcher picks by the grid (rows x
// kv heads) against the SM count and by the selection's width: on an H200's 132 SMs 80 and 200 CTAs
// take 12 warps, 600 take 2 (K = 96 < kQsaSimpleWideMinBlocks) or 4 (K = 160). The selections are
// long enough that every warp has several chunks.
TEST(QsaGpu, SimpleChunkStreamsAcrossGridSizes) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 13;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  for (int32_t K : {96, 160})
    for (int64_t R : {40, 100, 300}) {
      Config c;
      c.K = K;
      c.max_len = 1600;
      c.R = R;
      c.G = 3;
      c.Hkv = 2;
      c.dtype = R == 100 || (R == 300 && K == 96) ? QsaDtype::kBf16 : QsaDtype::kFp16;  // both types in 2-warp CTAs
      check_config(c, seed + uint64_t(R) + uint64_t(K));
    }
}

// The simple kernel never walks a 16-column chunk without a non-negative token (a short selection's
// -1 padding). 2051-column rows with a few live blocks in scattered chunks (the first, the last
// partial one, random ones) and negative garbage (-1, -7, INT_MIN) everywhere else agree with the
// oracle, and give the same bits as the same rows with the garbage replaced by stale tokens (>=
// seq_len: those chunks are walked, nothing is read): skipping changes no bit. Every CTA size: 64
// rows run 12 warps a CTA, 600 run 4 (K = 512) or 2 (K = 64).
TEST(QsaGpu, SimpleSkipsChunksWithoutTokens) {
  SELKV_REQUIRE_GPU();
  for (int K : {512, 64})
  for (int64_t R : {64, 600}) {
    std::mt19937_64 rng(test::test_seed() + 31 + uint64_t(R) + uint64_t(K));
    Config c;
    c.K = K;
    c.R = R;
    c.G = 6;
    c.Hkv = 1;
    c.num_req = 2;
    c.max_len = 3000;
    Problem pr = make_problem(c, rng);
    const int64_t cols = qsa_expanded_cols(pr.K), chunks = (cols + 15) / 16;  // 16-column chunks
    const int32_t garbage[3] = {-1, -7, std::numeric_limits<int32_t>::min()};
    std::vector<int32_t> stale(pr.sel.size());
    for (int64_t r = 0; r < pr.R; ++r) {
      int32_t* row = pr.sel.data() + r * cols;
      for (int64_t i = 0; i < cols; ++i) {
        row[i] = garbage[i % 3];
        stale[size_t(r * cols + i)] = (1 << 30) + int32_t(i);
      }
      if (r % 7 == 3) continue;  // nothing selected
      const int64_t picks[4] = {0, chunks - 1, int64_t(rng() % uint64_t(chunks)), int64_t(rng() % uint64_t(chunks))};
      for (int64_t ch : picks) {
        if (r % 2 == 1 && ch == 0) continue;  // some rows start past chunk 0
        const int64_t first = ch * 16 + int64_t(rng() % 4) * 4;
        const int32_t b = int32_t(rng() % uint64_t(c.max_len / 4));
        for (int64_t k = 0; k < 4 && first + k < cols; ++k) row[first + k] = 4 * b + int32_t(k);
      }
      for (int64_t i = 0; i < cols; ++i)
        if (row[i] >= 0) stale[size_t(r * cols + i)] = row[i];
    }
    poison_unused(pr);
    const Result ref = run_oracle(pr);
    DeviceProblem dp(pr);
    const std::string what = "R " + std::to_string(R);
    const Result skip = run_gpu(dp, pr, QsaSelectionForm::kExpanded, what + " padded", true);
    expect_close(pr, skip, ref, what + " padded");
    std::copy(stale.begin(), stale.end(), pr.sel.begin());  // p.selection keeps pointing at it
    DeviceProblem dp_stale(pr);
    const Result walk = run_gpu(dp_stale, pr, QsaSelectionForm::kExpanded, what + " stale", true);
    EXPECT_TRUE(test::bits_equal(skip.out, walk.out)) << what << ": padded vs stale out";
    EXPECT_TRUE(test::bits_equal(skip.lse, walk.lse)) << what << ": padded vs stale lse";
  }
}

// Rows whose expanded groups are not 4-token blocks (a repeated token, tokens of two blocks): the
// plan flags them (counts = -1, byte-equal to the reference) and the attention stays exact.
TEST(QsaGpu, IrregularExpandedRowsStayExact) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 11);
  Config c;
  c.R = 8;
  c.num_req = 1;
  c.max_len = 128;
  Problem pr = make_problem(c, rng);
  for (int64_t r = 0; r < pr.R; ++r) {
    pr.req[size_t(r)] = 0;
    pr.pos[size_t(r)] = 100;
  }
  pr.lens[0] = 128;
  for (int w = 0; w < pr.width; ++w) pr.table[size_t(w)] = int32_t((w * 5 + 1) % pr.pages);
  const int64_t cols = qsa_expanded_cols(pr.K);
  int32_t* s0 = pr.sel.data();
  std::fill(s0, s0 + pr.R * cols, -1);
  const int32_t rows[4][8] = {{8, 9, 10, 10, 40, 41, 42, 43},     // repeated token
                              {8, 9, 12, 13, 40, 41, 42, 43},     // two blocks in one group
                              {40, 41, 42, 43, 8, 9, 10, 11},     // regular (sorted by the plan)
                              {3, -1, 77, 5000, 101, 100, 99, 98}};  // garbage, then a reversed group
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 8; ++i) s0[r * cols + i] = rows[r][i];
  for (int i = 0; i < 8; ++i) s0[4 * cols + i] = rows[2][i];  // row 4 shares row 2's blocks: the group is listed
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  const Result g = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "irregular");
  expect_close(pr, g, ref, "irregular");
  expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, "irregular plan");
  std::vector<int32_t> md(qsa_metadata_size(pr.R, pr.K) / 4);
  ASSERT_TRUE(ref::qsa_plan(pr.p, md.data(), md.size() * 4).ok());
  // Group 0 (all 8 rows): rows 0, 1 and 3 are bad (row 3's groups each span two blocks), rows 2, 4
  // and the empty rows 5-7 are not.
  EXPECT_EQ(md[size_t(qsa::group_table_offset() + 2)], 0x0B);
}

// NaN in q (one row) and in the K of one valid entry (another row): those rows / heads are NaN,
// out and lse; the other rows are unaffected.
TEST(QsaGpu, NanInQOrValidKMakesTheRowNan) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 13);
  Config c;
  c.R = 12;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  const uint16_t nan = 0x7E00;
  int64_t with_entries[2] = {-1, -1};
  for (int64_t r = 0, n = 0; r < pr.R && n < 2; ++r)
    if (!ref::qsa_row_entries(pr.p, r).empty()) with_entries[n++] = r;
  ASSERT_GE(with_entries[1], 0);
  pr.q[size_t((with_entries[0] * pr.Hq + 1) * pr.D + 5)] = nan;  // row a, head 1
  const ref::QsaEntry e = ref::qsa_row_entries(pr.p, with_entries[1]).front();
  pr.kptr(e.page, e.slot, 0)[7] = nan;  // every row using that token, heads of kv head 0
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  EXPECT_TRUE(std::isnan(ref.lse[size_t(with_entries[0] * pr.Hq + 1)]));
  EXPECT_TRUE(std::isnan(ref.lse[size_t(with_entries[1] * pr.Hq)]));
  const Result g = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "nan");
  expect_close(pr, g, ref, "nan");
}

TEST(QsaGpu, GraphReplayEqualsEagerBitwise) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 17);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.R = 64;
  c.K = 32;
  c.max_len = 400;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result eager = run_gpu(dp, pr, QsaSelectionForm::kCompact, "eager");
  const size_t md_bytes = qsa_metadata_size(pr.R, pr.K);
  DevBuf md(md_bytes);
  QsaSparsePrefillParams p = dp.p;
  p.form = QsaSelectionForm::kCompact;
  p.metadata = md.ptr;
  p.metadata_bytes = md_bytes;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Cleared on `s` (non-blocking: a legacy-stream memset could land after the replays' writes).
  CUDA_OK(cudaMemsetAsync(dp.out->ptr, 0, dp.out->bytes, s));
  CUDA_OK(cudaMemsetAsync(dp.lse->ptr, 0, dp.lse->bytes, s));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status ps = qsa_plan(p, md.ptr, md_bytes, s);
  const Status as = qsa_sparse_prefill(p, s);
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
  pr.p.form = QsaSelectionForm::kCompact;
  std::vector<int32_t> want(md_bytes / 4);
  ASSERT_TRUE(ref::qsa_plan(pr.p, want.data(), md_bytes).ok());
  EXPECT_TRUE(test::bits_equal(test::down<int32_t>(md, md_bytes / 4), want)) << "plan from the graph";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// No lse pointer: out alone, the same bits as with lse.
TEST(QsaGpu, WithoutLseSameOut) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 19);
  Config c;
  Problem pr = make_problem(c, rng);
  DeviceProblem dp(pr);
  const Result with = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "with lse");
  dp.p.lse = nullptr;
  CUDA_OK(cudaMemset(dp.lse->ptr, 0x55, dp.lse->bytes));
  CUDA_OK(cudaMemset(dp.out->ptr, 0x77, dp.out->bytes));
  ASSERT_TRUE(qsa_sparse_prefill(dp.p, nullptr).ok());
  ASSERT_TRUE(test::sync_or_abort(nullptr, "without lse"));
  EXPECT_TRUE(test::bits_equal(test::down<uint16_t>(*dp.out, pr.out.size()), with.out));
  const std::vector<float> l = test::down<float>(*dp.lse, pr.lse.size());
  uint32_t w;
  std::memcpy(&w, &l[0], 4);
  EXPECT_EQ(w, 0x55555555u) << "lse written although null";
}

// Qwen's shape at the route boundary: 4095 and 4096 rows (a plan given, so 4096 asks for the
// page-4 route), 512-block selections (2051 columns), Hq 6 / Hkv 1, D 256, page 16; default
// routing and force_simple agree with the oracle (and, both being exact, with each other).
TEST(QsaGpu, LargeBatchAtTheRouteBoundary) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  std::mt19937_64 rng(test::test_seed() + 23);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.K = 512;
  c.R = 4096;
  c.num_req = 4;
  c.max_len = 4096;
  Problem pr = make_problem(c, rng);
  // Most rows: a full 512-block selection of live blocks of the row's request.
  for (int64_t r = 0; r < pr.R; ++r) {
    if (r % 9 == 0) continue;  // keep the generator's garbage rows
    const int rq = int(r % c.num_req);
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
  const size_t md_bytes = qsa_metadata_size(pr.R, pr.K);
  DevBuf md(md_bytes);
  ASSERT_TRUE(qsa_plan(dp.p, md.ptr, md_bytes, nullptr).ok());
  dp.p.metadata = md.ptr;
  dp.p.metadata_bytes = md_bytes;
  EXPECT_TRUE(qsa_page4_wanted(dp.p) || std::getenv("SELKV_QSA_PAGE4") != nullptr);
  const Result def = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 default route");
  expect_close(pr, def, ref, "4096 rows, default route");
  // The route with a workspace (groups split between CTAs).
  DevBuf ws(qsa_workspace_size(pr.D));
  dp.p.workspace = ws.ptr;
  dp.p.workspace_bytes = ws.bytes;
  const Result split = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 default route, workspace");
  expect_close(pr, split, ref, "4096 rows, default route with a workspace");
  dp.p.workspace = nullptr;
  dp.p.workspace_bytes = 0;
  const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 force_simple", true);
  expect_close(pr, simple, ref, "4096 rows, force_simple");
  // 4095 rows: the same rows, the simple route (plan of the 4095-row call).
  dp.p.num_rows = 4095;
  const size_t md2_bytes = qsa_metadata_size(4095, pr.K);
  DevBuf md2(md2_bytes);
  ASSERT_TRUE(qsa_plan(dp.p, md2.ptr, md2_bytes, nullptr).ok());
  dp.p.metadata = md2.ptr;
  dp.p.metadata_bytes = md2_bytes;
  EXPECT_FALSE(qsa_page4_wanted(dp.p));
  const Result small = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4095 rows");
  expect_close(pr, small, ref, "4095 rows", 4095);
  expect_plan_equal(dp, pr, QsaSelectionForm::kCompact, "4095 rows plan (compact)");
}

// The group plan kernel against its CPU reference byte for byte (the buffer is filled with garbage
// first), both selection forms, group sizes 1..32, on the generator's garbage; long contexts (40000
// tokens: one window of more than 256 bitmap words, emitted in two passes; 140000: more than one
// 32768-block window, the bad-row pass first); and rows whose every group keeps 3 of its 4 tokens
// (the partial-block list overflows and the window is halved).
TEST(QsaGpu, GroupPlanMatchesReference) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 41;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  struct Shape {
    int max_len, K, P;
    bool partial;
  };
  for (const Shape sh : {Shape{200, 16, 16, false}, Shape{1600, 96, 784, false}, Shape{40000, 256, 16, false},
                         Shape{140000, 256, 16, false}, Shape{6000, 256, 16, true}}) {
    Config c;
    c.D = 128;
    c.Hkv = 1;
    c.G = 1;
    c.K = sh.K;
    c.P = sh.P;
    c.max_len = sh.max_len;
    c.R = 70;
    c.num_req = 3;
    std::mt19937_64 rng(seed + uint64_t(sh.max_len));
    Problem pr = make_problem(c, rng);
    if (sh.partial) {
      const int64_t cols = qsa_expanded_cols(c.K);
      for (int64_t r = 0; r < pr.R; ++r)
        for (int k = 0; k < c.K; ++k) pr.sel[size_t(r * cols + 4 * k + 3)] = -1;
    }
    DeviceProblem dp(pr);
    const size_t bytes = size_t(qsa::group_plan_words(pr.R, pr.K)) * 4;
    DevBuf gp(bytes);
    for (QsaSelectionForm form : {QsaSelectionForm::kExpanded, QsaSelectionForm::kCompact}) {
      if (sh.partial && form == QsaSelectionForm::kCompact) continue;  // the holes are in the expanded form
      for (int rpg : {1, 6, 10, 32})
        for (bool hand_over : {false, true}) {
          const std::string w = "len " + std::to_string(sh.max_len) + (sh.partial ? " partial" : "") +
                                (form == QsaSelectionForm::kCompact ? " compact" : " expanded") + " rpg " +
                                std::to_string(rpg) + (hand_over ? " hand_over" : "");
          QsaSparsePrefillParams p = dp.p;
          p.form = form;
          CUDA_OK(cudaMemset(gp.ptr, 0x55, bytes));
          const Status st = qsa::qsa_group_plan(p, rpg, gp.ptr, bytes, nullptr, hand_over);
          ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
          ASSERT_TRUE(test::sync_or_abort(nullptr, w.c_str()));
          pr.p.form = form;
          EXPECT_TRUE(test::bits_equal(test::down<int32_t>(gp, bytes / 4), ref::qsa_group_plan(pr.p, rpg, hand_over))) << w;
        }
    }
  }
}

}  // namespace
