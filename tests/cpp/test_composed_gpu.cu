// Composed prefill paths (selkv/composed.h) on the GPU vs the CPU oracle end to end:
//   (a) FP8 paged cache + physical indices -> C4 -> C7 (selected and full-pool modes),
//   (b) C3 gather of each request's chunk -> C7 with chunk-relative indices.
// The workspace must match the oracle's bit for bit (both start from the same poison, so rows the
// op must not touch are checked too); out / max_logits / lse use the prefill tolerances
// (out |err| < 8e-4 or rel < 3.01/128, cosine distance < 7e-6; stats |err| < 1e-6 or rel <
// 2.01/65536). In (a) records no valid index references are 0xFF (NaN codes and scales), in (b)
// the workspace's gap rows stay NaN, so stray reads show.
// Skips without a GPU; failures print the seed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "prefill/composed_ref.h"
#include "reference/oracle.h"
#include "selkv/composed.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
#include "attn_gpu_runner.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::down;
using selkv::test::up;
using selkv::test::test_seed;

// A paged cache whose slots are all real records (latent + RoPE ~ randn/10, pow2 and amax scales
// mixed).
std::vector<uint8_t> make_cache(const PagedKvCache& view, std::mt19937_64& rng) {
  std::vector<uint8_t> cache(size_t(view.num_blocks * view.block_stride_bytes), 0xA5);
  std::vector<uint16_t> lat(512), rope(64);
  for (int64_t s = 0; s < view.num_slots(); ++s) {
    lat = test::randn_bf16(512, 0.1f, rng);
    rope = test::randn_bf16(64, 0.1f, rng);
    ref::encode_record(lat.data(), rope.data(), view.format, (s & 1) ? ScaleMode::kAmax : ScaleMode::kPow2,
                       cache.data() + view.slot_offset(s));
  }
  return cache;
}

struct Outs {
  std::vector<uint16_t> out;
  std::vector<float> ml, lse;
  std::vector<uint8_t> ws;
};

void compare(const Outs& g, const Outs& r, int H) {
  std::vector<float> ref_out(r.out.size());
  for (size_t i = 0; i < r.out.size(); ++i) ref_out[i] = test::f32(r.out[i]);  // already bf16
  test::expect_prefill_close(g.out, g.ml, g.lse, ref_out, r.ml, r.lse, H, "composed");
  size_t bw = 0, fw = 0;
  for (size_t i = 0; i < r.ws.size(); ++i)
    if (g.ws[i] != r.ws[i] && bw++ == 0) fw = i;
  EXPECT_EQ(bw, 0u) << "workspace differs from the oracle's, first at byte " << fw;
}

// Runs `call` on a fresh stream: eagerly, or captured into a graph and replayed twice
// (test::run_call, deadline wait). False on any failure (reported).
template <typename F>
bool launch(F&& call, bool graph, const std::string& what) {
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) {
    ADD_FAILURE() << what << ": cudaStreamCreate";
    return false;
  }
  const bool ok = test::run_call(s, call, graph, what);
  cudaStreamDestroy(s);
  return ok;
}

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
struct GaCase {
  KvFormat format;
  int page;
  int reqs;
  int T, H, K;
  bool dynamic;
};

void run_gather_case(const GaCase& c, uint64_t salt, bool graph = false, Outs* keep = nullptr) {
  const std::string what = "format=" + std::to_string(int(c.format)) + " page=" + std::to_string(c.page) +
                           " reqs=" + std::to_string(c.reqs) + " T=" + std::to_string(c.T) + " H=" +
                           std::to_string(c.H) + " K=" + std::to_string(c.K) + " dyn=" + std::to_string(c.dynamic);
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + what);
  std::mt19937_64 rng(test_seed() * 1000037ull + salt);
  const int rb = fmt::record_bytes(c.format), D = fmt::dequant_dim(c.format);
  // Requests: random lengths, starts not page aligned, rows packed with a gap of 3 between them.
  std::vector<int32_t> starts(size_t(c.reqs)), lens(size_t(c.reqs)), ws_starts(size_t(c.reqs));
  int64_t row = 0, max_blocks = 1;
  for (int r = 0; r < c.reqs; ++r) {
    lens[size_t(r)] = int32_t(rng() % 300) + (r == 0 ? 1 : 0);
    starts[size_t(r)] = int32_t(rng() % uint64_t(3 * c.page)) | 1;
    ws_starts[size_t(r)] = int32_t(row);
    row += lens[size_t(r)] + 3;
    max_blocks = std::max<int64_t>(max_blocks, (starts[size_t(r)] + lens[size_t(r)] + c.page - 1) / c.page);
  }
  const int64_t kv_rows = row;
  const int64_t num_blocks = int64_t(c.reqs) * max_blocks + 2;
  PagedKvCache view{nullptr, num_blocks, c.page, int64_t(c.page) * rb, c.format};
  std::vector<uint8_t> cache = make_cache(view, rng);
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) perm[size_t(b)] = int32_t(b);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> bt(static_cast<size_t>(c.reqs * max_blocks));
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = perm[i];
  // Indices relative to the gathered rows: each token attends inside one request's rows.
  const int32_t bad[] = {-1, INT_MIN, int32_t(kv_rows), int32_t(kv_rows + 1), INT_MAX, -2};
  std::vector<int32_t> idx(size_t(c.T) * c.K), len(size_t(c.T));
  for (int t = 0; t < c.T; ++t) {
    const int r = int(rng() % uint64_t(c.reqs));
    int32_t l = c.K;
    if (c.dynamic) l = int32_t(rng() % uint64_t(c.K + 2)) - 1;
    len[size_t(t)] = l;
    for (int k = 0; k < c.K; ++k) {
      int32_t v = lens[size_t(r)] > 0 ? ws_starts[size_t(r)] + int32_t(rng() % uint64_t(lens[size_t(r)])) : -1;
      if (t % 11 == 3 || rng() % 8 == 0) v = bad[rng() % 6];
      idx[size_t(t) * c.K + k] = v;
    }
  }
  const std::vector<uint16_t> q = test::randn_bf16(size_t(c.T) * c.H * D, 1.f, rng);
  const size_t ws_bytes = gather_prefill_workspace_size(kv_rows, c.format);

  DevBuf dcache(cache.size()), dbt(bt.size() * 4), dst(starts.size() * 4), dln(lens.size() * 4), dwss(ws_starts.size() * 4),
      didx(idx.size() * 4), dlen(len.size() * 4), dq(q.size() * 2), dws(ws_bytes),
      dout(size_t(c.T) * c.H * 512 * 2), dml(size_t(c.T) * c.H * 4), dlse(size_t(c.T) * c.H * 4);
  up(dcache, cache); up(dbt, bt); up(dst, starts); up(dln, lens); up(dwss, ws_starts);
  up(didx, idx); up(dlen, len); up(dq, q);
  CUDA_OK(cudaMemset(dws.ptr, 0xFF, ws_bytes));  // gap rows stay NaN: never referenced
  CUDA_OK(cudaMemset(dout.ptr, 0xFF, size_t(c.T) * c.H * 512 * 2));

  GatherPrefillParams p;
  p.attn.q = dq.ptr; p.attn.num_tokens = c.T; p.attn.num_heads = c.H; p.attn.d_qk = D;
  p.attn.topk = c.K; p.attn.sm_scale = std::pow(float(D), -0.55f);
  set_contiguous_strides(&p.attn);
  p.attn.kv_row_stride = 0;
  p.attn.indices = didx.as<int32_t>();
  p.attn.topk_length = c.dynamic ? dlen.as<int32_t>() : nullptr;
  p.attn.out = dout.ptr; p.attn.max_logits = dml.as<float>(); p.attn.lse = dlse.as<float>();
  p.gather.cache = dcache.ptr; p.gather.num_blocks = num_blocks; p.gather.page_size = c.page;
  p.gather.block_stride_bytes = view.block_stride_bytes; p.gather.format = c.format;
  p.gather.block_table = dbt.as<int32_t>(); p.gather.block_table_row_stride = max_blocks;
  p.gather.max_blocks_per_req = int32_t(max_blocks);
  p.gather.seq_starts = dst.as<int32_t>(); p.gather.seq_lens = dln.as<int32_t>();
  p.gather.ws_starts = dwss.as<int32_t>(); p.gather.num_reqs = c.reqs;
  p.num_kv_rows = kv_rows;
  p.workspace = dws.ptr;
  p.workspace_bytes = ws_bytes;
  ASSERT_TRUE(launch([&](cudaStream_t s) { return gather_sparse_mla_prefill(p, s); }, graph, what));

  Outs g, r;
  g.out = down<uint16_t>(dout, size_t(c.T) * c.H * 512);
  g.ml = down<float>(dml, size_t(c.T) * c.H);
  g.lse = down<float>(dlse, size_t(c.T) * c.H);
  g.ws = down<uint8_t>(dws, ws_bytes);
  r.out.assign(g.out.size(), 0xFFFF); r.ml.assign(g.ml.size(), 0.f); r.lse.assign(g.lse.size(), 0.f);
  std::vector<uint8_t> host_ws(ws_bytes + 16, 0xFF);
  auto* hw = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(host_ws.data()) + 15) & ~uintptr_t(15));
  GatherPrefillParams h = p;
  h.attn.q = q.data(); h.attn.indices = idx.data(); h.attn.topk_length = c.dynamic ? len.data() : nullptr;
  h.attn.out = r.out.data(); h.attn.max_logits = r.ml.data(); h.attn.lse = r.lse.data();
  h.gather.cache = cache.data(); h.gather.block_table = bt.data(); h.gather.seq_starts = starts.data();
  h.gather.seq_lens = lens.data(); h.gather.ws_starts = ws_starts.data();
  h.workspace = hw;
  const Status st = ref::gather_sparse_mla_prefill(h);
  ASSERT_TRUE(st.ok()) << st.to_string();
  r.ws.assign(hw, hw + ws_bytes);
  compare(g, r, c.H);
  if (keep) *keep = g;
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
  Outs e, g;
  run_gather_case({KvFormat::kDsMlaFp8, 64, 3, 13, 128, 192, true}, 600, false, &e);
  run_gather_case({KvFormat::kDsMlaFp8, 64, 3, 13, 128, 192, true}, 600, true, &g);
  EXPECT_EQ(e.out, g.out);
  EXPECT_EQ(0, std::memcmp(e.lse.data(), g.lse.data(), e.lse.size() * 4));
  EXPECT_EQ(e.ws, g.ws);
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
