// C5 sparse MLA decode on the GPU vs the CPU oracle (DESIGN §5 tolerances). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "decode/decode_params.h"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/decode.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS  // the decode kernels are only built with the CUTLASS headers
namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::up;
using selkv::test::bf16;
using selkv::test::f32;

#define ST_OK(x)                                   \
  do {                                             \
    const ::selkv::Status _st = (x);               \
    ASSERT_TRUE(_st.ok()) << _st.to_string();      \
  } while (0)

struct Problem {
  int B = 1, S = 1, H = 64, K = 64;
  int64_t num_blocks = 0;
  int page = 64;
  int64_t block_stride = 0;
  std::vector<uint16_t> q;
  std::vector<uint8_t> cache;
  std::vector<int32_t> indices;
  std::vector<int32_t> topk_length;  // empty: fixed
  std::vector<float> sink;           // empty: none
  float sm_scale = std::pow(576.f, -0.55f);
  DecodePartials partials = DecodePartials::kAuto;  // DecodeShape::partials of the plan
  int64_t num_slots() const { return num_blocks * page; }
};

struct CaseSpec {
  int B, S, H, s_kv, K, page;
  int stride_pad = 0;            // extra bytes per block (multiple of 16)
  bool garbage = true;           // scatter -1, -7, INT_MAX, >= num_slots inside rows
  bool all_invalid_row = true;   // one row with no valid index
  bool dynamic = false;
  bool sink = false;
  float data_std = 0.1f;         // std of the cached latent and rope values (q's is 0.1 / data_std,
                                 // so the logits keep the same spread at any data scale)
};

// Builds q, a NaN-filled cache with real records only at referenced slots, and indices.
Problem make_problem(const CaseSpec& c, std::mt19937_64& rng) {
  Problem p;
  p.B = c.B; p.S = c.S; p.H = c.H; p.K = c.K; p.page = c.page;
  const int64_t tokens = int64_t(c.B) * c.s_kv;
  p.num_blocks = (tokens + c.page - 1) / c.page + 1;  // one spare block, never referenced
  p.block_stride = int64_t(c.page) * fmt::kDsMlaRecordBytes + c.stride_pad;
  p.cache.assign(size_t(p.num_blocks * p.block_stride), 0xFF);  // NaN everywhere
  // q's std scales inversely with the cache's: the logits keep one spread (~0.4) at any data scale.
  // With q at std 1 and |K| ~ 3e4 the logits reach 6e4, where one fp32 ulp (0.004) of the score
  // moves a near-tied softmax weight by percents (a seed-1 row with a top gap of 1.24 missed the
  // out tolerance by 2.6 %): a test of fp32 score precision, not of the partials' range.
  p.q = test::randn_bf16(size_t(c.B) * c.S * c.H * fmt::kQkDim, 0.1f / c.data_std, rng);
  const int64_t ns = p.num_slots();
  p.indices.resize(size_t(c.B) * c.S * c.K);
  std::vector<char> referenced(size_t(ns), 0);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  const int32_t garbage[] = {-1, -7, INT_MAX, int32_t(ns), int32_t(ns + 5), INT_MIN};
  if (c.dynamic) {
    const int lens[] = {0, 1, 17, 63, 64, 65, 127, 128};
    for (int b = 0; b < c.B; ++b) p.topk_length.push_back(std::min(lens[b % 8] + (b / 8) * 64, c.K));
  }
  std::vector<int32_t> perm(c.s_kv);
  for (int b = 0; b < c.B; ++b) {
    for (int s = 0; s < c.S; ++s) {
      int32_t* row = &p.indices[(size_t(b) * c.S + s) * c.K];
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < c.K; ++k) row[k] = int32_t(int64_t(b) * c.s_kv + perm[k % c.s_kv]);
      if (c.garbage)
        for (int k = 0; k < c.K; ++k)
          if (u01(rng) < 0.06f) row[k] = garbage[rng() % 6];
      const bool empty_row = c.all_invalid_row && b == c.B - 1 && s == 0 && c.B * c.S > 1;
      if (empty_row)
        for (int k = 0; k < c.K; ++k) row[k] = garbage[k % 6];
      if (c.dynamic)  // poisoned suffix past topk_length: must never be read
        for (int k = p.topk_length[b]; k < c.K; ++k) row[k] = (k % 3 == 0) ? -1 : INT_MAX;
      const int limit = c.dynamic ? p.topk_length[b] : c.K;
      for (int k = 0; k < limit; ++k)
        if (row[k] >= 0 && row[k] < ns) referenced[row[k]] = 1;
    }
  }
  PagedKvCache view;
  view.num_blocks = p.num_blocks; view.page_size = p.page; view.block_stride_bytes = p.block_stride;
  for (int64_t slot = 0; slot < ns; ++slot) {
    if (!referenced[slot]) continue;
    auto latent = test::randn_bf16(fmt::kNopeDim, c.data_std, rng);
    auto rope = test::randn_bf16(fmt::kRopeDim, c.data_std, rng);
    ref::encode_record(latent.data(), rope.data(), KvFormat::kDsMlaFp8, ScaleMode::kPow2,
                       p.cache.data() + view.slot_offset(slot));
  }
  if (c.sink) {
    std::normal_distribution<float> d(0.f, 1.f);
    for (int h = 0; h < c.H; ++h) p.sink.push_back(d(rng));
  }
  return p;
}

struct Result {
  std::vector<uint16_t> out;  // bf16 bits
  std::vector<float> lse;
};

void oracle(const Problem& p, std::vector<float>* out, std::vector<float>* lse) {
  out->assign(size_t(p.B) * p.S * p.H * fmt::kVDim, 0.f);
  lse->assign(size_t(p.B) * p.S * p.H, 0.f);
  ref::SparseDecodeRefArgs a;
  a.q = p.q.data(); a.B = p.B; a.S_q = p.S; a.H = p.H;
  a.cache.data = p.cache.data(); a.cache.num_blocks = p.num_blocks; a.cache.page_size = p.page;
  a.cache.block_stride_bytes = p.block_stride;
  a.indices = p.indices.data(); a.K = p.K;
  a.topk_length = p.topk_length.empty() ? nullptr : p.topk_length.data();
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.sink.empty() ? nullptr : p.sink.data();
  a.out = out->data(); a.lse = lse->data();
  ref::sparse_decode(a);
}

// Runs the GPU op. mode: 0 eager, 1 captured into a CUDA graph (metadata + decode) and replayed.
// num_sms 0 = the device's; min_blocks 0 = the library's split granularity.
void run_gpu(const Problem& p, int num_sms, int mode, Result* res, bool use_topk_length = true,
             int min_blocks = 0) {
  DevBuf dq(p.q.size() * 2), dc(p.cache.size()), di(p.indices.size() * 4);
  DevBuf dl(std::max<size_t>(p.topk_length.size(), 1) * 4), ds(std::max<size_t>(p.sink.size(), 1) * 4);
  const size_t n_out = size_t(p.B) * p.S * p.H * fmt::kVDim, n_lse = size_t(p.B) * p.S * p.H;
  DevBuf dout(n_out * 2), dlse(n_lse * 4);
  up(dq, p.q); up(dc, p.cache); up(di, p.indices);
  const bool dyn = use_topk_length && !p.topk_length.empty();
  if (dyn) up(dl, p.topk_length);
  if (!p.sink.empty()) up(ds, p.sink);
  CUDA_OK(cudaMemset(dout.ptr, 0x7F, n_out * 2));  // poison outputs
  CUDA_OK(cudaMemset(dlse.ptr, 0x7F, n_lse * 4));

  DecodeShape shape{p.B, p.S, p.H, p.K, dyn ? dl.as<int32_t>() : nullptr, num_sms};
  shape.min_blocks_per_part = min_blocks;
  shape.partials = p.partials;
  DevBuf dmd(decode_metadata_size(p.B, p.S));
  SparseDecodeParams sp;
  sp.q = dq.ptr; sp.batch = p.B; sp.seq_q = p.S; sp.num_heads = p.H; sp.topk = p.K;
  sp.cache.data = dc.ptr; sp.cache.num_blocks = p.num_blocks; sp.cache.page_size = p.page;
  sp.cache.block_stride_bytes = p.block_stride;
  sp.indices = di.as<int32_t>();
  sp.topk_length = shape.topk_length;
  sp.attn_sink = p.sink.empty() ? nullptr : ds.as<float>();
  sp.sm_scale = p.sm_scale;
  sp.out = dout.ptr; sp.lse = dlse.as<float>();
  set_contiguous_strides(&sp);

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  DecodeMetadata md;
  ST_OK(make_decode_metadata(shape, dmd.ptr, dmd.bytes, &md, stream));  // sizes the workspace
  DevBuf dws(decode_workspace_size(md));
  if (mode == 0) {
    ST_OK(sparse_mla_decode(sp, md, dws.ptr, dws.bytes, stream));
  } else {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    ST_OK(make_decode_metadata(shape, dmd.ptr, dmd.bytes, &md, stream));
    ST_OK(sparse_mla_decode(sp, md, dws.ptr, dws.bytes, stream));
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaMemsetAsync(dout.ptr, 0x7F, n_out * 2, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));  // replay twice
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  cudaStreamDestroy(stream);
  res->out.resize(n_out);
  res->lse.resize(n_lse);
  CUDA_OK(cudaMemcpy(res->out.data(), dout.ptr, n_out * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(res->lse.data(), dlse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
}

// DESIGN §5 tolerances, empty and NaN rows: test::expect_decode_close (attn_check_util.h).
void compare(const Result& g, const std::vector<float>& ref_out, const std::vector<float>& ref_lse,
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
  Problem p = make_problem(c, rng);
  std::vector<float> ro, rl;
  oracle(p, &ro, &rl);
  for (DecodePartials f : formats) {
    p.partials = f;
    Result g;
    run_gpu(p, num_sms, 0, &g, true, min_blocks);
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

// Split granularity: rows split up to 32 ways (the combine merges them 8 partials per load
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
}

// Split rows at any data scale: both partial formats (DecodePartials; fp16 is scaled per head
// and d_v half, decode_params.h) must neither overflow (|cache| ~ 3e6: the
// normalized partials reach ~1e5, beyond fp16's 65504) nor lose precision to subnormals
// (|cache| ~ 1e-6: |out| ~ 4e-8). compare()'s cosine distance is the scale-free check of DESIGN §5.
TEST(DecodeGpu, SplitRowsAtAnyDataScale) {
  SELKV_REQUIRE_GPU();
  for (float std_dev : {3e6f, 1e-6f})
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
    Problem p = make_problem(c, rng);
    Result dyn, fix;
    run_gpu(p, 1, 0, &dyn);
    Problem q = p;
    for (int b = 0; b < p.B; ++b)
      for (int s = 0; s < p.S; ++s)
        for (int k = p.topk_length[b]; k < p.K; ++k) q.indices[(size_t(b) * p.S + s) * p.K + k] = -1;
    run_gpu(q, 1, 0, &fix, /*use_topk_length=*/false);
    EXPECT_EQ(0, std::memcmp(dyn.out.data(), fix.out.data(), dyn.out.size() * 2)) << "H" << H;
    EXPECT_EQ(0, std::memcmp(dyn.lse.data(), fix.lse.data(), dyn.lse.size() * 4)) << "H" << H;
  }
}

TEST(DecodeGpu, GraphReplayAndRerunAreBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  for (const CaseSpec& c : {CaseSpec{4, 3, 128, 1024, 576, 61}, CaseSpec{8, 2, 64, 512, 256, 61, 0, true, false, true}}) {
    std::mt19937_64 rng(test::test_seed() + 7);
    Problem p = make_problem(c, rng);
    Result a, b, g;
    run_gpu(p, 0, 0, &a);
    run_gpu(p, 0, 0, &b);
    run_gpu(p, 0, 1, &g);
    EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * 2));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.out.data(), g.out.data(), a.out.size() * 2));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), g.lse.data(), a.lse.size() * 4));
  }
}

// The scheduler kernel's metadata, read back and checked entry by entry against the host's view
// of the same partition: header, prefix sums, the cut (balanced or at row starts, and whether
// the row-start rule was applied right), part rows, the part start entries the dynamic decode
// reads first, and the combine's split-row table.
TEST(DecodeGpu, SchedulerTablesMatchHost) {
  SELKV_REQUIRE_GPU();
  using namespace selkv::decode;
  std::mt19937_64 rng(0x5c4ed);
  struct Sh { int B, S, H, K; bool dyn; };
  const Sh shapes[] = {{1, 1, 64, 2048, false}, {8, 1, 64, 2048, false}, {74, 2, 128, 2048, false},
                       {2, 2, 128, 576, false},  {256, 1, 128, 2048, true}, {9, 3, 64, 512, true},
                       {1, 4, 64, 2048, true},   {600, 1, 64, 128, true}};
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
        ASSERT_EQ(md[0], T) << what;
        ASSERT_EQ(np, effective_parts(T, plan.min_blocks_per_part, plan.num_sm_parts)) << what;
        ASSERT_EQ(md[2], rows) << what;
        ASSERT_EQ(md[3], kMdMagic) << what;
        ASSERT_EQ(md[4], plan.min_blocks_per_part) << what;
        ASSERT_EQ(md[7], sh.K) << what;
        // The lengths snapshot the kernels read (K for fixed top-k).
        for (int b = 0; b < sh.B; ++b)
          ASSERT_EQ(md[md_lengths_offset(rows) + b], sh.dyn ? std::clamp(len[size_t(b)], 0, sh.K) : sh.K) << what << " b=" << b;
        for (int r = 0; r <= rows; ++r) ASSERT_EQ(md[kMdPrefix + r], P[r]) << what << " r=" << r;
        // The cut: at row starts exactly when that lengthens the longest part by <= kSplitCostBlocks.
        std::vector<int32_t> balanced(size_t(np) + 1), row_start(size_t(np) + 1);
        int longest = 0;
        for (int q = 0; q <= np; ++q) {
          balanced[q] = part_begin(q, T, np);
          row_start[q] = row_start_part_begin(P.data(), rows, T, np, q);
          if (q > 0) longest = std::max(longest, row_start[q] - row_start[q - 1]);
        }
        const int balanced_longest = (T - 1) / np + 1;
        const bool rs = longest <= balanced_longest + std::min(balanced_longest, int(kSplitCostBlocks));
        ASSERT_EQ(md[5], rs ? 1 : 0) << what;
        const std::vector<int32_t>& begins = rs ? row_start : balanced;
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
  Problem p;
  p.B = 2; p.S = 2; p.H = 64; p.K = 128; p.page = 61; p.num_blocks = 9;
  p.block_stride = 61 * fmt::kDsMlaRecordBytes;
  p.q = q; p.cache = cache; p.indices = idx;
  ASSERT_EQ(q.size(), size_t(2 * 2 * 64 * 576));
  ASSERT_EQ(cache.size(), size_t(9 * 61 * 656));
  ASSERT_EQ(idx.size(), size_t(2 * 2 * 128));
  for (int sms : {0, 3}) {
    Result g;
    run_gpu(p, sms, 0, &g);
    compare(g, out, lse, "golden fixed sms" + std::to_string(sms));
    Problem pd = p;
    pd.topk_length = tl;
    Result gd;
    run_gpu(pd, sms, 0, &gd);
    compare(gd, dout, dlse, "golden dynamic sms" + std::to_string(sms));
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
      Problem p = make_problem(c, rng);
      p.sm_scale = s;
      std::vector<float> ro, rl;
      oracle(p, &ro, &rl);
      for (int sms : {0, 3}) {
        Result g;
        run_gpu(p, sms, 0, &g);
        compare(g, ro, rl, name(c, sms) + " sm_scale " + std::to_string(s));
      }
    }
  }
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
