// C4 selected-row dequant on the GPU vs the CPU oracle: bit-exact workspace (every byte, poison
// included) and remapped indices. Skips without a GPU. Failures print the seed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/dequant.h"
#include "test_util.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::down;
using selkv::test::test_seed;

struct Case {
  KvFormat format;
  int page;
  int64_t num_blocks;
  int64_t T;
  int K;
  bool dynamic;
  bool all_invalid = false;
  bool in_place = false;
  bool dense = false;  // row strides == K (16-byte index vectors in the full-pool kernel)
};

void run_case(const Case& c, uint64_t salt, bool graph = false) {
  const std::string what = "format=" + std::to_string(int(c.format)) + " page=" + std::to_string(c.page) +
                           " blocks=" + std::to_string(c.num_blocks) + " T=" + std::to_string(c.T) +
                           " K=" + std::to_string(c.K) + " dyn=" + std::to_string(c.dynamic);
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + what);
  std::mt19937_64 rng(test_seed() * 1000003ull + salt);
  const int D = fmt::dequant_dim(c.format);
  const bool m1 = c.format == KvFormat::kModel1Fp8;
  // page_size * record_bytes for the in-record formats; model1_fp8: padded to a multiple of 576.
  const int64_t stride = fmt::page_bytes(c.format, c.page) + 16 * int64_t(rng() % 3);
  const int64_t P = c.num_blocks * c.page;
  const PagedKvCache host_view{nullptr, c.num_blocks, c.page, stride, c.format};

  // Cache: garbage bytes everywhere, real records at every slot (pow2 and amax scales mixed;
  // model1_fp8: pow2, tile magnitudes 2^-12 .. 2^11).
  std::vector<uint8_t> cache(size_t(c.num_blocks * stride));
  for (auto& b : cache) b = uint8_t(rng());
  std::vector<uint16_t> lat(512), rope(64);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t s = 0; s < P; ++s) {
    for (int i = 0; i < 512; ++i) {
      const float mag = m1 ? std::ldexp(1.f, int((s * 7 + i / 64) % 24) - 12) : 1.f;
      lat[size_t(i)] = test::bf16(nd(rng) * mag);
    }
    for (auto& x : rope) x = test::bf16(nd(rng));
    ref::encode_slot(lat.data(), rope.data(), (s & 1) && !m1 ? ScaleMode::kAmax : ScaleMode::kPow2, host_view,
                     cache.data(), s);
  }
  const int64_t idx_stride = c.K + (c.in_place || c.dense ? 0 : 3);
  std::vector<int32_t> idx(size_t(std::max<int64_t>(c.T, 1) * idx_stride), 0x5a5a5a5a);
  const int32_t garbage[] = {-1, INT_MIN, int32_t(P), int32_t(P + 1), INT_MAX, -7};
  for (int64_t t = 0; t < c.T; ++t)
    for (int k = 0; k < c.K; ++k) {
      const int r = int(rng() % 10);
      int32_t v = int32_t(rng() % uint64_t(P));
      if (c.all_invalid || r == 0) v = garbage[rng() % 6];
      else if (r == 1 && k > 0) v = idx[size_t(t * idx_stride + k - 1)];  // duplicate
      idx[size_t(t * idx_stride + k)] = v;
    }
  // model1_fp8, selected mode: every slot no index names gets NaN bytes (E4M3 0xFF codes, RoPE
  // 0xFFFF, UE8M0 0xFF scales), so a read of the wrong record or scale group shows up as NaN.
  if (m1 && dequant_selected_mode(c.T, c.K, P) == DequantMode::kSelected) {
    std::vector<char> named(size_t(P), 0);
    for (int64_t t = 0; t < c.T; ++t)
      for (int k = 0; k < c.K; ++k) {
        const int32_t v = idx[size_t(t * idx_stride + k)];
        if (v >= 0 && v < P) named[size_t(v)] = 1;
      }
    for (int64_t s = 0; s < P; ++s) {
      if (named[size_t(s)]) continue;
      std::memset(cache.data() + host_view.slot_offset(s), 0xFF, 576);
      std::memset(cache.data() + host_view.scale_offset(s), 0xFF, 8);
    }
  }
  std::vector<int32_t> len(size_t(std::max<int64_t>(c.T, 1)));
  for (auto& l : len) {
    const int r = int(rng() % 4);
    l = r == 0 ? -3 : r == 1 ? c.K + 5 : int32_t(rng() % uint64_t(c.K + 1));
  }

  const int64_t rows = dequant_selected_workspace_rows(c.T, c.K, P);
  const int64_t ws_stride = D + 8 * int64_t(rng() % 2);
  std::vector<uint16_t> ws(size_t(std::max<int64_t>(rows, 1) * ws_stride), 0xFFC1);  // NaN poison
  const int64_t out_stride = c.in_place ? idx_stride : c.dense ? c.K : c.K + 1;
  std::vector<int32_t> out(size_t(std::max<int64_t>(c.T, 1) * out_stride), 0x77777777);

  DevBuf dcache(cache.size()), didx(idx.size() * 4), dlen(len.size() * 4), dws(ws.size() * 2),
      dout(out.size() * 4);
  CUDA_OK(cudaMemcpy(dcache.ptr, cache.data(), cache.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(didx.ptr, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dlen.ptr, len.data(), len.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dws.ptr, ws.data(), ws.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dout.ptr, out.data(), out.size() * 4, cudaMemcpyHostToDevice));

  DequantSelectedParams p;
  p.cache = PagedKvCache{dcache.ptr, c.num_blocks, c.page, stride, c.format};
  p.indices = didx.as<int32_t>();
  p.indices_row_stride = idx_stride;
  p.topk_length = c.dynamic ? dlen.as<int32_t>() : nullptr;
  p.num_tokens = c.T;
  p.topk = c.K;
  p.workspace = dws.ptr;
  p.workspace_rows = rows;
  p.workspace_row_stride = ws_stride;
  p.out_indices = c.in_place ? didx.as<int32_t>() : dout.as<int32_t>();
  p.out_indices_row_stride = out_stride;

  if (graph) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const Status st = dequant_selected_kv(p, s);
    CUDA_OK(cudaStreamEndCapture(s, &g));
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaGraphLaunch(ge, s));  // idempotent (not in place)
    CUDA_OK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  } else {
    const Status st = dequant_selected_kv(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_OK(cudaDeviceSynchronize());
  }

  DequantSelectedParams h = p;
  h.cache.data = cache.data();
  h.indices = idx.data();
  h.topk_length = c.dynamic ? len.data() : nullptr;
  h.workspace = ws.data();
  h.out_indices = c.in_place ? idx.data() : out.data();
  ASSERT_TRUE(ref::dequant_selected(h).ok());

  const auto gws = down<uint16_t>(dws, ws.size());
  const auto gout = c.in_place ? down<int32_t>(didx, idx.size()) : down<int32_t>(dout, out.size());
  const auto& hout = c.in_place ? idx : out;
  size_t bad_ws = 0, first_ws = 0, bad_idx = 0, first_idx = 0;
  for (size_t i = 0; i < ws.size(); ++i)
    if (gws[i] != ws[i] && bad_ws++ == 0) first_ws = i;
  for (size_t i = 0; i < hout.size(); ++i)
    if (gout[i] != hout[i] && bad_idx++ == 0) first_idx = i;
  EXPECT_EQ(bad_ws, 0u) << "first workspace mismatch at element " << first_ws << " (row "
                        << first_ws / ws_stride << "): gpu " << gws[first_ws] << " ref " << ws[first_ws];
  EXPECT_EQ(bad_idx, 0u) << "first index mismatch at " << first_idx << ": gpu " << gout[first_idx]
                         << " ref " << hout[first_idx];
}

TEST(DequantSelectedGpu, SelectedPathBitExact) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 1;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (int page : {2, 61, 64})
      for (bool dyn : {false, true}) {
        const int64_t blocks = 4096 / page + 3;  // P ~ 4.1K > N = 13 * 160 = 2080
        run_case({f, page, blocks, 13, 160, dyn}, salt++);
      }
}

TEST(DequantSelectedGpu, FullPoolPathBitExact) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 100;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (int page : {2, 61, 64})
      for (bool dyn : {false, true}) {
        const int64_t blocks = 600 / page + 1;  // P ~ 600 <= N = 21 * 64
        run_case({f, page, blocks, 21, 64, dyn}, salt++);
      }
}

TEST(DequantSelectedGpu, EdgeCases) {
  SELKV_REQUIRE_GPU();
  run_case({KvFormat::kDsMlaFp8, 61, 50, 7, 128, false, /*all_invalid=*/true}, 200);   // selected
  run_case({KvFormat::kNopeFp8, 2, 100, 7, 128, true, /*all_invalid=*/true}, 201);     // full pool
  run_case({KvFormat::kDsMlaFp8, 64, 10, 0, 128, false}, 202);                         // T = 0
  run_case({KvFormat::kNopeFp8, 64, 10, 5, 0, false}, 203);                            // K = 0
  run_case({KvFormat::kDsMlaFp8, 61, 40, 3, 333, true, false, /*in_place=*/true}, 204);  // in place, selected
  run_case({KvFormat::kNopeFp8, 2, 200, 9, 64, false, false, /*in_place=*/true}, 205);   // in place, full
  run_case({KvFormat::kDsMlaFp8, 2, 1, 3, 1, false}, 206);                             // N > P = 2
}

TEST(DequantSelectedGpu, GraphReplayMatchesOracle) {
  SELKV_REQUIRE_GPU();
  run_case({KvFormat::kDsMlaFp8, 64, 70, 11, 256, true}, 300, /*graph=*/true);  // selected
  run_case({KvFormat::kNopeFp8, 61, 30, 40, 64, true}, 301, /*graph=*/true);    // full pool
}

// Dense strides (K % 4 == 0): the full-pool kernel copies the indices as 16-byte vectors; with
// topk_length the window cuts inside a vector. The last two cases are large enough that both
// kernels' grid-stride loops run several rounds (more work than one grid step covers).
TEST(DequantSelectedGpu, DenseStridesAndMultiTaskWarps) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 400;
  for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8})
    for (bool dyn : {false, true}) {
      run_case({f, 61, 600 / 61 + 1, 21, 64, dyn, false, false, /*dense=*/true}, salt++);  // full pool
      run_case({f, 64, 41, 13, 160, dyn, false, false, /*dense=*/true}, salt++);          // selected
    }
  run_case({KvFormat::kDsMlaFp8, 64, 400, 64, 2048, true, false, false, /*dense=*/true}, salt++);   // full pool, P = 25.6K
  run_case({KvFormat::kDsMlaFp8, 64, 2600, 80, 2048, true, false, false, /*dense=*/true}, salt++);  // selected, N = 160K
}

// The size check runs before any device call: no GPU needed.
// model1_fp8: 448 codes in 7 UE8M0-scaled tiles read from the page tail, rows of 512; odd pages.
TEST(DequantSelectedGpu, Model1BitExact) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 500;
  for (int page : {1, 2, 61, 64, 69})
    for (bool dyn : {false, true}) {
      run_case({KvFormat::kModel1Fp8, page, 4096 / page + 3, 13, 160, dyn}, salt++);  // selected
      run_case({KvFormat::kModel1Fp8, page, 600 / page + 1, 21, 64, dyn}, salt++);   // full pool
    }
  run_case({KvFormat::kModel1Fp8, 61, 600 / 61 + 1, 21, 64, true, false, false, /*dense=*/true}, salt++);
  run_case({KvFormat::kModel1Fp8, 64, 41, 13, 160, true, false, false, /*dense=*/true}, salt++);
  run_case({KvFormat::kModel1Fp8, 61, 50, 7, 128, false, /*all_invalid=*/true}, salt++);
  run_case({KvFormat::kModel1Fp8, 61, 40, 3, 333, true, false, /*in_place=*/true}, salt++);
  run_case({KvFormat::kModel1Fp8, 2, 200, 9, 64, false, false, /*in_place=*/true}, salt++);
  run_case({KvFormat::kModel1Fp8, 64, 70, 11, 256, true}, salt++, /*graph=*/true);
  run_case({KvFormat::kModel1Fp8, 64, 2600, 80, 2048, true, false, false, /*dense=*/true}, salt++);  // N = 160K
}

TEST(DequantSelectedGpu, WorkspaceTooSmallIsReported) {
  DequantSelectedParams p;
  p.cache = PagedKvCache{reinterpret_cast<void*>(uintptr_t(4096)), 100, 64, 64 * 528, KvFormat::kNopeFp8};
  p.num_tokens = 4;
  p.topk = 2048;
  p.indices = reinterpret_cast<const int32_t*>(uintptr_t(4096));
  p.indices_row_stride = 2048;
  p.out_indices = reinterpret_cast<int32_t*>(uintptr_t(8192));
  p.out_indices_row_stride = 2048;
  p.workspace = reinterpret_cast<void*>(uintptr_t(4096));
  p.workspace_rows = 6399;  // needs min(8192, 6400)
  p.workspace_row_stride = 512;
  const Status st = dequant_selected_kv(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  EXPECT_NE(st.message().find("need 6400 rows"), std::string::npos) << st.message();
}

}  // namespace
