// Contract hardening on the GPU (DESIGN §2): NaN is never an empty row (decode fixed / dynamic /
// split rows, prefill, both composed routes); a decode plan is a snapshot of topk_length; stale or
// unwritten plan buffers never hang and give a defined result; plans and decodes across streams;
// page_size 1 through C1, C3, C4, C5 and the composed route; padded (strided) q / out / lse /
// indices bitwise equal to the dense layout. Skips without a GPU; failures print the seed
// (SELKV_TEST_SEED=<seed> reproduces them). Every GPU wait has a deadline (SELKV_TEST_HANG_S);
// SELKV_TEST_FULL=0 (memcheck) trims the grids.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"
#include "selkv/dequant.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
#include "attn_gpu_runner.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::down;
using selkv::test::test_seed;
using selkv::test::up;

#define SEED_TRACE(what) SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + (what))

std::mt19937_64 make_rng(uint64_t salt) { return std::mt19937_64(test_seed() * 0x9E3779B97F4A7C15ull + salt); }

bool bf16_nan(uint16_t v) { return (v & 0x7FFF) > 0x7F80; }

// ---- NaN is never an empty row ------------------------------------------------------------------

// `nan` entries: out all NaN and lse NaN; every other entry: the bits of `base`.
void expect_nan_exactly(const std::vector<uint16_t>& out, const std::vector<float>& lse,
                        const std::vector<uint16_t>& base_out, const std::vector<float>& base_lse,
                        const std::set<size_t>& nan, const std::string& what) {
  size_t bad_nan = 0, changed = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (nan.count(i)) {
      bool ok = std::isnan(lse[i]);
      for (int d = 0; d < 512 && ok; ++d) ok = bf16_nan(out[i * 512 + d]);
      if (!ok && bad_nan++ < 5) ADD_FAILURE() << what << ": entry " << i << " (row * H + head) should be NaN, lse "
                                              << lse[i] << " out[0] " << test::f32(out[i * 512]);
    } else {
      const bool same = std::memcmp(&lse[i], &base_lse[i], 4) == 0 &&
                        std::memcmp(&out[i * 512], &base_out[i * 512], 512 * 2) == 0;
      if (!same && changed++ < 5)
        ADD_FAILURE() << what << ": entry " << i << " changed though no NaN reaches it: lse " << lse[i]
                      << " (was " << base_lse[i] << ")";
    }
  }
  EXPECT_EQ(bad_nan, 0u) << what;
  EXPECT_EQ(changed, 0u) << what;
}

void check_decode_nan(const test::DecodeGenOpts& g, const test::DecodeRunOpts& r, int where, uint64_t salt) {
  auto rng = make_rng(salt);
  const test::DecodeProblem p0 = test::make_decode_problem(g, rng);
  const std::string what = test::decode_name(p0, r) + " nan" + std::to_string(where);
  SEED_TRACE(what);
  test::DecodeOut base, got;
  ASSERT_TRUE(test::run_decode(p0, r, &base, what + " (no NaN)"));
  test::DecodeProblem p1 = p0;
  const std::set<size_t> nan = test::poison_decode(p1, where, g.empty_row, rng);
  ASSERT_FALSE(nan.empty()) << what;
  ASSERT_TRUE(test::run_decode(p1, r, &got, what));
  expect_nan_exactly(got.out, got.lse, base.out, base.lse, nan, what);
  std::vector<float> ro, rl;
  test::decode_oracle(p1, &ro, &rl);
  for (size_t i : nan) ASSERT_TRUE(std::isnan(rl[i])) << what << ": oracle gives lse " << rl[i] << " for NaN entry " << i;
  test::expect_decode_close(got.out, got.lse, ro, rl, what + " vs oracle");
}

const DecodePartials kFormats[] = {DecodePartials::kFp32, DecodePartials::kFp16};

// B=1 S_q=1 K=2048: one row split over many CTAs and merged by the combine (both partial formats).
TEST(ContractGpu, NanRowsDecodeFixedSplitRow) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    if (H == 128 && !test::full_grid()) continue;
    for (DecodePartials f : kFormats) {
      test::DecodeGenOpts g;
      g.B = 1; g.S = 1; g.H = H; g.K = 2048; g.s_kv = 2046; g.page = 64;
      test::DecodeRunOpts r;
      r.partials = f;
      r.min_blocks = 1;
      check_decode_nan(g, r, test::kNanQ, 10 + H);                  // one head NaN, the others unchanged
      check_decode_nan(g, r, test::kNanE4m3, 20 + H);               // the whole row NaN
      check_decode_nan(g, r, test::kNanScale, 30 + H);
    }
  }
}

// Several rows, some split, some whole, one empty; fixed and dynamic top-k.
TEST(ContractGpu, NanRowsDecodeManyRows) {
  SELKV_REQUIRE_GPU();
  for (bool dyn : {false, true})
    for (int H : {64, 128})
      for (DecodePartials f : kFormats) {
        if (!test::full_grid() && (H == 128 || f == DecodePartials::kFp32)) continue;
        test::DecodeGenOpts g;
        g.B = 4; g.S = 2; g.H = H; g.K = 512; g.s_kv = 700; g.page = 61;
        g.dynamic = dyn;
        g.lens = {512, 300, 0, 65};
        g.empty_row = 3;  // b = 1, s = 1
        for (int min_blocks : {0, 1}) {
          test::DecodeRunOpts r;
          r.partials = f;
          r.min_blocks = min_blocks;
          check_decode_nan(g, r, test::kNanE4m3 | test::kNanScale | test::kNanQ, 100 + 8 * H + 2 * dyn + min_blocks);
        }
        test::DecodeRunOpts few;
        few.num_sms = 3;  // few parts: long runs spanning rows, splits across row boundaries
        few.partials = f;
        check_decode_nan(g, few, test::kNanE4m3 | test::kNanQ, 200 + H + dyn);
      }
}

TEST(ContractGpu, NanRowsPrefill) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 300;
  for (int D : {576, 512})
    for (int H : {64, 128})
      for (bool dyn : {false, true}) {
        auto rng = make_rng(salt++);
        if (!test::full_grid() && (D == 512 || H == 128)) continue;
        test::PrefillGenOpts g;
        g.T = 40; g.H = H; g.D = D; g.K = 128; g.N = 300; g.dynamic = dyn;
        const test::PrefillProblem p0 = test::make_prefill_problem(g, rng);
        const std::string what = test::prefill_name(p0) + " NaN";
        SEED_TRACE(what);
        test::PrefillOut base, got;
        ASSERT_TRUE(test::run_prefill(p0, {}, &base, what + " (no NaN)"));
        test::PrefillProblem p1 = p0;
        // A NaN element in one kv row a valid entry of token 0 (or the first live token) selects,
        // a NaN in one head of q of token 9, and in head 0 of the empty token 5.
        auto limit = [&](int t) { return p1.len.empty() ? p1.K : std::clamp(p1.len[size_t(t)], 0, p1.K); };
        auto valid = [&](int t, int k) {
          const int32_t v = p1.idx[size_t(t) * p1.K + k];
          return k < limit(t) && v >= 0 && v < p1.N;
        };
        int32_t bad_row = -1;
        for (int t = 0; t < p1.T && bad_row < 0; ++t)
          for (int k = 0; k < limit(t) && bad_row < 0; ++k)
            if (valid(t, k)) bad_row = p1.idx[size_t(t) * p1.K + k];
        ASSERT_GE(bad_row, 0);
        p1.kv[size_t(bad_row) * D + rng() % D] = 0xFFC0;
        std::set<size_t> nan;
        for (int t = 0; t < p1.T; ++t) {
          bool hit = false;
          for (int k = 0; k < limit(t) && !hit; ++k) hit = valid(t, k) && p1.idx[size_t(t) * p1.K + k] == bad_row;
          if (hit)
            for (int h = 0; h < H; ++h) nan.insert(size_t(t) * H + h);
        }
        bool live9 = false;
        for (int k = 0; k < limit(9) && !live9; ++k) live9 = valid(9, k);
        if (live9) {
          const int h = int(rng() % uint64_t(H));
          p1.q[(size_t(9) * H + h) * D + rng() % D] = 0x7FC0;
          nan.insert(size_t(9) * H + h);
        }
        p1.q[size_t(5) * H * D] = 0x7FC0;  // token 5 has no valid entry: stays empty
        ASSERT_TRUE(test::run_prefill(p1, {}, &got, what));
        expect_nan_exactly(got.out, got.lse, base.out, base.lse, nan, what);
        for (size_t i = 0; i < got.ml.size(); ++i) {
          if (nan.count(i)) EXPECT_TRUE(std::isnan(got.ml[i])) << what << ": max_logits[" << i << "] = " << got.ml[i];
          else EXPECT_EQ(std::memcmp(&got.ml[i], &base.ml[i], 4), 0) << what << ": max_logits[" << i << "] changed";
        }
        for (int h = 0; h < H; ++h) EXPECT_EQ(got.lse[size_t(5) * H + h], -INFINITY) << what << " empty token";
        test::expect_prefill_matches_oracle(p1, got, what + " vs oracle");
      }
}

// Composed route (a): a NaN record (E4M3 code or scale) selected by valid entries, in both C4
// modes; the workspace is bit-exact with the oracle's and the NaN reaches exactly the rows that
// select it. Route (b): a NaN record inside a gathered request.
TEST(ContractGpu, NanRowsComposed) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 400;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (bool selected : {true, false})
      for (bool dyn : {false, true}) {
        auto rng = make_rng(salt++);
        if (!test::full_grid() && !dyn) continue;
        test::DqGenOpts g;
        g.format = f; g.page = 61; g.T = 21; g.H = (salt & 1) ? 128 : 64; g.K = 128; g.dynamic = dyn;
        g.num_blocks = selected ? 60 : 30;  // P = 3660 > N = 2688, or 1830 < N
        const test::DqProblem p0 = test::make_dq_problem(g, rng);
        const std::string what = test::dq_name(p0) + " NaN";
        SEED_TRACE(what);
        test::ComposedOut base;
        test::check_dq_case(p0, what + " (no NaN)", &base);
        test::DqProblem p1 = p0;
        auto limit = [&](int t) { return p1.len.empty() ? p1.K : std::clamp(p1.len[size_t(t)], 0, p1.K); };
        std::vector<int32_t> bad;
        for (int t = 0; t < p1.T && bad.size() < 2; ++t)
          for (int k = 0; k < limit(t); ++k) {
            const int32_t v = p1.idx[size_t(t) * p1.K + k];
            if (v >= 0 && v < p1.P()) { bad.push_back(v); break; }
          }
        ASSERT_EQ(bad.size(), 2u) << what;
        const PagedKvCache view = p1.view();
        p1.cache[size_t(view.slot_offset(bad[0])) + rng() % 512] = 0x7F;
        const float nanv = std::nanf("");
        std::memcpy(p1.cache.data() + view.slot_offset(bad[1]) + 512 + 4 * (rng() % 4), &nanv, 4);
        std::set<size_t> nan;
        for (int t = 0; t < p1.T; ++t)
          for (int k = 0; k < limit(t); ++k) {
            const int32_t v = p1.idx[size_t(t) * p1.K + k];
            if (v == bad[0] || v == bad[1]) {
              for (int h = 0; h < p1.H; ++h) nan.insert(size_t(t) * p1.H + h);
              break;
            }
          }
        test::ComposedOut got;
        test::check_dq_case(p1, what, &got);
        expect_nan_exactly(got.o.out, got.o.lse, base.o.out, base.o.lse, nan, what);
        for (size_t i : nan) EXPECT_TRUE(std::isnan(got.o.ml[i])) << what << ": max_logits[" << i << "]";
      }
}

// Route (b): one request (start 3, not page aligned; 250 rows) gathered through a shuffled block
// table; see test::make_gather_problem for the poison around it.
test::GatherGenOpts gather_route(KvFormat f, int page, bool dyn) {
  test::GatherGenOpts g;
  g.format = f; g.page = page; g.reqs = 1; g.T = 19; g.H = 64; g.K = 128; g.dynamic = dyn;
  g.starts = {3};
  g.lens = {250};
  return g;
}

// A NaN record (E4M3 code, NaN scale) at two gathered rows valid entries select: the workspace is
// bit-exact with the oracle's and the NaN reaches exactly the tokens that select either row.
TEST(ContractGpu, NanRowsComposedGatherRoute) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 450;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (bool dyn : {false, true}) {
      auto rng = make_rng(salt++);
      const test::GatherProblem p0 = test::make_gather_problem(gather_route(f, 64, dyn), rng);
      const std::string what = test::gather_name(p0) + " NaN";
      SEED_TRACE(what);
      test::ComposedOut base, got;
      test::check_gather_case(p0, what + " (no NaN)", &base);
      test::GatherProblem p1 = p0;
      std::vector<int32_t> bad;  // workspace rows
      for (int t = 0; t < p1.T && bad.size() < 2; ++t)
        for (int k = 0; k < p1.limit(t); ++k)
          if (p1.valid(t, k)) { bad.push_back(p1.idx[size_t(t) * p1.K + k]); break; }
      ASSERT_EQ(bad.size(), 2u) << what;
      const PagedKvCache view = p1.view();
      p1.cache[size_t(view.slot_offset(p1.slot_of_row(bad[0]))) + rng() % 512] = (rng() & 1) ? 0x7F : 0xFF;
      const float nanv = std::nanf("");
      std::memcpy(p1.cache.data() + view.slot_offset(p1.slot_of_row(bad[1])) + 512 + 4 * (rng() % 4), &nanv, 4);
      std::set<size_t> nan;
      for (int t = 0; t < p1.T; ++t)
        for (int k = 0; k < p1.limit(t); ++k)
          if (p1.valid(t, k) && (p1.idx[size_t(t) * p1.K + k] == bad[0] || p1.idx[size_t(t) * p1.K + k] == bad[1])) {
            for (int h = 0; h < p1.H; ++h) nan.insert(size_t(t) * p1.H + h);
            break;
          }
      test::check_gather_case(p1, what, &got);
      ASSERT_FALSE(base.ws.empty()) << what << ": the run without NaN did not complete";
      ASSERT_FALSE(got.ws.empty()) << what << ": the run with NaN did not complete";
      ASSERT_FALSE(nan.empty());
      expect_nan_exactly(got.o.out, got.o.lse, base.o.out, base.o.lse, nan, what);
      for (size_t i : nan) EXPECT_TRUE(std::isnan(got.o.ml[i])) << what << ": max_logits[" << i << "]";
    }
}

// ---- a decode plan is a snapshot of topk_length -------------------------------------------------

// Lengths changed in place after planning: the decode without a re-plan gives exactly the planned
// lengths' result (bitwise equal to a fresh plan + decode with them); re-planning gives the new
// lengths' result (bitwise equal to a fresh plan + decode with them, and close to the oracle).
TEST(ContractGpu, TopkLengthChangedAfterPlanning) {
  SELKV_REQUIRE_GPU();
  struct Cfg { int B, S, H, K, min_blocks; std::vector<int32_t> l1, l2; };
  const Cfg cfgs[] = {
      {6, 2, 64, 512, 1, {512, 100, 0, 65, 1, 300}, {50, 512, 64, 0, 200, 1}},
      {3, 1, 128, 2048, 0, {2048, 1000, 7}, {64, 2048, 1500}},
      {1, 1, 64, 2048, 1, {2048}, {130}},
  };
  uint64_t salt = 500;
  for (const Cfg& c : cfgs) {
    auto rng = make_rng(salt++);
    test::DecodeGenOpts g;
    g.B = c.B; g.S = c.S; g.H = c.H; g.K = c.K; g.s_kv = c.K + 37; g.page = 64; g.dynamic = true;
    for (size_t b = 0; b < c.l1.size(); ++b) g.lens.push_back(std::max(c.l1[b], c.l2[b]));
    test::DecodeProblem p1 = test::make_decode_problem(g, rng);  // records valid up to max(l1, l2)
    p1.topk_length = c.l1;
    test::DecodeProblem p2 = p1;
    p2.topk_length = c.l2;
    test::DecodeRunOpts r;
    r.min_blocks = c.min_blocks;
    const std::string what = test::decode_name(p1, r) + " lengths changed";
    SEED_TRACE(what);
    test::DecodeOut fresh1, fresh2;
    ASSERT_TRUE(test::run_decode(p1, r, &fresh1, what + " fresh l1"));
    ASSERT_TRUE(test::run_decode(p2, r, &fresh2, what + " fresh l2"));

    test::DecodeDevice d(p1);  // its topk_length buffer holds l1
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    DevBuf dmd(decode_metadata_size(c.B, c.S));
    DecodeMetadata md;
    ST_OK(make_decode_metadata(d.shape(0, c.min_blocks), dmd.ptr, dmd.bytes, &md, s));
    DevBuf dws(decode_workspace_size(md));
    d.poison_outputs(s);
    ST_OK(sparse_mla_decode(d.sp, md, dws.ptr, dws.bytes, s));
    ASSERT_TRUE(test::sync_or_abort(s, what));
    const test::DecodeOut planned = d.read(what);
    EXPECT_TRUE(test::bits_equal(planned.out, fresh1.out)) << what << ": out";
    EXPECT_TRUE(test::bits_equal(planned.lse, fresh1.lse)) << what << ": lse";

    up(*d.dlen, c.l2);  // in place, no re-plan
    d.poison_outputs(s);
    ST_OK(sparse_mla_decode(d.sp, md, dws.ptr, dws.bytes, s));
    ASSERT_TRUE(test::sync_or_abort(s, what + " stale lengths"));
    const test::DecodeOut stale = d.read(what);
    EXPECT_TRUE(test::bits_equal(stale.out, fresh1.out)) << what << ": out after the lengths changed (no re-plan)";
    EXPECT_TRUE(test::bits_equal(stale.lse, fresh1.lse)) << what << ": lse after the lengths changed (no re-plan)";

    ST_OK(make_decode_metadata(d.shape(0, c.min_blocks), dmd.ptr, dmd.bytes, &md, s));  // re-plan
    d.poison_outputs(s);
    ST_OK(sparse_mla_decode(d.sp, md, dws.ptr, dws.bytes, s));
    ASSERT_TRUE(test::sync_or_abort(s, what + " re-planned"));
    const test::DecodeOut replanned = d.read(what);
    cudaStreamDestroy(s);
    EXPECT_TRUE(test::bits_equal(replanned.out, fresh2.out)) << what << ": out after re-planning";
    EXPECT_TRUE(test::bits_equal(replanned.lse, fresh2.lse)) << what << ": lse after re-planning";
    std::vector<float> ro, rl;
    test::decode_oracle(p1, &ro, &rl);
    test::expect_decode_close(fresh1.out, fresh1.lse, ro, rl, what + " l1 vs oracle");
    test::decode_oracle(p2, &ro, &rl);
    test::expect_decode_close(replanned.out, replanned.lse, ro, rl, what + " l2 vs oracle");
  }
}

// ---- stale and unwritten plan buffers -----------------------------------------------------------

enum class PlanDamage { kStale, kFilledFF, kRandom };

// Plan A is made for the problem's shape in buffer M; then M is overwritten (plan B for another
// shape, 0xFF, random bytes) and the decode runs with plan A's struct. It must return (deadline)
// without a fault: fixed top-k gives the correct result (within DESIGN §5 of the oracle), dynamic
// top-k gives NaN in every out and lse entry.
void check_damaged_plan(const test::DecodeGenOpts& g, PlanDamage damage, uint64_t salt) {
  auto rng = make_rng(salt);
  const test::DecodeProblem p = test::make_decode_problem(g, rng);
  const bool dyn = !p.topk_length.empty();
  const std::string what = test::decode_name(p, {}) + " damaged plan " + std::to_string(int(damage));
  SEED_TRACE(what);
  test::DecodeDevice d(p);
  // Plan B's shape: other batch, seq_q and top-k (another topk_length buffer when dynamic).
  const int yB = p.B + 3, yS = p.S + 1, yK = p.K == 2048 ? 512 : 2048;
  DevBuf dm(std::max(decode_metadata_size(p.B, p.S), decode_metadata_size(yB, yS)));
  DevBuf dlen_y(size_t(yB) * 4);
  std::vector<int32_t> len_y(static_cast<size_t>(yB));
  for (auto& l : len_y) l = int32_t(rng() % uint64_t(yK + 1));
  up(dlen_y, len_y);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  DecodeMetadata plan_a, plan_b;
  ST_OK(make_decode_metadata(d.shape(0, 1), dm.ptr, dm.bytes, &plan_a, s));
  DevBuf dws(decode_workspace_size(plan_a));
  if (damage == PlanDamage::kStale) {
    DecodeShape y{yB, yS, p.H, yK, dyn ? dlen_y.as<int32_t>() : nullptr, 0};
    ST_OK(make_decode_metadata(y, dm.ptr, dm.bytes, &plan_b, s));
  } else if (damage == PlanDamage::kFilledFF) {
    CUDA_OK(cudaMemsetAsync(dm.ptr, 0xFF, dm.bytes, s));
  } else {
    std::vector<uint32_t> junk(dm.bytes / 4);
    for (auto& j : junk) j = uint32_t(rng());
    for (size_t i = 0; i < 8 && i < junk.size(); ++i) junk[i] = uint32_t(rng() % 4096);  // plausible header
    CUDA_OK(cudaMemcpyAsync(dm.ptr, junk.data(), junk.size() * 4, cudaMemcpyHostToDevice, s));
  }
  d.poison_outputs(s);
  ST_OK(sparse_mla_decode(d.sp, plan_a, dws.ptr, dws.bytes, s));
  ASSERT_TRUE(test::sync_or_abort(s, what));
  cudaStreamDestroy(s);
  const test::DecodeOut got = d.read(what);
  if (dyn) {
    size_t not_nan = 0;
    for (float v : got.lse) not_nan += !std::isnan(v);
    for (uint16_t v : got.out) not_nan += !bf16_nan(v);
    EXPECT_EQ(not_nan, 0u) << what << ": dynamic top-k with a plan that does not match must give NaN everywhere";
  } else {
    std::vector<float> ro, rl;
    test::decode_oracle(p, &ro, &rl);
    test::expect_decode_close(got.out, got.lse, ro, rl, what);
  }
}

TEST(ContractGpu, StaleOrUnwrittenPlanBufferNeverHangs) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 600;
  for (PlanDamage damage : {PlanDamage::kStale, PlanDamage::kFilledFF, PlanDamage::kRandom}) {
    test::DecodeGenOpts fixed_split;  // one row split over many CTAs: the combine runs
    fixed_split.B = 1; fixed_split.S = 1; fixed_split.H = 64; fixed_split.K = 2048; fixed_split.s_kv = 2046;
    check_damaged_plan(fixed_split, damage, salt++);
    test::DecodeGenOpts fixed_many;
    fixed_many.B = 2; fixed_many.S = 2; fixed_many.H = 128; fixed_many.K = 576; fixed_many.s_kv = 1024;
    fixed_many.page = 61;
    check_damaged_plan(fixed_many, damage, salt++);
    test::DecodeGenOpts dyn;
    dyn.B = 2; dyn.S = 1; dyn.H = 64; dyn.K = 2048; dyn.s_kv = 2046; dyn.dynamic = true; dyn.lens = {2048, 1000};
    check_damaged_plan(dyn, damage, salt++);
    test::DecodeGenOpts dyn128;
    dyn128.B = 5; dyn128.S = 2; dyn128.H = 128; dyn128.K = 512; dyn128.s_kv = 600; dyn128.dynamic = true;
    check_damaged_plan(dyn128, damage, salt++);
  }
}

// ---- streams ----------------------------------------------------------------------------------

// The plan made on stream A (after an async topk_length upload on A), an event, stream B waits
// on it and decodes: the same bits as a single-stream run.
TEST(ContractGpu, PlanOnOneStreamDecodeOnAnother) {
  SELKV_REQUIRE_GPU();
  auto rng = make_rng(700);
  test::DecodeGenOpts g;
  g.B = 8; g.S = 2; g.H = 64; g.K = 1024; g.s_kv = 1100; g.dynamic = true;
  g.lens = {1024, 900, 0, 1, 64, 65, 513, 1000};
  const test::DecodeProblem p = test::make_decode_problem(g, rng);
  const std::string what = test::decode_name(p, {}) + " two streams";
  SEED_TRACE(what);
  test::DecodeOut want;
  ASSERT_TRUE(test::run_decode(p, {}, &want, what + " single stream"));

  test::DecodeDevice d(p);
  int32_t* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 4 * size_t(p.B)));
  std::copy(p.topk_length.begin(), p.topk_length.end(), pinned);
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreate(&a));
  CUDA_OK(cudaStreamCreate(&b));
  cudaEvent_t planned;
  CUDA_OK(cudaEventCreateWithFlags(&planned, cudaEventDisableTiming));
  DevBuf dmd(decode_metadata_size(p.B, p.S));
  DecodeMetadata md;
  CUDA_OK(cudaMemsetAsync(d.dlen->ptr, 0, 4 * size_t(p.B), a));  // the plan must see the upload below
  CUDA_OK(cudaMemcpyAsync(d.dlen->ptr, pinned, 4 * size_t(p.B), cudaMemcpyHostToDevice, a));
  ST_OK(make_decode_metadata(d.shape(), dmd.ptr, dmd.bytes, &md, a));
  DevBuf dws(decode_workspace_size(md));
  d.poison_outputs(a);
  CUDA_OK(cudaEventRecord(planned, a));
  CUDA_OK(cudaStreamWaitEvent(b, planned, 0));
  ST_OK(sparse_mla_decode(d.sp, md, dws.ptr, dws.bytes, b));
  ASSERT_TRUE(test::sync_or_abort(b, what));
  ASSERT_TRUE(test::sync_or_abort(a, what));
  const test::DecodeOut got = d.read(what);
  EXPECT_TRUE(test::bits_equal(got.out, want.out)) << what << ": out";
  EXPECT_TRUE(test::bits_equal(got.lse, want.lse)) << what << ": lse";
  cudaEventDestroy(planned);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFreeHost(pinned);
}

// Two decodes of different inputs (fixed with split rows, dynamic) on two streams at once, each
// with its own plan and workspace, several rounds: the same bits as when run one after the other.
TEST(ContractGpu, ConcurrentDecodesOnTwoStreams) {
  SELKV_REQUIRE_GPU();
  auto rng = make_rng(710);
  test::DecodeGenOpts g1, g2;
  g1.B = 2; g1.S = 2; g1.H = 128; g1.K = 2048; g1.s_kv = 2046;
  g2.B = 16; g2.S = 1; g2.H = 64; g2.K = 512; g2.s_kv = 600; g2.page = 61; g2.dynamic = true;
  const test::DecodeProblem p1 = test::make_decode_problem(g1, rng), p2 = test::make_decode_problem(g2, rng);
  SEED_TRACE("two concurrent decodes");
  test::DecodeDevice d1(p1), d2(p2);
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreate(&s1));
  CUDA_OK(cudaStreamCreate(&s2));
  DevBuf m1(decode_metadata_size(p1.B, p1.S)), m2(decode_metadata_size(p2.B, p2.S));
  DecodeMetadata md1, md2;
  ST_OK(make_decode_metadata(d1.shape(0, 1), m1.ptr, m1.bytes, &md1, s1));
  ST_OK(make_decode_metadata(d2.shape(0, 1), m2.ptr, m2.bytes, &md2, s2));
  DevBuf w1(decode_workspace_size(md1)), w2(decode_workspace_size(md2));
  // Sequential reference.
  d1.poison_outputs(s1);
  ST_OK(sparse_mla_decode(d1.sp, md1, w1.ptr, w1.bytes, s1));
  ASSERT_TRUE(test::sync_or_abort(s1, "sequential 1"));
  ASSERT_TRUE(test::sync_or_abort(s2, "plan 2"));
  const test::DecodeOut want1 = d1.read("sequential 1");
  d2.poison_outputs(s2);
  ST_OK(sparse_mla_decode(d2.sp, md2, w2.ptr, w2.bytes, s2));
  ASSERT_TRUE(test::sync_or_abort(s2, "sequential 2"));
  const test::DecodeOut want2 = d2.read("sequential 2");
  for (int round = 0; round < 4; ++round) {
    d1.poison_outputs(s1);
    d2.poison_outputs(s2);
    for (int rep = 0; rep < 3; ++rep) {  // back-to-back launches keep both streams busy together
      ST_OK(sparse_mla_decode(d1.sp, md1, w1.ptr, w1.bytes, s1));
      ST_OK(sparse_mla_decode(d2.sp, md2, w2.ptr, w2.bytes, s2));
    }
    ASSERT_TRUE(test::sync_or_abort(s1, "concurrent 1"));
    ASSERT_TRUE(test::sync_or_abort(s2, "concurrent 2"));
    const test::DecodeOut got1 = d1.read("concurrent 1"), got2 = d2.read("concurrent 2");
    EXPECT_TRUE(test::bits_equal(got1.out, want1.out)) << "round " << round;
    EXPECT_TRUE(test::bits_equal(got1.lse, want1.lse)) << "round " << round;
    EXPECT_TRUE(test::bits_equal(got2.out, want2.out)) << "round " << round;
    EXPECT_TRUE(test::bits_equal(got2.lse, want2.lse)) << "round " << round;
  }
  std::vector<float> ro, rl;
  test::decode_oracle(p1, &ro, &rl);
  test::expect_decode_close(want1.out, want1.lse, ro, rl, "decode 1 vs oracle");
  test::decode_oracle(p2, &ro, &rl);
  test::expect_decode_close(want2.out, want2.lse, ro, rl, "decode 2 vs oracle");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// ---- strided layouts --------------------------------------------------------------------------

// Padded rows of q / out / lse / indices (every stride larger than dense, 16-byte multiples; the
// pads of q and indices hold NaN q values and a NaN record's slot, the output pads a poison that
// must survive): bitwise equal to the dense run.
TEST(ContractGpu, StridedDecodeBitwiseEqualsDense) {
  SELKV_REQUIRE_GPU();
  test::DecodeLayout pad;
  pad.q_head = 64; pad.q_seq = 8; pad.q_batch = 16;
  pad.out_head = 8; pad.out_seq = 24; pad.out_batch = 8;
  pad.lse_seq = 4; pad.lse_batch = 12;
  pad.idx_seq = 4; pad.idx_batch = 8;
  test::DecodeLayout pad_only_rows;  // heads dense, rows padded
  pad_only_rows.q_seq = 8; pad_only_rows.out_seq = 8; pad_only_rows.lse_seq = 4; pad_only_rows.idx_seq = 64;
  uint64_t salt = 800;
  for (bool dyn : {false, true})
    for (int H : {64, 128}) {
      auto rng = make_rng(salt++);
      if (!test::full_grid() && H == 128) continue;
      test::DecodeGenOpts g;
      g.B = 3; g.S = 2; g.H = H; g.K = 1024; g.s_kv = 1100; g.page = 69; g.dynamic = dyn;
      g.lens = {1024, 333, 0};
      g.empty_row = 1;
      const test::DecodeProblem p = test::make_decode_problem(g, rng);
      for (int min_blocks : {0, 1}) {
        test::DecodeRunOpts dense;
        dense.min_blocks = min_blocks;
        const std::string what = test::decode_name(p, dense) + " strided";
        SEED_TRACE(what);
        test::DecodeOut want;
        ASSERT_TRUE(test::run_decode(p, dense, &want, what + " dense"));
        for (const test::DecodeLayout& l : {pad, pad_only_rows}) {
          test::DecodeRunOpts r = dense;
          r.layout = l;
          test::DecodeOut got;
          ASSERT_TRUE(test::run_decode(p, r, &got, what));
          EXPECT_TRUE(test::bits_equal(got.out, want.out)) << what << ": out";
          EXPECT_TRUE(test::bits_equal(got.lse, want.lse)) << what << ": lse";
        }
        if (min_blocks == 0) {
          std::vector<float> ro, rl;
          test::decode_oracle(p, &ro, &rl);
          test::expect_decode_close(want.out, want.lse, ro, rl, what + " vs oracle");
        }
      }
    }
}

TEST(ContractGpu, StridedPrefillBitwiseEqualsDense) {
  SELKV_REQUIRE_GPU();
  test::PrefillLayout pad;
  pad.q_head = 8; pad.q_token = 64; pad.out_head = 16; pad.out_token = 8;
  pad.ml_token = 4; pad.lse_token = 12; pad.idx_token = 4; pad.kv_row = 8;
  test::PrefillLayout rows_only;
  rows_only.q_token = 8; rows_only.out_token = 8; rows_only.ml_token = 4; rows_only.lse_token = 4;
  rows_only.idx_token = 64; rows_only.kv_row = 64;
  uint64_t salt = 850;
  for (int D : {576, 512})
    for (int H : {64, 128})
      for (bool dyn : {false, true}) {
        auto rng = make_rng(salt++);
        if (!test::full_grid() && (D == 512 || H == 128)) continue;
        test::PrefillGenOpts g;
        g.T = 45; g.H = H; g.D = D; g.K = 192; g.N = 500; g.dynamic = dyn;
        const test::PrefillProblem p = test::make_prefill_problem(g, rng);
        const std::string what = test::prefill_name(p) + " strided";
        SEED_TRACE(what);
        test::PrefillOut want;
        ASSERT_TRUE(test::run_prefill(p, {}, &want, what + " dense"));
        for (const test::PrefillLayout& l : {pad, rows_only}) {
          test::PrefillOut got;
          ASSERT_TRUE(test::run_prefill(p, l, &got, what));
          EXPECT_TRUE(test::bits_equal(got.out, want.out)) << what << ": out";
          EXPECT_TRUE(test::bits_equal(got.ml, want.ml)) << what << ": max_logits";
          EXPECT_TRUE(test::bits_equal(got.lse, want.lse)) << what << ": lse";
        }
        test::expect_prefill_matches_oracle(p, want, what + " vs oracle");
      }
}

// ---- page_size 1 ------------------------------------------------------------------------------

TEST(ContractGpu, PageSizeOneDecode) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 900;
  for (bool dyn : {false, true})
    for (int H : {64, 128}) {
      auto rng = make_rng(salt++);
      test::DecodeGenOpts g;
      g.B = 4; g.S = 2; g.H = H; g.K = 576; g.s_kv = 700; g.page = 1; g.dynamic = dyn;
      g.lens = {576, 100, 0, 64};
      g.empty_row = 5;
      g.stride_pad = dyn ? 16 : 0;
      const test::DecodeProblem p = test::make_decode_problem(g, rng);
      std::vector<float> ro, rl;
      test::decode_oracle(p, &ro, &rl);
      for (int min_blocks : {0, 1}) {
        test::DecodeRunOpts r;
        r.min_blocks = min_blocks;
        const std::string what = test::decode_name(p, r);
        SEED_TRACE(what);
        test::DecodeOut got;
        ASSERT_TRUE(test::run_decode(p, r, &got, what));
        test::expect_decode_close(got.out, got.lse, ro, rl, what);
      }
    }
}

TEST(ContractGpu, PageSizeOneComposed) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 950;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (bool selected : {true, false}) {
      auto rng = make_rng(salt++);
      test::DqGenOpts g;
      g.format = f; g.page = 1; g.T = 13; g.H = 64; g.K = 128; g.dynamic = selected;
      g.num_blocks = selected ? 3000 : 900;  // P vs N = 1664
      const test::DqProblem p = test::make_dq_problem(g, rng);
      SEED_TRACE(test::dq_name(p));
      test::check_dq_case(p, test::dq_name(p));
    }
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8}) {
    auto rng = make_rng(salt++);
    const test::GatherProblem p = test::make_gather_problem(gather_route(f, 1, true), rng);
    SEED_TRACE(test::gather_name(p));
    test::check_gather_case(p, test::gather_name(p));
  }
}

// C1 write, C3 gather and C4 dequant with one token per page, bit-exact against the oracle
// (every byte of the cache / output, poison included).
TEST(ContractGpu, PageSizeOneCacheOps) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 980;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8}) {
    auto rng = make_rng(salt++);
    const int rb = fmt::record_bytes(f), D = fmt::dequant_dim(f);
    const int64_t num_blocks = 700, stride16 = rb + 16 * int64_t(f == KvFormat::kNopeFp8);  // a padded stride too
    SEED_TRACE("page 1 format " + std::to_string(int(f)));
    // C1: 600 tokens to a shuffled subset of the 700 slots; a few skipped (-1, out of range).
    const int64_t T = 600;
    const auto kv = test::randn_bf16(size_t(T) * 576, 0.5f, rng);
    std::vector<int64_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), int64_t(0));
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> slots(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) slots[size_t(t)] = t % 37 == 3 ? -1 : t % 41 == 7 ? num_blocks : perm[size_t(t)];
    std::vector<uint8_t> cache(size_t(num_blocks * stride16), 0xFF);
    DevBuf dkv(kv.size() * 2), dslots(slots.size() * 8), dcache(cache.size());
    up(dkv, kv); up(dslots, slots); up(dcache, cache);
    WriteKvCacheParams w;
    w.latent = dkv.ptr; w.latent_row_stride = 576;
    w.rope = fmt::has_rope(f) ? dkv.as<void>(1024) : nullptr; w.rope_row_stride = 576;
    w.slot_mapping = dslots.as<int64_t>(); w.num_tokens = T;
    w.cache = dcache.ptr; w.num_blocks = num_blocks; w.page_size = 1; w.block_stride_bytes = stride16;
    w.format = f; w.scale_mode = (salt & 1) ? ScaleMode::kAmax : ScaleMode::kPow2;
    ST_OK(write_kv_cache(w, nullptr));
    ASSERT_TRUE(test::sync_or_abort(nullptr, "C1 page 1"));
    WriteKvCacheParams hw = w;
    hw.latent = kv.data(); hw.rope = fmt::has_rope(f) ? kv.data() + 512 : nullptr;
    hw.slot_mapping = slots.data(); hw.cache = cache.data();
    ST_OK(ref::write_kv_cache(hw));
    EXPECT_TRUE(test::bits_equal(cache, dcache.download<uint8_t>())) << "C1 page 1 cache bytes";

    // C3: three requests over the written cache through shuffled one-token pages.
    const int reqs = 3, max_blocks = 240;
    std::vector<int32_t> bt(size_t(reqs) * max_blocks);
    for (size_t i = 0; i < bt.size(); ++i) bt[i] = int32_t(perm[i % perm.size()]);
    bt[5] = -1;                        // missing page: zero row
    bt[max_blocks + 9] = int32_t(num_blocks);  // out of range: zero row
    const std::vector<int32_t> starts = {0, 7, 100}, lens = {240, 200, 150}, ws = {0, 241, 445};
    const int64_t out_rows = 595;
    std::vector<uint16_t> out(size_t(out_rows) * D, 0xFFBF);
    DevBuf dbt(bt.size() * 4), dst(12), dln(12), dws(12), dout(out.size() * 2);
    up(dbt, bt); up(dst, starts); up(dln, lens); up(dws, ws); up(dout, out);
    GatherKvParams gp;
    gp.cache = dcache.ptr; gp.num_blocks = num_blocks; gp.page_size = 1; gp.block_stride_bytes = stride16;
    gp.format = f; gp.block_table = dbt.as<int32_t>(); gp.block_table_row_stride = max_blocks;
    gp.max_blocks_per_req = max_blocks; gp.seq_starts = dst.as<int32_t>(); gp.seq_lens = dln.as<int32_t>();
    gp.ws_starts = dws.as<int32_t>(); gp.num_reqs = reqs; gp.out = dout.ptr; gp.out_row_stride = D;
    gp.out_rows = out_rows;
    ST_OK(gather_kv_bf16(gp, nullptr));
    ASSERT_TRUE(test::sync_or_abort(nullptr, "C3 page 1"));
    GatherKvParams hg = gp;
    hg.cache = cache.data(); hg.block_table = bt.data(); hg.seq_starts = starts.data(); hg.seq_lens = lens.data();
    hg.ws_starts = ws.data(); hg.out = out.data();
    ST_OK(ref::gather_kv_bf16(hg));
    EXPECT_TRUE(test::bits_equal(out, dout.download<uint16_t>())) << "C3 page 1 output";

    // C4: selected (N < P) and full-pool (N >= P) modes over the same cache.
    for (int64_t Tq : {int64_t(2), int64_t(12)}) {
      const int K = 64;
      std::vector<int32_t> idx(size_t(Tq) * K), ol(size_t(Tq) * K, 0x55555555);
      for (auto& v : idx) {
        const int r = int(rng() % 10);
        v = r == 0 ? -1 : r == 1 ? int32_t(num_blocks) : r == 2 ? INT_MAX : int32_t(rng() % uint64_t(num_blocks));
      }
      const int64_t rows = dequant_selected_workspace_rows(Tq, K, num_blocks);
      std::vector<uint16_t> wsb(size_t(rows) * D, 0xFFC1);
      DevBuf didx(idx.size() * 4), dol(ol.size() * 4), dwsb(wsb.size() * 2);
      up(didx, idx); up(dol, ol); up(dwsb, wsb);
      DequantSelectedParams dp;
      dp.cache = PagedKvCache{dcache.ptr, num_blocks, 1, stride16, f};
      dp.indices = didx.as<int32_t>(); dp.indices_row_stride = K; dp.num_tokens = Tq; dp.topk = K;
      dp.workspace = dwsb.ptr; dp.workspace_rows = rows; dp.workspace_row_stride = D;
      dp.out_indices = dol.as<int32_t>(); dp.out_indices_row_stride = K;
      ST_OK(dequant_selected_kv(dp, nullptr));
      ASSERT_TRUE(test::sync_or_abort(nullptr, "C4 page 1"));
      DequantSelectedParams hd = dp;
      hd.cache.data = cache.data(); hd.indices = idx.data(); hd.workspace = wsb.data(); hd.out_indices = ol.data();
      ST_OK(ref::dequant_selected(hd));
      EXPECT_TRUE(test::bits_equal(wsb, dwsb.download<uint16_t>())) << "C4 page 1 workspace, T " << Tq;
      EXPECT_TRUE(test::bits_equal(ol, dol.download<int32_t>())) << "C4 page 1 indices, T " << Tq;
    }
  }
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
