// C5 decode with model1_fp8 records (d_qk 512) and the optional extra KV cache on the GPU vs the
// CPU oracle (DESIGN §5 tolerances): H 64 / 128, page sizes 2..576 on both caches, fixed and
// dynamic top-k on either cache (length 0 included), every garbage index class in both index
// tensors, NaN-poisoned unselected records and tails, attn_sink, empty rows, split schedules,
// graph replay bitwise equal to eager, and no extra cache. Skips without a GPU. Filter:
// --gtest_filter='*Model1Decode*'.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "decode/decode_params.h"
#include "gpu_test_util.h"
#include "model1_decode_util.h"
#include "reference/oracle.h"
#include "selkv/decode.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS  // the decode kernels are only built with the CUTLASS headers
namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::Model1DecodeCase;
using selkv::test::up;

struct GpuResult {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

struct RunOpts {
  int mode = 0;         // 0 eager, 1 plan + decode captured in a CUDA graph and replayed twice
  int num_sms = 0;      // 0: the device's
  int min_blocks = 0;   // 0: the library's granularity
  DecodePartials partials = DecodePartials::kAuto;
};

// Uploads the case, plans and decodes on a fresh stream (deadline wait), downloads out / lse.
void run_gpu(const Model1DecodeCase& c, const RunOpts& o, GpuResult* res, const std::string& what) {
  DevBuf dq(c.q.size() * 2), dc(c.main.bytes.size()), di(c.idx.size() * 4);
  DevBuf dx(std::max<size_t>(c.extra.bytes.size(), 16)), dxi(std::max<size_t>(c.idx2.size(), 1) * 4);
  DevBuf dl(std::max<size_t>(c.len1.size(), 1) * 4), dl2(std::max<size_t>(c.len2.size(), 1) * 4);
  DevBuf ds(std::max<size_t>(c.sink.size(), 1) * 4);
  const size_t n_out = c.out_size(), n_lse = c.lse_size();
  DevBuf dout(n_out * 2), dlse(n_lse * 4);
  up(dq, c.q);
  up(dc, c.main.bytes);
  up(di, c.idx);
  if (c.K2 > 0) {
    up(dx, c.extra.bytes);
    up(dxi, c.idx2);
  }
  if (c.dyn1) up(dl, c.len1);
  if (c.dyn2) up(dl2, c.len2);
  if (!c.sink.empty()) up(ds, c.sink);
  CUDA_OK(cudaMemset(dout.ptr, 0x7F, n_out * 2));  // poison outputs
  CUDA_OK(cudaMemset(dlse.ptr, 0x7F, n_lse * 4));

  DecodeShape shape{c.B, c.S_q, c.H, c.K, c.dyn1 ? dl.as<int32_t>() : nullptr, o.num_sms};
  shape.extra_topk = c.K2;
  shape.extra_topk_length = c.K2 > 0 && c.dyn2 ? dl2.as<int32_t>() : nullptr;
  shape.min_blocks_per_part = o.min_blocks;
  shape.partials = o.partials;
  DevBuf dmd(decode_metadata_size(c.B, c.S_q));
  SparseDecodeParams sp;
  sp.q = dq.ptr;
  sp.batch = c.B;
  sp.seq_q = c.S_q;
  sp.num_heads = c.H;
  sp.topk = c.K;
  sp.cache = c.main.view_at(dc.ptr);
  sp.indices = di.as<int32_t>();
  sp.topk_length = shape.topk_length;
  if (c.K2 > 0) {
    sp.extra_cache = c.extra.view_at(dx.ptr);
    sp.extra_indices = dxi.as<int32_t>();
    sp.extra_topk = c.K2;
    sp.extra_topk_length = shape.extra_topk_length;
  }
  sp.attn_sink = c.sink.empty() ? nullptr : ds.as<float>();
  sp.sm_scale = c.sm_scale;
  sp.out = dout.ptr;
  sp.lse = dlse.as<float>();
  set_contiguous_strides(&sp);

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  DecodeMetadata md;
  ST_OK(make_decode_metadata(shape, dmd.ptr, dmd.bytes, &md, stream));  // sizes the workspace
  DevBuf dws(decode_workspace_size(md));
  if (o.mode == 0) {
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
    ASSERT_TRUE(test::sync_or_abort(stream, what));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  ASSERT_TRUE(test::sync_or_abort(stream, what));
  CUDA_OK(cudaGetLastError());
  cudaStreamDestroy(stream);
  res->out.resize(n_out);
  res->lse.resize(n_lse);
  CUDA_OK(cudaMemcpy(res->out.data(), dout.ptr, n_out * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(res->lse.data(), dlse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
}

void oracle(const Model1DecodeCase& c, std::vector<float>* out, std::vector<float>* lse) {
  const ref::SparseDecodeRefArgs a = c.args(*out, *lse);
  ASSERT_TRUE(ref::check_sparse_decode_args(a).ok()) << ref::check_sparse_decode_args(a).to_string();
  ref::sparse_decode(a);
}

std::string name(const Model1DecodeCase::Spec& s, const RunOpts& o = {}) {
  return "B" + std::to_string(s.B) + " S" + std::to_string(s.S_q) + " H" + std::to_string(s.H) + " K" +
         std::to_string(s.K) + " page" + std::to_string(s.page) + (s.dyn1 ? " dyn" : "") + " K2 " +
         std::to_string(s.K2) + " page2 " + std::to_string(s.page2) + (s.dyn2 ? " dyn2" : "") +
         (s.sink ? " sink" : "") + " sms" + std::to_string(o.num_sms) + " minblk" + std::to_string(o.min_blocks) +
         (o.partials == DecodePartials::kFp32 ? " fp32" : o.partials == DecodePartials::kFp16 ? " fp16" : "") +
         " seed" + std::to_string(test::test_seed());
}

void check_case(const Model1DecodeCase::Spec& s, const std::vector<RunOpts>& runs = {RunOpts{}}) {
  std::mt19937_64 rng(test::test_seed() ^ (uint64_t(s.B) << 40) ^ (uint64_t(s.K) << 20) ^ (uint64_t(s.K2) << 8) ^
                      uint64_t(s.page * 131 + s.page2) ^ (uint64_t(s.H) << 50));
  const Model1DecodeCase c(s, rng);
  std::vector<float> ro, rl;
  oracle(c, &ro, &rl);
  for (const RunOpts& o : runs) {
    GpuResult g;
    run_gpu(c, o, &g, name(s, o));
    test::expect_decode_close(g.out, g.lse, ro, rl, name(s, o));
  }
}

Model1DecodeCase::Spec spec(int B, int S, int H, int K, int page, int K2, int page2, bool dyn1 = false,
                            bool dyn2 = false, bool sink = false) {
  Model1DecodeCase::Spec s;
  s.B = B;
  s.S_q = S;
  s.H = H;
  s.K = K;
  s.page = page;
  s.K2 = K2;
  s.page2 = page2;
  s.dyn1 = dyn1;
  s.dyn2 = dyn2;
  s.sink = sink;
  return s;
}

// Main cache alone (no extra cache): every page size FlashMLA tests, fixed and dynamic top-k.
TEST(Model1DecodeGpu, NoExtraCache) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128})
    for (int page : {2, 53, 61, 64, 69, 256, 576})
      for (bool dyn : {false, true}) check_case(spec(3, 2, H, page == 576 ? 576 : 128, page, 0, 2, dyn, false, dyn));
}

// Main + extra cache, fixed top-k on both: page sizes of both caches, several K / K2.
TEST(Model1DecodeGpu, ExtraCacheFixedTopk) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    for (auto [page, page2] : {std::pair{61, 2}, std::pair{64, 64}, std::pair{69, 2}, std::pair{256, 64},
                               std::pair{576, 2}, std::pair{2, 61}}) {
      check_case(spec(3, 2, H, 64, page, 64, page2));
      check_case(spec(2, 1, H, 128, page, 576, page2, false, false, true));
    }
  }
}

// Dynamic top-k on either cache or both (lengths 0, 1, K - 1, K, 33, 64, 70 in the patterns).
TEST(Model1DecodeGpu, ExtraCacheDynamicTopk) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128})
    for (auto [d1, d2] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}})
      for (auto [page, page2] : {std::pair{61, 2}, std::pair{64, 64}, std::pair{256, 69}}) {
        check_case(spec(6, 2, H, 128, page, 128, page2, d1, d2, true));
        check_case(spec(6, 1, H, 192, page, 64, page2, d1, d2, false));
      }
}

// Both lengths 0 for every row: out 0, lse -inf everywhere (one fully masked block per row).
TEST(Model1DecodeGpu, BothSelectionsEmpty) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    auto s = spec(3, 2, H, 64, 64, 64, 2, true, true, true);
    std::mt19937_64 rng(test::test_seed() + 99);
    Model1DecodeCase c(s, rng);
    c.len1.assign(size_t(c.B), 0);
    c.len2.assign(size_t(c.B), 0);
    GpuResult g;
    run_gpu(c, RunOpts{}, &g, name(s) + " all empty");
    for (uint16_t v : g.out) ASSERT_TRUE(v == 0 || v == 0x8000);
    for (float v : g.lse) ASSERT_TRUE(std::isinf(v) && v < 0);
  }
}

// Split schedules (many parts, small granularity: rows cut across parts, partials and the
// combine, with rows crossing from the main to the extra cache inside a part), both partial
// formats, H 64 and 128.
TEST(Model1DecodeGpu, SplitSchedules) {
  SELKV_REQUIRE_GPU();
  const std::vector<RunOpts> runs = {RunOpts{0, 8, 1, DecodePartials::kFp32}, RunOpts{0, 8, 1, DecodePartials::kFp16},
                                     RunOpts{0, 5, 3, DecodePartials::kAuto}, RunOpts{0, 0, 0, DecodePartials::kAuto}};
  for (int H : {64, 128}) {
    check_case(spec(4, 2, H, 256, 61, 512, 2), runs);
    check_case(spec(5, 1, H, 128, 64, 256, 64, true, true, true), runs);
  }
}

// NaN in a selected record (main or extra) makes that row NaN; NaN in unselected records and in
// tails past topk_length (make_indices points them at poisoned slots) changes nothing: the
// oracle and the GPU agree row by row (expect_decode_close checks NaN rows as such).
TEST(Model1DecodeGpu, NanRules) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    auto s = spec(3, 2, H, 128, 61, 128, 2, true, true, false);
    s.empty_row = 2;
    std::mt19937_64 rng(test::test_seed() + 5);
    Model1DecodeCase c(s, rng);
    // a NaN E4M3 code in a record row 0 selects in the extra cache, a NaN scale in one row 4
    // selects in the main cache
    auto first_valid = [](const std::vector<int32_t>& idx, size_t row, int K, int64_t live, int len) {
      for (int k = 0; k < std::min(K, len); ++k) {
        const int32_t i = idx[row * size_t(K) + size_t(k)];
        if (i >= 0 && i < live) return i;
      }
      return -1;
    };
    const int32_t sx = first_valid(c.idx2, 0, c.K2, c.extra.live, c.len2[0]);
    const int32_t sm = first_valid(c.idx, 4, c.K, c.main.live, c.len1[2]);
    if (sx >= 0) c.extra.bytes[size_t(c.extra.view().slot_offset(sx)) + 17] = 0x7f;
    if (sm >= 0) c.main.bytes[size_t(c.main.view().scale_offset(sm)) + 3] = 0xff;
    std::vector<float> ro, rl;
    oracle(c, &ro, &rl);
    GpuResult g;
    run_gpu(c, RunOpts{}, &g, name(s) + " nan");
    test::expect_decode_close(g.out, g.lse, ro, rl, name(s) + " nan");
  }
}

// CUDA-graph capture of plan + decode, replayed twice, equals eager bit for bit; a second eager
// run too (deterministic).
TEST(Model1DecodeGpu, GraphReplayAndRerunAreBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128})
    for (bool dyn : {false, true}) {
      auto s = spec(5, 2, H, 128, 69, 256, 2, dyn, dyn, true);
      std::mt19937_64 rng(test::test_seed() + 17);
      const Model1DecodeCase c(s, rng);
      GpuResult a, b, g;
      run_gpu(c, RunOpts{0, 0, 0}, &a, name(s) + " eager");
      run_gpu(c, RunOpts{0, 0, 0}, &b, name(s) + " eager 2");
      run_gpu(c, RunOpts{1, 0, 0}, &g, name(s) + " graph");
      EXPECT_EQ(a.out, b.out) << name(s);
      EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << name(s);
      EXPECT_EQ(a.out, g.out) << name(s);
      EXPECT_EQ(std::memcmp(a.lse.data(), g.lse.data(), a.lse.size() * 4), 0) << name(s);
    }
}

// Padded block strides on the main cache and larger batches (rows of many parts).
TEST(Model1DecodeGpu, PaddedStridesAndLargerBatches) {
  SELKV_REQUIRE_GPU();
  for (int H : {64, 128}) {
    auto s = spec(2, 1, H, 128, 64, 64, 64);
    s.stride_pad = 576;
    check_case(s);
    check_case(spec(37, 2, H, 128, 256, 512, 64, false, true, true));
    check_case(spec(16, 1, H, 576, 61, 576, 53, true, true, false));
  }
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
