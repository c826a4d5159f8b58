// C5 sparse MLA decode on the GPU vs the CPU oracle (DESIGN §5 tolerances). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "decode/decode_params.h"
#include "gpu_test_util.h"
#include "selkv/decode.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS  // the decode kernels are only built with the CUTLASS headers
#include "attn_gpu_runner.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::up;

// One row of a case table; the problem itself comes from make_decode_problem (attn_gpu_runner.h).
struct CaseSpec {
  int B, S, H, s_kv, K, page;
  int stride_pad = 0;            // extra bytes per block (multiple of 16)
  bool garbage = true;           // scatter -1, -7, INT_MAX, >= num_slots and duplicates inside rows
  bool all_invalid_row = true;   // one row (the last batch's first) with no valid index
  bool dynamic = false;
  bool sink = false;
  float data_std = 0.1f;         // std of the cached latent and rope values (q's is 0.1 / data_std,
                                 // so the logits keep the same spread at any data scale)
};

// q's std scales inversely with the cache's: the logits keep one spread (~0.4) at any data scale.
// With q at std 1 and |K| ~ 3e4 the logits reach 6e4, where one fp32 ulp (0.004) of the score
// moves a near-tied softmax weight by percents: a test of fp32 score precision, not of the
// partials' range.
test::DecodeGenOpts gen_opts(const CaseSpec& c) {
  test::DecodeGenOpts o;
  o.B = c.B; o.S = c.S; o.H = c.H; o.K = c.K; o.page = c.page;
  o.s_kv = c.s_kv;
  o.stride_pad = c.stride_pad;
  o.garbage_rate = c.garbage ? 0.06f : 0.f;
  o.dup_rate = c.garbage ? 0.02f : 0.f;
  o.empty_row = c.all_invalid_row && c.B * c.S > 1 ? (c.B - 1) * c.S : -1;
  o.dynamic = c.dynamic;
  o.sink = c.sink;
  o.data_std = c.data_std;
  return o;
}

test::DecodeProblem make_problem(const CaseSpec& c, std::mt19937_64& rng) {
  return test::make_decode_problem(gen_opts(c), rng);
}

// Runs the GPU op (deadline wait; false on a failure, already reported). graph: metadata + decode
// captured into a CUDA graph and replayed twice. num_sms 0 = the device's; min_blocks 0 = the
// library's split granularity.
bool run_gpu(const test::DecodeProblem& p, int num_sms, bool graph, test::DecodeOut* res, int min_blocks = 0,
             DecodePartials f = DecodePartials::kAuto) {
  test::DecodeRunOpts o;
  o.num_sms = num_sms;
  o.min_blocks = min_blocks;
  o.partials = f;
  o.graph = graph;
  return test::run_decode(p, o, res, test::decode_name(p, o) + (graph ? " graph" : ""));
}

// DESIGN §5 tolerances, empty and NaN rows: test::expect_decode_close (attn_check_util.h).
void compare(const test::DecodeOut& g, const std::vector<float>& ref_out, const std::vector<float>& ref_lse,
             const std::string& what, bool scale_free = false) {
  test::expect_decode_close(g.out, g.lse, ref_out, ref_lse, what, scale_free);
}

const char* partials_name(DecodePartials f) {
  return f == DecodePartials::kFp32 ? " fp32" : (f == DecodePartials::kFp16 ? " fp16" : "");
}

std::string name(const CaseSpec& c, int num_sms, int min_blocks = 0, DecodePartials f = DecodePartials::kAuto) {
  return "B" + std::to_string(c.B) + " S" + std::to_string(c.S) + " H" + std::to_string(c.H) +
         " skv" + std::to_string(c.s_kv) + " K" + std::to_string(c.K) + " page" +
         std::to_string(c.page) + (c.dynamic ? " dyn" : "") + (c.sink ? " sink" : "") +
         " sms" + std::to_string(num_sms) + " minblk" + std::to_string(min_blocks) +
         (c.data_std != 0.1f ? " std" + std::to_string(c.data_std) : "") + partials_name(f) +
         " seed" + std::to_string(test::test_seed());
}

// `formats`: the partial formats to run the case with (one oracle run for all).
void check_case(const CaseSpec& c, int num_sms, int min_blocks = 0,
                const std::vector<DecodePartials>& formats = {DecodePartials::kAuto}) {
  std::mt19937_64 rng(test::test_seed() ^ (uint64_t(c.B) << 40) ^ (uint64_t(c.K) << 20) ^ c.page ^ (c.H << 8));
  const test::DecodeProblem p = make_problem(c, rng);
  std::vector<float> ro, rl;
  test::decode_oracle(p, &ro, &rl);
  for (DecodePartials f : formats) {
    test::DecodeOut g;
    if (run_gpu(p, num_sms, false, &g, min_blocks, f))
      compare(g, ro, rl, name(c, num_sms, min_blocks, f), /*scale_free=*/c.data_std != 0.1f);
  }
}

const std::vector<DecodePartials> kBothFormats = {DecodePartials::kFp32, DecodePartials::kFp16};

TEST(DecodeGpu, FixedTopk) {
  SELKV_REQUIRE_GPU();
  const CaseSpec cases[] = {
      {1, 1, 64, 512, 64, 64},
      {4, 3, 128, 1024, 576, 61},
      {74, 1, 64, 512, 64, 2},
      {1, 3, 128, 2046, 2048, 69},
      {4, 1, 64, 2046, 2048, 64, /*stride_pad=*/48},
      {74, 1, 128, 512, 64, 69, 0, true, true, false, /*sink=*/true},
      {4, 3, 64, 1024, 576, 2, 16, true, true, false, true},
  };
  for (const auto& c : cases) {
    check_case(c, 0);
    if (c.B * c.S * c.K / 64 > 4) check_case(c, 3);  // few parts: long runs + splits across rows
  }
}

TEST(DecodeGpu, DynamicTopkTails) {
  SELKV_REQUIRE_GPU();
  const CaseSpec cases[] = {
      {8, 2, 64, 512, 256, 61, 0, true, false, true},
      {16, 1, 128, 512, 256, 64, 0, true, false, true},
      {8, 1, 128, 2046, 2048, 69, 0, true, false, true, true},
  };
  for (const auto& c : cases) {
    check_case(c, 0);
    check_case(c, 5);
  }
}

// Split granularity: rows split up to 64 ways (the combine merges them 8 or 16 partials per load
// batch), parts ending mid-row and spanning rows, fixed and dynamic schedules, with a sink.
TEST(DecodeGpu, SplitGranularity) {
  SELKV_REQUIRE_GPU();
  const CaseSpec cases[] = {
      {1, 1, 64, 2046, 2048, 64},
      {1, 3, 128, 2046, 2048, 61, 0, true, true, false, /*sink=*/true},
      {2, 2, 64, 1024, 576, 64},
      {12, 1, 64, 2046, 2048, 69, 0, true, false, /*dynamic=*/true},
      {9, 1, 128, 512, 512, 64, 0, true, false, true, true},
  };
  for (const auto& c : cases)
    for (int min_blocks : {1, 3, 17}) check_case(c, 0, min_blocks, kBothFormats);
  check_case(cases[0], 9, 1, kBothFormats);  // 9 parts: 9 splits of one row (one full batch + 1)
  // Rows split more than 32 ways: the combine's second chunk of 32 splits (lse and weights
  // reloaded); the second row has no valid index (an empty row among split rows).
  for (int H : {64, 128}) check_case({2, 1, H, 8192, 4096, 64}, 0, 1, kBothFormats);  // 64 / ~33 ways
}

// Split rows at any data scale: both partial formats (DecodePartials; fp16 holds O unnormalized,
// scaled per head and d_v half only where its fp16 max is outside [2^-13, 65504], partial_scale.h)
// must neither overflow (|cache| ~ 3e6: the partials reach ~1e5 and more, beyond fp16's 65504) nor
// lose precision to subnormals (|cache| ~ 1e-6: |out| ~ 4e-8); 1e3 and 1e-4 lie between, far from
// unit scale. compare()'s cosine distance is the scale-free check of DESIGN §5.
TEST(DecodeGpu, SplitRowsAtAnyDataScale) {
  SELKV_REQUIRE_GPU();
  for (float std_dev : {3e6f, 1e3f, 1e-4f, 1e-6f})
    for (int H : {64, 128}) {
      CaseSpec c{2, 2, H, 1024, 576, 64, 0, true, false, false, false, std_dev};
      check_case(c, 0, 1, kBothFormats);  // 1-block parts: every row split 9 ways
      check_case(c, 0, 0, kBothFormats);
    }
}

// Dynamic top-k == fixed top-k with the suffix set to -1, bit for bit. With one part (no split
// rows) both run the same per-row arithmetic (fully masked trailing blocks are exact no-ops);
// with splits the partition differs and the results agree within tolerance (DynamicTopkTails).
TEST(DecodeGpu, DynamicEqualsFixedWithInvalidSuffix) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    std::mt19937_64 rng(test::test_seed() + H);
    CaseSpec c{8, 2, H, 512, 256, 61, 0, true, false, true};
    const test::DecodeProblem p = make_problem(c, rng);
    test::DecodeOut dyn, fix;
    ASSERT_TRUE(run_gpu(p, 1, false, &dyn));
    test::DecodeProblem q = p;
    for (int b = 0; b < p.B; ++b)
      for (int s = 0; s < p.S; ++s)
        for (int k = p.topk_length[b]; k < p.K; ++k) q.indices[(size_t(b) * p.S + s) * p.K + k] = -1;
    q.topk_length.clear();  // fixed top-k
    ASSERT_TRUE(run_gpu(q, 1, false, &fix));
    EXPECT_EQ(0, std::memcmp(dyn.out.data(), fix.out.data(), dyn.out.size() * 2)) << "H" << H;
    EXPECT_EQ(0, std::memcmp(dyn.lse.data(), fix.lse.data(), dyn.lse.size() * 4)) << "H" << H;
  }
}

TEST(DecodeGpu, GraphReplayAndRerunAreBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  for (const CaseSpec& c : {CaseSpec{4, 3, 128, 1024, 576, 61}, CaseSpec{8, 2, 64, 512, 256, 61, 0, true, false, true}}) {
    std::mt19937_64 rng(test::test_seed() + 7);
    const test::DecodeProblem p = make_problem(c, rng);
    test::DecodeOut a, b, g;
    ASSERT_TRUE(run_gpu(p, 0, false, &a));
    ASSERT_TRUE(run_gpu(p, 0, false, &b));
    ASSERT_TRUE(run_gpu(p, 0, true, &g));
    EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * 2));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.out.data(), g.out.data(), a.out.size() * 2));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), g.lse.data(), a.lse.size() * 4));
  }
}

// The scheduler kernel's metadata, read back and checked entry by entry against the host's view
// of the same partition: header, prefix sums, the cut (row pieces, balanced or at row starts, and
// whether their rules were applied right), part rows, the part start entries the dynamic decode
// reads first, and the combine's split-row table.
TEST(DecodeGpu, SchedulerTablesMatchHost) {
  SELKV_REQUIRE_GPU();
  using namespace selkv::decode;
  std::mt19937_64 rng(0x5c4ed);
  struct Sh { int B, S, H, K; bool dyn; };
  const Sh shapes[] = {{1, 1, 64, 2048, false}, {8, 1, 64, 2048, false}, {74, 2, 128, 2048, false},
                       {2, 2, 128, 576, false},  {256, 1, 128, 2048, true}, {9, 3, 64, 512, true},
                       {1, 4, 64, 2048, true},   {600, 1, 64, 128, true}, {2, 2, 128, 576, true},
                       {3, 1, 128, 128, true}};
  for (const Sh& sh : shapes)
    for (int num_sms : {0, 9, 132})
      for (int min_blocks : {0, 1, 3}) {
        const int rows = sh.B * sh.S, mb = sh.K / 64;
        std::vector<int32_t> len(size_t(sh.B), sh.K);
        if (sh.dyn)
          for (auto& l : len) {
            const int k = int(rng() % 8);
            l = k == 0 ? 0 : k == 1 ? -5 : k == 2 ? sh.K + 77 : k == 3 ? sh.K : int(rng() % uint64_t(sh.K + 1));
          }
        DevBuf dl(len.size() * 4);
        up(dl, len);
        DecodeShape shape{sh.B, sh.S, sh.H, sh.K, sh.dyn ? dl.as<int32_t>() : nullptr, num_sms};
        shape.min_blocks_per_part = min_blocks;
        DevBuf dmd(decode_metadata_size(sh.B, sh.S));
        CUDA_OK(cudaMemset(dmd.ptr, 0xA5, dmd.bytes));  // nothing read back may be left over
        DecodeMetadata plan;
        ST_OK(make_decode_metadata(shape, dmd.ptr, dmd.bytes, &plan, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int32_t> md(dmd.bytes / 4);
        CUDA_OK(cudaMemcpy(md.data(), dmd.ptr, dmd.bytes, cudaMemcpyDeviceToHost));
        const std::string what = "B=" + std::to_string(sh.B) + " S=" + std::to_string(sh.S) + " H=" +
                                 std::to_string(sh.H) + " K=" + std::to_string(sh.K) + (sh.dyn ? " dyn" : "") +
                                 " sms=" + std::to_string(num_sms) + " mb=" + std::to_string(min_blocks);
        // Host view: per-row lengths and blocks, prefix sums.
        auto len_of = [&](int r) {
          if (r >= rows) return 0;
          const int l = len[size_t(row_coord(r, sh.B).b)];
          return std::clamp(l, 0, sh.K);
        };
        std::vector<int32_t> P(size_t(rows) + 1, 0);
        for (int r = 0; r < rows; ++r) P[r + 1] = P[r] + (sh.dyn ? std::max((len_of(r) + 63) / 64, 1) : mb);
        const int T = P[rows];
        const int np = md[1];
        // Dynamic plans whose rows' pieces of min_blocks blocks all fit the grid take the row-piece cut;
        // at the default granularity, pieces of one block when all T blocks fit the grid and a row
        // is longer than min_blocks (one_block_parts_pay).
        int longest_row = 0;
        for (int r = 0; r < rows; ++r) longest_row = std::max(longest_row, P[r + 1] - P[r]);
        const bool one_block = sh.dyn && plan.min_blocks_per_part > 1 && min_blocks == 0 && T <= plan.num_sm_parts &&
                               longest_row > plan.min_blocks_per_part;
        ASSERT_EQ(one_block, sh.dyn && one_block_parts_pay(min_blocks == 0, T, longest_row, plan.min_blocks_per_part,
                                                           plan.num_sm_parts)) << what;
        const int unit = one_block ? 1 : plan.min_blocks_per_part;
        std::vector<int32_t> pieces;
        if (sh.dyn)
          for (int r = 0; r < rows; ++r)
            for (int j = 0; j < row_pieces(P[r + 1] - P[r], unit); ++j) pieces.push_back(P[r] + j * unit);
        const bool row_piece_cut = sh.dyn && int(pieces.size()) <= plan.num_sm_parts;
        pieces.push_back(T);
        ASSERT_EQ(md[0], T) << what;
        ASSERT_EQ(np, row_piece_cut ? int(pieces.size()) - 1 : effective_parts(T, plan.min_blocks_per_part, plan.num_sm_parts))
            << what;
        ASSERT_EQ(md[2], rows) << what;
        ASSERT_EQ(md[3], kMdMagic) << what;
        ASSERT_EQ(md[4], plan.min_blocks_per_part) << what;
        ASSERT_EQ(md[7], sh.K) << what;
        // The lengths snapshot the kernels read (K for fixed top-k).
        for (int b = 0; b < sh.B; ++b)
          ASSERT_EQ(md[md_lengths_offset(rows) + b], sh.dyn ? std::clamp(len[size_t(b)], 0, sh.K) : sh.K) << what << " b=" << b;
        for (int r = 0; r <= rows; ++r) ASSERT_EQ(md[kMdPrefix + r], P[r]) << what << " r=" << r;
        // The cut: at row starts exactly when that lengthens the longest part by <= min(kSplitCostBlocks,
        // balanced / 8).
        std::vector<int32_t> balanced(size_t(np) + 1), row_start(size_t(np) + 1);
        int longest = 0;
        for (int q = 0; q <= np; ++q) {
          balanced[q] = part_begin(q, T, np);
          row_start[q] = row_start_part_begin(P.data(), rows, T, np, q);
          if (q > 0) longest = std::max(longest, row_start[q] - row_start[q - 1]);
        }
        const int balanced_longest = (T - 1) / np + 1;
        const bool rs = !row_piece_cut && longest <= balanced_longest + std::min(balanced_longest / 8, int(kSplitCostBlocks));
        ASSERT_EQ(md[5], int(row_piece_cut ? DecodeCut::kRowPieces : rs ? DecodeCut::kRowStarts : DecodeCut::kBalanced))
            << what;
        const std::vector<int32_t>& begins = row_piece_cut ? pieces : rs ? row_start : balanced;
        ASSERT_EQ(begins[np], T) << what;  // the last entry's g1 below
        for (int q = 0; q < np; ++q) {
          const int r = row_containing(P.data(), rows, std::min(begins[q], T - 1));
          const int32_t want[kMdPartEntryInts] = {begins[q], begins[q + 1], r, P[r], P[r + 1],
                                                  P[std::min(r + 2, rows)], len_of(r), len_of(r + 1)};
          for (int i = 0; i < kMdPartEntryInts; ++i)
            ASSERT_EQ(md[kMdPartEntry + kMdPartEntryInts * q + i], want[i]) << what << " q=" << q << " i=" << i;
        }
        // Split-row table: split_row_of_part of the schedule view the kernels use, in part order.
        std::vector<SplitRow> want;
        for (int q = 0; q < np; ++q) {
          const SplitRow sr = sh.dyn ? split_row_of_part(DynamicSchedule(md.data(), rows, sh.K, plan.min_blocks_per_part,
                                                                         plan.num_sm_parts), q)
                                     : split_row_of_part(FixedSchedule(rows, sh.K, plan.min_blocks_per_part,
                                                                       plan.num_sm_parts), q);
          if (sr.num_parts > 0) want.push_back(sr);
        }
        ASSERT_EQ(md[kMdSplitCount], int(want.size())) << what;
        for (size_t i = 0; i < want.size(); ++i) {
          const int32_t* e = md.data() + kMdSplitRows + 4 * i;
          ASSERT_EQ(e[0], want[i].row) << what << " split " << i;
          ASSERT_EQ(e[1], want[i].first_part) << what << " split " << i;
          ASSERT_EQ(e[2], want[i].num_parts) << what << " split " << i;
          ASSERT_EQ(e[3], want[i].first_slot) << what << " split " << i;
        }
      }
}

// Golden vectors (independent torch fp64 reference), with and without topk_length.
TEST(DecodeGpu, GoldenVectors) {
  SELKV_REQUIRE_GPU();
  auto q = test::read_vector<uint16_t>("dec_q_bf16.bin");
  auto cache = test::read_vector<uint8_t>("dec_cache_u8.bin");
  auto idx = test::read_vector<int32_t>("dec_indices_i32.bin");
  auto tl = test::read_vector<int32_t>("dec_topk_length_i32.bin");
  auto out = test::read_vector<float>("dec_out_f32.bin");
  auto lse = test::read_vector<float>("dec_lse_f32.bin");
  auto dout = test::read_vector<float>("dec_dyn_out_f32.bin");
  auto dlse = test::read_vector<float>("dec_dyn_lse_f32.bin");
  SELKV_REQUIRE_VECTOR(q, "dec_q_bf16.bin");
  SELKV_REQUIRE_VECTOR(cache, "dec_cache_u8.bin");
  SELKV_REQUIRE_VECTOR(idx, "dec_indices_i32.bin");
  SELKV_REQUIRE_VECTOR(out, "dec_out_f32.bin");
  SELKV_REQUIRE_VECTOR(dout, "dec_dyn_out_f32.bin");
  test::DecodeProblem p;
  p.B = 2; p.S = 2; p.H = 64; p.K = 128; p.page = 61; p.num_blocks = 9;
  p.block_stride = 61 * fmt::kDsMlaRecordBytes;
  p.q = q; p.cache = cache; p.indices = idx;
  ASSERT_EQ(q.size(), size_t(2 * 2 * 64 * 576));
  ASSERT_EQ(cache.size(), size_t(9 * 61 * 656));
  ASSERT_EQ(idx.size(), size_t(2 * 2 * 128));
  for (int sms : {0, 3}) {
    test::DecodeOut g;
    if (run_gpu(p, sms, false, &g)) compare(g, out, lse, "golden fixed sms" + std::to_string(sms));
    test::DecodeProblem pd = p;
    pd.topk_length = tl;
    test::DecodeOut gd;
    if (run_gpu(pd, sms, false, &gd)) compare(gd, dout, dlse, "golden dynamic sms" + std::to_string(sms));
  }
}

// Issue 15: the smallest scales the sm_scale rule accepts (FLT_MIN, a subnormal) give the oracle's
// finite results on the GPU too, split rows included (3 SMs); 0 and what rounds to 0 in fp32 are
// rejected on both (DecodeChecks.SmScaleRule, PrefillChecks.SmScaleRuleSharedWithTheOracle).
TEST(DecodeGpu, TinyValidScalesMatchOracle) {
  SELKV_REQUIRE_GPU();
  const CaseSpec cases[] = {
      {4, 2, 64, 512, 128, 61, 0, true, true, /*dynamic=*/true},
      {2, 2, 128, 512, 256, 64},
  };
  for (const CaseSpec& c : cases) {
    for (float s : {FLT_MIN, 1e-40f}) {
      std::mt19937_64 rng(test::test_seed() ^ 0x5ca1e ^ uint64_t(c.H));
      test::DecodeProblem p = make_problem(c, rng);
      p.sm_scale = s;
      std::vector<float> ro, rl;
      test::decode_oracle(p, &ro, &rl);
      for (int sms : {0, 3}) {
        test::DecodeOut g;
        if (run_gpu(p, sms, false, &g)) compare(g, ro, rl, name(c, sms) + " sm_scale " + std::to_string(s));
      }
    }
  }
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
