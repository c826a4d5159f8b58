// C7 sparse MLA prefill: argument validation (CPU, no GPU needed).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "selkv/prefill.h"

namespace {

using namespace selkv;

alignas(16) uint8_t g_buf[4096];

SparsePrefillParams valid_params() {
  SparsePrefillParams p;
  p.q = g_buf;
  p.num_tokens = 3;
  p.num_heads = 128;
  p.d_qk = 576;
  p.kv = g_buf;
  p.num_kv = 100;
  p.indices = reinterpret_cast<const int32_t*>(g_buf);
  p.topk = 192;  // 64 * odd
  p.sm_scale = 0.03f;
  p.out = g_buf;
  p.max_logits = reinterpret_cast<float*>(g_buf);
  p.lse = reinterpret_cast<float*>(g_buf);
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
  { auto p = P(); p.q = g_buf + 2; expect_invalid(p, "q"); }
  { auto p = P(); p.q_head_stride = 512; expect_invalid(p, "q_head_stride"); }
  { auto p = P(); p.q_head_stride = 580; expect_invalid(p, "q_head_stride"); }
  { auto p = P(); p.q_token_stride = 576 * 64; expect_invalid(p, "q_token_stride"); }
  { auto p = P(); p.q_token_stride += 4; expect_invalid(p, "q_token_stride"); }
  { auto p = P(); p.kv = nullptr; expect_invalid(p, "kv"); }
  { auto p = P(); p.kv = g_buf + 8; expect_invalid(p, "kv"); }
  { auto p = P(); p.kv_row_stride = 512; expect_invalid(p, "kv_row_stride"); }
  { auto p = P(); p.kv_row_stride = 577; expect_invalid(p, "kv_row_stride"); }
  { auto p = P(); p.indices = nullptr; expect_invalid(p, "indices"); }
  { auto p = P(); p.indices = reinterpret_cast<const int32_t*>(g_buf + 2); expect_invalid(p, "indices"); }
  { auto p = P(); p.indices_token_stride = 128; expect_invalid(p, "indices_token_stride"); }
  { auto p = P(); p.topk_length = reinterpret_cast<const int32_t*>(g_buf + 1); expect_invalid(p, "topk_length"); }
  { auto p = P(); p.out = nullptr; expect_invalid(p, "out"); }
  { auto p = P(); p.out = g_buf + 4; expect_invalid(p, "out"); }
  { auto p = P(); p.out_head_stride = 256; expect_invalid(p, "out_head_stride"); }
  { auto p = P(); p.out_head_stride = 516; expect_invalid(p, "out_head_stride"); }
  { auto p = P(); p.out_token_stride = 512; expect_invalid(p, "out_token_stride"); }
  { auto p = P(); p.max_logits = reinterpret_cast<float*>(g_buf + 2); expect_invalid(p, "max_logits"); }
  { auto p = P(); p.max_logits_token_stride = 64; expect_invalid(p, "max_logits_token_stride"); }
  { auto p = P(); p.lse = reinterpret_cast<float*>(g_buf + 1); expect_invalid(p, "lse"); }
  { auto p = P(); p.lse_token_stride = 127; expect_invalid(p, "lse_token_stride"); }
}

}  // namespace
