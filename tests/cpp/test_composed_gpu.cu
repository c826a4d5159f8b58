// Composed prefill paths (selkv/composed.h) on the GPU vs the CPU oracle end to end:
//   (a) FP8 paged cache + physical indices -> C4 -> C7 (selected and full-pool modes),
//   (b) C3 gather of each request's chunk -> C7 with chunk-relative indices.
// The workspace must match the oracle's bit for bit (both start from the same poison, so rows the
// op must not touch are checked too); out / max_logits / lse use the prefill tolerances
// (out |err| < 8e-4 or rel < 3.01/128, cosine distance < 7e-6; stats |err| < 1e-6 or rel <
// 2.01/65536). In (a) records no valid index references are 0xFF (NaN codes and scales), in (b)
// only gathered positions hold records and the workspace's gap rows stay NaN, so stray reads show.
// Skips without a GPU; failures print the seed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "selkv/composed.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
#include "attn_gpu_runner.h"

namespace {

using namespace selkv;
using selkv::test::test_seed;

// ---- (a) C4 -> C7 ---------------------------------------------------------------------------------
// Cases are test::DqGenOpts {format, page, num_blocks, T, H, K, dynamic}; make_dq_problem
// (attn_gpu_runner.h) builds them: token t with t % 13 == 4 has no valid entry, records only where a
// valid entry points (every other byte 0xFF: NaN codes and scales).
using DqCase = test::DqGenOpts;

// The index rows carry 64 garbage entries past K (a non-contiguous indices_token_stride) and the
// workspace 256 bytes past the required size, which must stay as the poison left them.
void run_dequant_case(DqCase c, uint64_t salt, bool graph = false, test::ComposedOut* keep = nullptr) {
  c.idx_pad = 64;
  c.ws_slack = 256;
  std::mt19937_64 rng(test_seed() * 1000033ull + salt);
  const test::DqProblem p = test::make_dq_problem(c, rng);
  const std::string what = test::dq_name(p) + (graph ? " graph" : "");
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + what);
  test::check_dq_case(p, what, keep, graph);
}

TEST(ComposedGpu, DequantPrefillSelectedMatchesOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 1;
  // N = T * K < P: selected rows only.
  run_dequant_case({KvFormat::kDsMlaFp8, 64, 80, 21, 128, 128, true}, salt++);   // P 5120 > N 2688
  run_dequant_case({KvFormat::kNopeFp8, 61, 90, 21, 64, 128, false}, salt++);    // P 5490
  run_dequant_case({KvFormat::kDsMlaFp8, 2, 3000, 5, 64, 576, false}, salt++);   // page 2, K = 64 * 9
  run_dequant_case({KvFormat::kNopeFp8, 64, 60, 3, 128, 1024, true}, salt++);
}

TEST(ComposedGpu, DequantPrefillFullPoolMatchesOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 100;
  // N = T * K >= P: whole pool dequantized, indices kept.
  run_dequant_case({KvFormat::kDsMlaFp8, 64, 10, 40, 128, 128, true}, salt++);   // P 640 < N 5120
  run_dequant_case({KvFormat::kNopeFp8, 61, 9, 33, 64, 192, false}, salt++);
  run_dequant_case({KvFormat::kNopeFp8, 2, 100, 17, 128, 2048, true}, salt++);   // P 200 < K
}

TEST(ComposedGpu, DequantPrefillGraphReplayBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  test::ComposedOut e, g;
  run_dequant_case({KvFormat::kDsMlaFp8, 64, 40, 11, 128, 256, true}, 300, false, &e);
  run_dequant_case({KvFormat::kDsMlaFp8, 64, 40, 11, 128, 256, true}, 300, true, &g);
  ASSERT_FALSE(e.ws.empty());  // both runs completed
  ASSERT_FALSE(g.ws.empty());
  EXPECT_EQ(e.o.out, g.o.out);
  EXPECT_EQ(0, std::memcmp(e.o.lse.data(), g.o.lse.data(), e.o.lse.size() * 4));
  EXPECT_EQ(e.ws, g.ws);
}

// ---- (b) C3 -> C7 ---------------------------------------------------------------------------------
// Cases are test::GatherGenOpts {format, page, reqs, T, H, K, dynamic}; make_gather_problem
// (attn_gpu_runner.h) builds them: random odd starts and lengths, requests packed in a shuffled
// order with unwritten gap rows, token t with t % 11 == 3 has no valid entry.
using GaCase = test::GatherGenOpts;

// As in (a): 64 garbage entries past K in each index row, 256 workspace bytes past the required
// size that must stay as the poison left them.
void run_gather_case(GaCase c, uint64_t salt, bool graph = false, test::ComposedOut* keep = nullptr) {
  c.idx_pad = 64;
  c.ws_slack = 256;
  std::mt19937_64 rng(test_seed() * 1000037ull + salt);
  const test::GatherProblem p = test::make_gather_problem(c, rng);
  const std::string what = test::gather_name(p) + (graph ? " graph" : "");
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + what);
  test::check_gather_case(p, what, keep, graph);
}

TEST(ComposedGpu, GatherPrefillMatchesOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 500;
  run_gather_case({KvFormat::kDsMlaFp8, 64, 4, 37, 128, 128, false}, salt++);
  run_gather_case({KvFormat::kDsMlaFp8, 61, 3, 29, 64, 576, true}, salt++);
  run_gather_case({KvFormat::kNopeFp8, 2, 5, 23, 128, 256, true}, salt++);
  run_gather_case({KvFormat::kNopeFp8, 69, 2, 19, 64, 64, false}, salt++);
}

TEST(ComposedGpu, GatherPrefillGraphReplayBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  test::ComposedOut e, g;
  run_gather_case({KvFormat::kDsMlaFp8, 64, 3, 13, 128, 192, true}, 600, false, &e);
  run_gather_case({KvFormat::kDsMlaFp8, 64, 3, 13, 128, 192, true}, 600, true, &g);
  ASSERT_FALSE(e.ws.empty());  // both runs completed
  ASSERT_FALSE(g.ws.empty());
  EXPECT_EQ(e.o.out, g.o.out);
  EXPECT_EQ(0, std::memcmp(e.o.lse.data(), g.o.lse.data(), e.o.lse.size() * 4));
  EXPECT_EQ(e.ws, g.ws);
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
