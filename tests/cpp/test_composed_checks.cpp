// Composed prefill paths (selkv/composed.h), CPU side: workspace sizes, every composed-level
// rejection (fails closed, names the argument, kWorkspaceTooSmall names the bytes), sub-op
// failures reported under the composed op's name, and the host oracle of both paths against a
// hand-built one (decode_record of each referenced record + ref::sparse_prefill).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "prefill/composed_ref.h"
#include "reference/oracle.h"
#include "selkv/composed.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
namespace {

using namespace selkv;

// Fake, never dereferenced device pointers: each MiB of `a` is its own 4 GiB region (no two
// arguments overlap); the low 20 bits are kept (misalignment tests).
void* fake(uintptr_t a) { return reinterpret_cast<void*>((a >> 20) << 32 | (a & 0xfffff)); }

bool has(const Status& st, const std::string& s) { return st.message().find(s) != std::string::npos; }

// A valid (a) call on fake, aligned device pointers: T=4, H=128, K=128, P=64*64 (selected mode).
DequantPrefillParams valid_dequant() {
  DequantPrefillParams p;
  p.attn.q = fake(1 << 20);
  p.attn.num_tokens = 4;
  p.attn.num_heads = 128;
  p.attn.d_qk = 576;
  p.attn.topk = 128;
  p.attn.sm_scale = 0.1f;
  set_contiguous_strides(&p.attn);
  p.attn.kv_row_stride = 0;
  p.attn.indices = static_cast<const int32_t*>(fake(2 << 20));
  p.attn.out = fake(3 << 20);
  p.attn.lse = static_cast<float*>(fake(4 << 20));
  p.cache = PagedKvCache{fake(5 << 20), 64, 64, 64 * 656, KvFormat::kDsMlaFp8};
  p.workspace = fake(6 << 20);
  p.workspace_bytes = dequant_prefill_workspace_size(4, 128, 64 * 64, KvFormat::kDsMlaFp8);
  return p;
}

GatherPrefillParams valid_gather() {
  GatherPrefillParams p;
  p.attn.q = fake(1 << 20);
  p.attn.num_tokens = 4;
  p.attn.num_heads = 64;
  p.attn.d_qk = 512;
  p.attn.topk = 64;
  p.attn.sm_scale = 0.1f;
  set_contiguous_strides(&p.attn);
  p.attn.kv_row_stride = 0;
  p.attn.indices = static_cast<const int32_t*>(fake(2 << 20));
  p.attn.out = fake(3 << 20);
  p.gather.cache = fake(5 << 20);
  p.gather.num_blocks = 10;
  p.gather.page_size = 64;
  p.gather.block_stride_bytes = 64 * 528;
  p.gather.format = KvFormat::kNopeFp8;
  p.gather.block_table = static_cast<const int32_t*>(fake(7 << 20));
  p.gather.block_table_row_stride = 4;
  p.gather.max_blocks_per_req = 4;
  p.gather.seq_starts = static_cast<const int32_t*>(fake(8 << 20));
  p.gather.seq_lens = static_cast<const int32_t*>(fake(9 << 20));
  p.gather.ws_starts = static_cast<const int32_t*>(fake(10 << 20));
  p.gather.num_reqs = 2;
  p.num_kv_rows = 300;
  p.workspace = fake(6 << 20);
  p.workspace_bytes = gather_prefill_workspace_size(300, KvFormat::kNopeFp8);
  return p;
}

TEST(ComposedChecks, WorkspaceSizes) {
  // Seed shapes: selected (T=64, K=2048, P=1M) and full pool (T=4096, K=2048, P=128K).
  EXPECT_EQ(dequant_prefill_workspace_size(64, 2048, 1 << 20, KvFormat::kDsMlaFp8),
            size_t(131072) * 1152 + size_t(131072) * 4);
  EXPECT_EQ(dequant_prefill_workspace_size(4096, 2048, 1 << 17, KvFormat::kNopeFp8),
            size_t(131072) * 1024 + size_t(4096) * 2048 * 4);
  EXPECT_EQ(dequant_prefill_workspace_size(3, 64, 1000, KvFormat::kDsMlaFp8),
            size_t((192 * 1152 + 255) / 256 * 256 + 768));
  EXPECT_EQ(dequant_prefill_workspace_size(0, 2048, 1000, KvFormat::kDsMlaFp8), 0u);
  EXPECT_EQ(dequant_prefill_workspace_size(-1, 64, 1000, KvFormat::kDsMlaFp8), SIZE_MAX);
  EXPECT_EQ(gather_prefill_workspace_size(32768, KvFormat::kDsMlaFp8), size_t(32768) * 1152);
  EXPECT_EQ(gather_prefill_workspace_size(3, KvFormat::kNopeFp8), 3072u);
  EXPECT_EQ(gather_prefill_workspace_size(-5, KvFormat::kNopeFp8), SIZE_MAX);
  // model1_fp8 has no composed route: no size (was a size no call could use)
  EXPECT_EQ(dequant_prefill_workspace_size(3, 64, 1000, KvFormat::kModel1Fp8), SIZE_MAX);
  EXPECT_EQ(gather_prefill_workspace_size(3, KvFormat::kModel1Fp8), SIZE_MAX);
}

TEST(ComposedChecks, DequantValidAndRejections) {
  EXPECT_TRUE(check_dequant_sparse_mla_prefill(valid_dequant()).ok());
  {
    auto p = valid_dequant();
    p.workspace_bytes -= 1;
    const Status st = check_dequant_sparse_mla_prefill(p);
    EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
    EXPECT_TRUE(has(st, "need " + std::to_string(p.workspace_bytes + 1) + " bytes")) << st.message();
    EXPECT_TRUE(has(st, "selkv::dequant_sparse_mla_prefill: workspace_bytes")) << st.message();
  }
  struct Bad {
    const char* arg;
    void (*mutate)(DequantPrefillParams&);
  };
  const Bad bad[] = {
      {"attn.kv", [](DequantPrefillParams& p) { p.attn.kv = fake(1 << 24); }},
      {"attn.kv_row_stride/attn.num_kv", [](DequantPrefillParams& p) { p.attn.num_kv = 5; }},
      {"attn.d_qk", [](DequantPrefillParams& p) { p.attn.d_qk = 512; }},
      {"attn.topk", [](DequantPrefillParams& p) { p.attn.topk = 100; }},
      {"cache.format", [](DequantPrefillParams& p) { p.cache.format = KvFormat(7); }},
      {"cache.page_size", [](DequantPrefillParams& p) { p.cache.page_size = 0; }},
      {"workspace", [](DequantPrefillParams& p) { p.workspace = fake((6 << 20) + 8); }},
      {"workspace", [](DequantPrefillParams& p) { p.workspace = nullptr; }},
      // sub-op checks, reported under the composed name
      {"selkv::dequant_selected_kv: indices", [](DequantPrefillParams& p) { p.attn.indices = nullptr; }},
      {"selkv::dequant_selected_kv: cache.data", [](DequantPrefillParams& p) { p.cache.data = fake(3); }},
      {"selkv::sparse_mla_prefill: num_heads", [](DequantPrefillParams& p) { p.attn.num_heads = 32; }},
      {"selkv::sparse_mla_prefill: q", [](DequantPrefillParams& p) { p.attn.q = nullptr; }},
      {"selkv::sparse_mla_prefill: sm_scale", [](DequantPrefillParams& p) { p.attn.sm_scale = NAN; }},
      {"selkv::sparse_mla_prefill: out", [](DequantPrefillParams& p) { p.attn.out = fake((3 << 20) + 4); }},
  };
  for (const Bad& b : bad) {
    auto p = valid_dequant();
    b.mutate(p);
    const Status st = check_dequant_sparse_mla_prefill(p);
    EXPECT_FALSE(st.ok()) << b.arg;
    EXPECT_TRUE(has(st, std::string("selkv::dequant_sparse_mla_prefill: ") + b.arg)) << st.message();
    // The launcher fails the same way before touching the device.
    const Status st2 = dequant_sparse_mla_prefill(p, nullptr);
    EXPECT_EQ(st2.code(), st.code()) << st2.to_string();
  }
  {  // a known format without a composed route is named as such
    auto p = valid_dequant();
    p.cache.format = KvFormat::kModel1Fp8;
    const Status st = check_dequant_sparse_mla_prefill(p);
    EXPECT_TRUE(has(st, "cache.format: must be ds_mla_fp8 or nope_fp8, got model1_fp8")) << st.message();
  }
}

TEST(ComposedChecks, GatherValidAndRejections) {
  EXPECT_TRUE(check_gather_sparse_mla_prefill(valid_gather()).ok());
  {
    auto p = valid_gather();
    p.workspace_bytes = 1000;
    const Status st = check_gather_sparse_mla_prefill(p);
    EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
    EXPECT_TRUE(has(st, "need 307200 bytes")) << st.message();
  }
  struct Bad {
    const char* arg;
    void (*mutate)(GatherPrefillParams&);
  };
  const Bad bad[] = {
      {"attn.kv", [](GatherPrefillParams& p) { p.attn.kv = fake(1 << 24); }},
      {"attn.d_qk", [](GatherPrefillParams& p) { p.attn.d_qk = 576; }},
      {"gather.out", [](GatherPrefillParams& p) { p.gather.out = fake(1 << 24); }},
      {"gather.out", [](GatherPrefillParams& p) { p.gather.out_rows = 3; }},
      {"gather.format", [](GatherPrefillParams& p) { p.gather.format = KvFormat(9); }},
      {"num_kv_rows", [](GatherPrefillParams& p) { p.num_kv_rows = -1; }},
      {"workspace", [](GatherPrefillParams& p) { p.workspace = nullptr; }},
      {"selkv::gather_kv_bf16: seq_lens", [](GatherPrefillParams& p) { p.gather.seq_lens = nullptr; }},
      {"selkv::sparse_mla_prefill: indices", [](GatherPrefillParams& p) { p.attn.indices = nullptr; }},
      {"selkv::sparse_mla_prefill: num_heads", [](GatherPrefillParams& p) { p.attn.num_heads = 100; }},
  };
  for (const Bad& b : bad) {
    auto p = valid_gather();
    b.mutate(p);
    const Status st = check_gather_sparse_mla_prefill(p);
    EXPECT_FALSE(st.ok()) << b.arg;
    EXPECT_TRUE(has(st, std::string("selkv::gather_sparse_mla_prefill: ") + b.arg)) << st.message();
    EXPECT_EQ(gather_sparse_mla_prefill(p, nullptr).code(), st.code());
  }
  {
    auto p = valid_gather();
    p.gather.format = KvFormat::kModel1Fp8;
    const Status st = check_gather_sparse_mla_prefill(p);
    EXPECT_TRUE(has(st, "gather.format: must be ds_mla_fp8 or nope_fp8, got model1_fp8")) << st.message();
  }
}

// ---- issue 15: sm_scale, overlaps, zero rows ---------------------------------------------------------
TEST(ComposedChecks, SmScaleRule) {
  for (float sc : test::bad_sm_scales()) {
    SCOPED_TRACE(sc);
    auto a = valid_dequant();
    a.attn.sm_scale = sc;
    EXPECT_TRUE(has(check_dequant_sparse_mla_prefill(a), "sm_scale:"));
    EXPECT_EQ(dequant_sparse_mla_prefill(a, nullptr).code(), StatusCode::kInvalidArgument);
    auto b = valid_gather();
    b.attn.sm_scale = sc;
    EXPECT_TRUE(has(check_gather_sparse_mla_prefill(b), "sm_scale:"));
    EXPECT_EQ(gather_sparse_mla_prefill(b, nullptr).code(), StatusCode::kInvalidArgument);
    // The host oracles (the torch CPU ops) reject the same scales, before touching memory.
    EXPECT_TRUE(has(ref::dequant_sparse_mla_prefill(a), "sm_scale:"));
    EXPECT_TRUE(has(ref::gather_sparse_mla_prefill(b), "sm_scale:"));
  }
  for (float sc : test::good_sm_scales()) {
    auto a = valid_dequant();
    a.attn.sm_scale = sc;
    EXPECT_TRUE(check_dequant_sparse_mla_prefill(a).ok()) << sc;
    auto b = valid_gather();
    b.attn.sm_scale = sc;
    EXPECT_TRUE(check_gather_sparse_mla_prefill(b).ok()) << sc;
  }
}

TEST(ComposedChecks, RejectsWorkspaceOverlaps) {
  auto ptr = [](const void* p, uintptr_t bytes) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + bytes); };
  struct BadA {
    const char* arg;
    void (*mutate)(DequantPrefillParams&);
  };
  const BadA bad_a[] = {
      // the C4 sub-check: workspace rows inside the cache
      {"selkv::dequant_selected_kv: workspace", [](DequantPrefillParams& p) { p.workspace = fake((5 << 20) + 4096); }},
      // the composed check: the whole workspace against the C7 tensors
      {"workspace", [](DequantPrefillParams& p) { p.attn.q = fake((6 << 20) + 512 * 1152); }},
      // C7: its outputs against the workspace rows (kv) and the remapped indices
      {"selkv::sparse_mla_prefill: out", [](DequantPrefillParams& p) { p.attn.out = fake((6 << 20) + 16); }},
      {"selkv::sparse_mla_prefill: lse", [](DequantPrefillParams& p) { p.attn.lse = static_cast<float*>(fake((6 << 20) + 512 * 1152 + 64)); }},
      // C7: out against q
      {"selkv::sparse_mla_prefill: out", [](DequantPrefillParams& p) { p.attn.out = const_cast<void*>(p.attn.q); }},
  };
  for (const BadA& b : bad_a) {
    auto p = valid_dequant();
    b.mutate(p);
    const Status st = check_dequant_sparse_mla_prefill(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.arg;
    EXPECT_TRUE(has(st, std::string("selkv::dequant_sparse_mla_prefill: ") + b.arg)) << st.message();
    EXPECT_EQ(dequant_sparse_mla_prefill(p, nullptr).code(), StatusCode::kInvalidArgument);
  }
  struct BadB {
    const char* arg;
    void (*mutate)(GatherPrefillParams&);
  };
  const BadB bad_b[] = {
      {"selkv::gather_kv_bf16: out", [](GatherPrefillParams& p) { p.gather.block_table = static_cast<const int32_t*>(fake((6 << 20) + 64)); }},
      {"selkv::gather_kv_bf16: out", [](GatherPrefillParams& p) { p.workspace = fake((5 << 20) + 1024); }},
      {"workspace", [](GatherPrefillParams& p) { p.attn.q = fake((6 << 20) + 4096); }},
      {"workspace", [](GatherPrefillParams& p) { p.attn.indices = static_cast<const int32_t*>(fake((6 << 20) + 300 * 1024 - 4)); }},
      {"selkv::sparse_mla_prefill: out", [](GatherPrefillParams& p) { p.attn.out = fake((6 << 20) + 1024); }},
  };
  for (const BadB& b : bad_b) {
    auto p = valid_gather();
    b.mutate(p);
    const Status st = check_gather_sparse_mla_prefill(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.arg;
    EXPECT_TRUE(has(st, std::string("selkv::gather_sparse_mla_prefill: ") + b.arg)) << st.message();
    EXPECT_EQ(gather_sparse_mla_prefill(p, nullptr).code(), StatusCode::kInvalidArgument);
  }
  // Right after the workspace is fine.
  auto a = valid_dequant();
  a.attn.lse = static_cast<float*>(ptr(a.workspace, a.workspace_bytes));
  EXPECT_TRUE(check_dequant_sparse_mla_prefill(a).ok()) << check_dequant_sparse_mla_prefill(a).to_string();
}

TEST(ComposedChecks, ZeroTokensAreNoOps) {
  auto a = valid_dequant();
  a.attn.num_tokens = 0;
  a.attn.q = nullptr;
  a.attn.indices = nullptr;
  a.attn.out = nullptr;
  a.attn.lse = nullptr;
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_TRUE(dequant_sparse_mla_prefill(a, nullptr).ok()) << dequant_sparse_mla_prefill(a, nullptr).to_string();
  EXPECT_TRUE(ref::dequant_sparse_mla_prefill(a).ok());
  auto b = valid_gather();
  b.attn.num_tokens = 0;
  b.attn.q = nullptr;
  b.attn.indices = nullptr;
  b.attn.out = nullptr;
  EXPECT_TRUE(gather_sparse_mla_prefill(b, nullptr).ok()) << gather_sparse_mla_prefill(b, nullptr).to_string();
  EXPECT_TRUE(ref::gather_sparse_mla_prefill(b).ok());
}

// ---- the host oracle of both paths vs a hand-built reference ---------------------------------------
struct Dense {
  std::vector<float> out, ml, lse;
};

// decode_record of every valid entry into a private kv, then ref::sparse_prefill (dense layout).
Dense by_hand(const std::vector<uint16_t>& q, int T, int H, int D, int K, const std::vector<int32_t>& idx,
              const int32_t* len, float scale, const std::vector<const uint8_t*>& rec_of_entry, KvFormat f) {
  std::vector<uint16_t> kv(size_t(T) * K * D, 0);
  std::vector<int32_t> id(size_t(T) * K, -1);
  for (size_t e = 0; e < id.size(); ++e)
    if (rec_of_entry[e]) {
      ref::decode_record(rec_of_entry[e], f, &kv[e * D]);
      id[e] = int32_t(e);
    }
  (void)idx;
  Dense d;
  d.out.resize(size_t(T) * H * 512);
  d.ml.resize(size_t(T) * H);
  d.lse.resize(size_t(T) * H);
  ref::SparsePrefillRefArgs a;
  a.q = q.data(); a.T = T; a.H = H; a.d_qk = D; a.kv = kv.data(); a.num_kv = int64_t(T) * K;
  a.indices = id.data(); a.K = K; a.topk_length = len; a.sm_scale = scale;
  a.out = d.out.data(); a.max_logits = d.ml.data(); a.lse = d.lse.data();
  ref::sparse_prefill(a);
  return d;
}

void expect_same(const Dense& d, const std::vector<uint16_t>& out, const std::vector<float>& ml,
                 const std::vector<float>& lse) {
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], test::bf16(d.out[i])) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_EQ(std::memcmp(&lse[i], &d.lse[i], 4), 0) << "lse " << i;
    ASSERT_EQ(std::memcmp(&ml[i], &d.ml[i], 4), 0) << "max_logits " << i;
  }
}

TEST(ComposedChecks, HostOracleDequantPathMatchesHandBuilt) {
  for (int64_t blocks : {40, 2}) {  // P = 40 * 61 (selected) and 122 (full pool)
    std::mt19937_64 rng(selkv::test::test_seed() + uint64_t(blocks));
    const int T = 5, H = 64, K = 64, D = 576;
    PagedKvCache view{nullptr, blocks, 61, 61 * 656 + 16, KvFormat::kDsMlaFp8};
    const int64_t P = view.num_slots();
    std::vector<uint8_t> cache(size_t(blocks * view.block_stride_bytes));
    for (int64_t s = 0; s < P; ++s) {
      auto lat = test::randn_bf16(512, 0.1f, rng), rope = test::randn_bf16(64, 0.1f, rng);
      ref::encode_record(lat.data(), rope.data(), view.format, ScaleMode::kAmax, cache.data() + view.slot_offset(s));
    }
    std::vector<int32_t> idx(size_t(T) * K), len = {64, 0, 17, -3, 70};
    std::vector<const uint8_t*> rec(idx.size(), nullptr);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        int32_t v = rng() % 5 == 0 ? (rng() % 2 ? -1 : INT_MAX) : int32_t(rng() % uint64_t(P));
        idx[size_t(t) * K + k] = v;
        if (k < len[size_t(t)] && v >= 0 && v < P) rec[size_t(t) * K + k] = cache.data() + view.slot_offset(v);
      }
    const auto q = test::randn_bf16(size_t(T) * H * D, 1.f, rng);
    std::vector<uint16_t> out(size_t(T) * H * 512);
    std::vector<float> ml(size_t(T) * H), lse(size_t(T) * H);
    const size_t wsb = dequant_prefill_workspace_size(T, K, P, view.format);
    std::vector<uint64_t> ws(wsb / 8 + 2);  // 8-byte aligned; new[] of this size is 16-aligned in practice
    DequantPrefillParams p;
    p.attn.q = q.data(); p.attn.num_tokens = T; p.attn.num_heads = H; p.attn.d_qk = D; p.attn.topk = K;
    p.attn.sm_scale = 0.07f;
    set_contiguous_strides(&p.attn);
    p.attn.kv_row_stride = 0;
    p.attn.indices = idx.data(); p.attn.topk_length = len.data();
    p.attn.out = out.data(); p.attn.max_logits = ml.data(); p.attn.lse = lse.data();
    p.cache = view;
    p.cache.data = cache.data();
    p.workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 15) & ~uintptr_t(15));
    p.workspace_bytes = wsb;
    const Status st = ref::dequant_sparse_mla_prefill(p);
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_same(by_hand(q, T, H, D, K, idx, len.data(), 0.07f, rec, view.format), out, ml, lse);
  }
}

TEST(ComposedChecks, HostOracleGatherPathMatchesHandBuilt) {
  std::mt19937_64 rng(selkv::test::test_seed() + 77);
  const int T = 4, H = 64, K = 64, D = 512, page = 2;
  PagedKvCache view{nullptr, 20, page, page * 528, KvFormat::kNopeFp8};
  std::vector<uint8_t> cache(size_t(20 * view.block_stride_bytes));
  for (int64_t s = 0; s < view.num_slots(); ++s) {
    auto lat = test::randn_bf16(512, 0.1f, rng);
    ref::encode_record(lat.data(), nullptr, view.format, ScaleMode::kPow2, cache.data() + view.slot_offset(s));
  }
  // Two requests: req 0 tokens [3, 10) via blocks {4, 9, 1, 7, 0}, req 1 tokens [1, 6) via {12, 2, 15}.
  std::vector<int32_t> bt = {4, 9, 1, 7, 0, 12, 2, 15, -1, -1};
  std::vector<int32_t> starts = {3, 1}, lens = {7, 5}, ws_starts = {0, 8};
  const int64_t rows = 13;  // row 7 is a gap
  auto slot_of_row = [&](int64_t r) -> int64_t {
    const int q = r < 8 ? 0 : 1;
    const int64_t pos = starts[size_t(q)] + (r - ws_starts[size_t(q)]);
    return int64_t(bt[size_t(q * 5 + pos / page)]) * page + pos % page;
  };
  std::vector<int32_t> idx(size_t(T) * K);
  std::vector<const uint8_t*> rec(idx.size(), nullptr);
  for (size_t e = 0; e < idx.size(); ++e) {
    int32_t r = int32_t(rng() % 13);
    if (r == 7 || rng() % 6 == 0) r = rng() % 2 ? -1 : 13;  // never the gap row; some invalid
    idx[e] = r;
    if (r >= 0 && r < rows) rec[e] = cache.data() + view.slot_offset(slot_of_row(r));
  }
  const auto q = test::randn_bf16(size_t(T) * H * D, 1.f, rng);
  std::vector<uint16_t> out(size_t(T) * H * 512);
  std::vector<float> ml(size_t(T) * H), lse(size_t(T) * H);
  std::vector<uint64_t> ws(gather_prefill_workspace_size(rows, view.format) / 8 + 2);
  GatherPrefillParams p;
  p.attn.q = q.data(); p.attn.num_tokens = T; p.attn.num_heads = H; p.attn.d_qk = D; p.attn.topk = K;
  p.attn.sm_scale = 0.05f;
  set_contiguous_strides(&p.attn);
  p.attn.kv_row_stride = 0;
  p.attn.indices = idx.data();
  p.attn.out = out.data(); p.attn.max_logits = ml.data(); p.attn.lse = lse.data();
  p.gather.cache = cache.data(); p.gather.num_blocks = 20; p.gather.page_size = page;
  p.gather.block_stride_bytes = view.block_stride_bytes; p.gather.format = view.format;
  p.gather.block_table = bt.data(); p.gather.block_table_row_stride = 5; p.gather.max_blocks_per_req = 5;
  p.gather.seq_starts = starts.data(); p.gather.seq_lens = lens.data(); p.gather.ws_starts = ws_starts.data();
  p.gather.num_reqs = 2;
  p.num_kv_rows = rows;
  p.workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 15) & ~uintptr_t(15));
  p.workspace_bytes = gather_prefill_workspace_size(rows, view.format);
  const Status st = ref::gather_sparse_mla_prefill(p);
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_same(by_hand(q, T, H, D, K, idx, nullptr, 0.05f, rec, view.format), out, ml, lse);
}

}  // namespace
#endif  // SELKV_HAVE_CUTLASS
