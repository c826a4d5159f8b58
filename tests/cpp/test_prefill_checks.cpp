// C7 sparse MLA prefill: argument validation (CPU, no GPU needed).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "prefill/composed_ref.h"
#include "reference/oracle.h"
#include "selkv/prefill.h"
#include "test_util.h"

namespace {

using namespace selkv;

// Fake, never dereferenced device pointers, one 4 GiB region per argument (no two overlap);
// `misalign` bytes added for the alignment tests.
template <typename T = void>
T* fake(int region, uintptr_t misalign = 0) {
  return reinterpret_cast<T*>((uintptr_t(region) << 32) + misalign);
}
enum Region { kQ = 1, kKv, kIdx, kLen, kOut, kMl, kLse };

SparsePrefillParams valid_params() {
  SparsePrefillParams p;
  p.q = fake(kQ);
  p.num_tokens = 3;
  p.num_heads = 128;
  p.d_qk = 576;
  p.kv = fake(kKv);
  p.num_kv = 100;
  p.indices = fake<const int32_t>(kIdx);
  p.topk = 192;  // 64 * odd
  p.sm_scale = 0.03f;
  p.out = fake(kOut);
  p.max_logits = fake<float>(kMl);
  p.lse = fake<float>(kLse);
  set_contiguous_strides(&p);
  return p;
}

void expect_invalid(const SparsePrefillParams& p, const char* arg) {
  const Status st = check_sparse_mla_prefill(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << arg << ": " << st.to_string();
  EXPECT_NE(st.message().find(std::string(arg) + ":"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("selkv::sparse_mla_prefill"), std::string::npos);
}

TEST(PrefillChecks, AcceptsValid) {
  SparsePrefillParams p = valid_params();
  EXPECT_TRUE(check_sparse_mla_prefill(p).ok()) << check_sparse_mla_prefill(p).to_string();
  p.d_qk = 512;
  p.num_heads = 64;
  set_contiguous_strides(&p);
  EXPECT_TRUE(check_sparse_mla_prefill(p).ok());
  p.max_logits = nullptr;
  p.lse = nullptr;
  EXPECT_TRUE(check_sparse_mla_prefill(p).ok());
  p.num_tokens = 0;
  p.q = nullptr;
  EXPECT_TRUE(check_sparse_mla_prefill(p).ok());
  p = valid_params();
  p.topk = 0;  // every row empty
  p.indices = nullptr;
  p.kv = nullptr;
  EXPECT_TRUE(check_sparse_mla_prefill(p).ok());
}

TEST(PrefillChecks, RejectsBadArguments) {
  auto P = valid_params;
  { auto p = P(); p.d_qk = 128; expect_invalid(p, "d_qk"); }
  { auto p = P(); p.d_qk = 640; expect_invalid(p, "d_qk"); }
  { auto p = P(); p.num_heads = 32; expect_invalid(p, "num_heads"); }
  { auto p = P(); p.num_heads = 16; expect_invalid(p, "num_heads"); }
  { auto p = P(); p.topk = 100; expect_invalid(p, "topk"); }
  { auto p = P(); p.topk = -64; expect_invalid(p, "topk"); }
  { auto p = P(); p.num_tokens = -1; expect_invalid(p, "num_tokens"); }
  { auto p = P(); p.num_tokens = (int64_t(1) << 30) + 1; expect_invalid(p, "num_tokens"); }
  { auto p = P(); p.num_kv = -1; expect_invalid(p, "num_kv"); }
  { auto p = P(); p.sm_scale = 0.f; expect_invalid(p, "sm_scale"); }
  { auto p = P(); p.sm_scale = -0.1f; expect_invalid(p, "sm_scale"); }
  { auto p = P(); p.sm_scale = NAN; expect_invalid(p, "sm_scale"); }
  { auto p = P(); p.q = nullptr; expect_invalid(p, "q"); }
  { auto p = P(); p.q = fake(kQ, 2); expect_invalid(p, "q"); }
  { auto p = P(); p.q_head_stride = 512; expect_invalid(p, "q_head_stride"); }
  { auto p = P(); p.q_head_stride = 580; expect_invalid(p, "q_head_stride"); }
  { auto p = P(); p.q_token_stride = 576 * 64; expect_invalid(p, "q_token_stride"); }
  { auto p = P(); p.q_token_stride += 4; expect_invalid(p, "q_token_stride"); }
  { auto p = P(); p.kv = nullptr; expect_invalid(p, "kv"); }
  { auto p = P(); p.kv = fake(kKv, 8); expect_invalid(p, "kv"); }
  { auto p = P(); p.kv_row_stride = 512; expect_invalid(p, "kv_row_stride"); }
  { auto p = P(); p.kv_row_stride = 577; expect_invalid(p, "kv_row_stride"); }
  { auto p = P(); p.indices = nullptr; expect_invalid(p, "indices"); }
  { auto p = P(); p.indices = fake<const int32_t>(kIdx, 2); expect_invalid(p, "indices"); }
  { auto p = P(); p.indices_token_stride = 128; expect_invalid(p, "indices_token_stride"); }
  { auto p = P(); p.topk_length = fake<const int32_t>(kLen, 1); expect_invalid(p, "topk_length"); }
  { auto p = P(); p.out = nullptr; expect_invalid(p, "out"); }
  { auto p = P(); p.out = fake(kOut, 4); expect_invalid(p, "out"); }
  { auto p = P(); p.out_head_stride = 256; expect_invalid(p, "out_head_stride"); }
  { auto p = P(); p.out_head_stride = 516; expect_invalid(p, "out_head_stride"); }
  { auto p = P(); p.out_token_stride = 512; expect_invalid(p, "out_token_stride"); }
  { auto p = P(); p.max_logits = fake<float>(kMl, 2); expect_invalid(p, "max_logits"); }
  { auto p = P(); p.max_logits_token_stride = 64; expect_invalid(p, "max_logits_token_stride"); }
  { auto p = P(); p.lse = fake<float>(kLse, 1); expect_invalid(p, "lse"); }
  { auto p = P(); p.lse_token_stride = 127; expect_invalid(p, "lse_token_stride"); }
}

// ---- issue 15: sm_scale rule, overlaps, host bounds --------------------------------------------

TEST(PrefillChecks, SmScaleRuleSharedWithTheOracle) {
  for (float s : test::bad_sm_scales()) {
    SCOPED_TRACE(s);
    auto p = valid_params();
    p.sm_scale = s;
    expect_invalid(p, "sm_scale");
    // The CPU oracle (what the torch CPU ops run) rejects the same scales.
    ref::SparsePrefillRefArgs a;
    a.T = 1; a.H = 64; a.d_qk = 576; a.sm_scale = s;
    EXPECT_EQ(ref::check_sparse_prefill_args(a).code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ref::check_sparse_prefill_args(a).message().find("sm_scale:"), std::string::npos);
    ref::SparseDecodeRefArgs d;
    d.cache.page_size = 1;
    d.cache.block_stride_bytes = 656;
    d.sm_scale = s;
    EXPECT_EQ(ref::check_sparse_decode_args(d).code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ref::check_sparse_decode_args(d).message().find("sm_scale:"), std::string::npos);
    // Zero tokens: still a bad argument.
    p.num_tokens = 0;
    expect_invalid(p, "sm_scale");
  }
  for (float s : test::good_sm_scales()) {
    auto p = valid_params();
    p.sm_scale = s;
    EXPECT_TRUE(check_sparse_mla_prefill(p).ok()) << s << ": " << check_sparse_mla_prefill(p).to_string();
    ref::SparsePrefillRefArgs a;
    a.d_qk = 576; a.sm_scale = s;
    EXPECT_TRUE(ref::check_sparse_prefill_args(a).ok()) << s;
    ref::SparseDecodeRefArgs d;
    d.cache.page_size = 1;
    d.cache.block_stride_bytes = 656;
    d.sm_scale = s;
    EXPECT_TRUE(ref::check_sparse_decode_args(d).ok()) << s;
  }
}

TEST(PrefillChecks, RejectsOverlappingOutputs) {
  auto P = valid_params;
  // outputs against each other
  { auto p = P(); p.max_logits = p.lse; expect_invalid(p, "max_logits"); }
  { auto p = P(); p.lse = reinterpret_cast<float*>(static_cast<char*>(p.out) + 1024); expect_invalid(p, "out"); }
  { auto p = P(); p.max_logits = reinterpret_cast<float*>(static_cast<char*>(p.out) + 3 * 128 * 1024 - 4);
    expect_invalid(p, "out"); }
  // outputs against inputs
  { auto p = P(); p.out = const_cast<void*>(p.q); expect_invalid(p, "out"); }
  { auto p = P(); p.out = const_cast<void*>(p.kv); expect_invalid(p, "out"); }
  { auto p = P(); p.lse = reinterpret_cast<float*>(const_cast<int32_t*>(p.indices)) + 64; expect_invalid(p, "lse"); }
  { auto p = P(); p.topk_length = reinterpret_cast<const int32_t*>(p.max_logits) + 100; expect_invalid(p, "max_logits"); }
  { auto p = P(); p.lse = reinterpret_cast<float*>(const_cast<void*>(p.kv)) + 99 * 288; expect_invalid(p, "lse"); }
  { auto p = P(); p.attn_sink = p.lse + 64; expect_invalid(p, "lse"); }
  { auto p = P(); p.attn_sink = fake<const float>(kLen, 2); expect_invalid(p, "attn_sink"); }
  // in-bounds neighbours are fine: out right after q, lse right after max_logits
  { auto p = P(); p.out = static_cast<char*>(const_cast<void*>(p.q)) + 3 * 128 * 576 * 2;
    EXPECT_TRUE(check_sparse_mla_prefill(p).ok()) << check_sparse_mla_prefill(p).to_string(); }
  { auto p = P(); p.lse = p.max_logits + 3 * 128; EXPECT_TRUE(check_sparse_mla_prefill(p).ok()); }
  // kv is not read when topk == 0: it may be anywhere
  { auto p = P(); p.topk = 0; p.kv = p.out; EXPECT_TRUE(check_sparse_mla_prefill(p).ok()); }
  // The strided oracle runs the same checks.
  { auto p = P(); p.out = const_cast<void*>(p.q);
    const Status st = ref::sparse_mla_prefill_strided(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("out:"), std::string::npos) << st.message(); }
}

TEST(PrefillChecks, BoundsTopk) {
  auto p = valid_params();
  p.topk = (1 << 30) + 64;
  p.indices_token_stride = p.topk;
  expect_invalid(p, "topk");
  p.num_tokens = 0;
  expect_invalid(p, "topk");
}

}  // namespace
