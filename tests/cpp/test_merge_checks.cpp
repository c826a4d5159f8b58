// C9 merge_attn_states: CPU tests of the argument rules, the zero-size no-op and the oracle on
// the Params struct (dtypes, strides, the pos_inf_is_empty flag).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "reference/oracle.h"
#include "selkv/merge.h"
#include "test_util.h"

namespace {

using namespace selkv;

constexpr float kInf = std::numeric_limits<float>::infinity();

// N = 3 shards of bf16 [T=2, H=3, D=16], dense, in one buffer; out and lse separate.
struct Fixture {
  static constexpr int N = 3, T = 2, H = 3, D = 16;
  alignas(16) uint16_t in[N * T * H * D] = {};
  alignas(16) float in_lse[N * T * H] = {};
  alignas(16) uint16_t out[T * H * D] = {};
  alignas(16) float lse[T * H] = {};
  MergeAttnStatesParams p;
  Fixture() {
    p.num_shards = N;
    p.num_tokens = T;
    p.num_heads = H;
    p.head_dim = D;
    p.dtype = MergeDtype::kBf16;
    for (int i = 0; i < N; ++i) {
      p.outs[i] = in + i * T * H * D;
      p.lses[i] = in_lse + i * T * H;
    }
    p.outs_token_stride = H * D;
    p.outs_head_stride = D;
    p.lses_token_stride = H;
    p.lses_head_stride = 1;
    p.out = out;
    p.out_token_stride = H * D;
    p.out_head_stride = D;
    p.lse = lse;
    p.lse_token_stride = H;
    p.lse_head_stride = 1;
  }
};

void expect_invalid(const MergeAttnStatesParams& p, const char* arg) {
  const Status st = check_merge_attn_states(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << arg << ": " << st.to_string();
  EXPECT_NE(st.message().find(std::string(": ") + arg + ":"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("selkv::merge_attn_states"), std::string::npos);
  // The launcher runs the same checks before touching the device.
  EXPECT_EQ(merge_attn_states(p, nullptr).code(), StatusCode::kInvalidArgument) << arg;
}

TEST(MergeChecks, AcceptsValid) {
  Fixture f;
  EXPECT_TRUE(check_merge_attn_states(f.p).ok()) << check_merge_attn_states(f.p).to_string();
  f.p.lse = nullptr;  // out only
  EXPECT_TRUE(check_merge_attn_states(f.p).ok());
  f.p.num_shards = 1;
  EXPECT_TRUE(check_merge_attn_states(f.p).ok());
  // [H, T] lse layouts (vLLM's) and broadcast inputs (stride 0) are fine.
  f.p.lses_token_stride = 1;
  f.p.lses_head_stride = Fixture::T;
  f.p.outs_token_stride = 0;
  EXPECT_TRUE(check_merge_attn_states(f.p).ok());
}

TEST(MergeChecks, ZeroSizeIsNoOp) {
  for (int which = 0; which < 2; ++which) {
    MergeAttnStatesParams p;
    p.num_shards = 2;
    p.head_dim = 64;
    p.num_tokens = which == 0 ? 0 : 5;
    p.num_heads = which == 0 ? 7 : 0;
    EXPECT_TRUE(check_merge_attn_states(p).ok()) << check_merge_attn_states(p).to_string();
    EXPECT_TRUE(merge_attn_states(p, nullptr).ok());  // no launch, null pointers allowed
    EXPECT_TRUE(ref::merge_attn_states(p).ok());
  }
  // The scalar rules still apply to an empty call.
  MergeAttnStatesParams p;
  p.num_shards = 0;
  p.head_dim = 64;
  expect_invalid(p, "num_shards");
  p.num_shards = 2;
  p.head_dim = 12;
  expect_invalid(p, "head_dim");
}

TEST(MergeChecks, RejectsScalars) {
  {
    Fixture f;
    f.p.num_shards = 0;
    expect_invalid(f.p, "num_shards");
    f.p.num_shards = kMaxMergeShards + 1;
    expect_invalid(f.p, "num_shards");
  }
  for (int d : {0, -8, 4, 12, 65544}) {
    Fixture f;
    f.p.head_dim = d;
    expect_invalid(f.p, "head_dim");
  }
  {
    Fixture f;
    f.p.num_tokens = -1;
    expect_invalid(f.p, "num_tokens");
    f.p.num_tokens = int64_t(1) << 24;
    f.p.num_heads = 128;  // T * H = 2^31
    expect_invalid(f.p, "num_tokens");
  }
  {
    Fixture f;
    f.p.num_heads = -1;
    expect_invalid(f.p, "num_heads");
  }
  {
    Fixture f;
    f.p.dtype = static_cast<MergeDtype>(7);
    expect_invalid(f.p, "dtype");
  }
}

TEST(MergeChecks, RejectsPointersAndAlignment) {
  {
    Fixture f;
    f.p.outs[2] = nullptr;
    expect_invalid(f.p, "outs");
  }
  {
    Fixture f;
    f.p.lses[1] = nullptr;
    expect_invalid(f.p, "lses");
  }
  {
    Fixture f;
    f.p.out = nullptr;
    expect_invalid(f.p, "out");
  }
  {
    Fixture f;
    f.p.outs[1] = f.in + Fixture::T * Fixture::H * Fixture::D + 4;  // 8-byte aligned only
    expect_invalid(f.p, "outs");
  }
  {
    Fixture f;
    f.p.out = f.out + 4;
    f.p.num_tokens = 1;
    expect_invalid(f.p, "out");
  }
  {
    Fixture f;
    f.p.lses[0] = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(f.in_lse) + 2);
    expect_invalid(f.p, "lses");
  }
  {
    Fixture f;
    f.p.lse = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(f.lse) + 1);
    expect_invalid(f.p, "lse");
  }
}

TEST(MergeChecks, RejectsStrides) {
  const struct {
    int64_t MergeAttnStatesParams::*field;
    const char* name;
    int64_t value;
  } cases[] = {
      {&MergeAttnStatesParams::outs_token_stride, "outs_token_stride", -48},
      {&MergeAttnStatesParams::outs_token_stride, "outs_token_stride", 44},  // not 16-byte
      {&MergeAttnStatesParams::outs_head_stride, "outs_head_stride", 4},
      {&MergeAttnStatesParams::lses_token_stride, "lses_token_stride", -1},
      {&MergeAttnStatesParams::lses_head_stride, "lses_head_stride", -1},
      {&MergeAttnStatesParams::out_token_stride, "out_token_stride", 20},
      {&MergeAttnStatesParams::out_head_stride, "out_head_stride", -16},
      {&MergeAttnStatesParams::lse_token_stride, "lse_token_stride", -3},
      {&MergeAttnStatesParams::lse_head_stride, "lse_head_stride", -1},
  };
  for (const auto& c : cases) {
    Fixture f;
    f.p.*c.field = c.value;
    expect_invalid(f.p, c.name);
  }
}

TEST(MergeChecks, RejectsOverlaps) {
  {
    Fixture f;  // out over shard 1's out
    f.p.out = const_cast<void*>(f.p.outs[1]);
    expect_invalid(f.p, "out");
  }
  {
    Fixture f;  // out over the lses
    f.p.out = f.in_lse;
    expect_invalid(f.p, "out");
  }
  {
    Fixture f;  // lse over an input lse
    f.p.lse = const_cast<float*>(f.p.lses[2]);
    expect_invalid(f.p, "lse");
  }
  {
    Fixture f;  // lse over out
    f.p.lse = reinterpret_cast<float*>(f.out);
    expect_invalid(f.p, "lse");
  }
  {
    Fixture f;  // out rows alias each other (expanded output)
    f.p.out_head_stride = 0;
    expect_invalid(f.p, "out");
  }
  {
    Fixture f;
    f.p.lse_token_stride = 1;
    f.p.lse_head_stride = 1;
    expect_invalid(f.p, "lse");
  }
}

// ---- the oracle on the Params struct ---------------------------------------------------------

TEST(MergeOracleParams, StridedDtypesMatchDenseOracle) {
  std::mt19937_64 rng(selkv::test::test_seed());
  std::normal_distribution<float> nd(0.f, 1.f);
  constexpr int N = 3, T = 3, H = 2, D = 8;
  for (MergeDtype dt : {MergeDtype::kBf16, MergeDtype::kFp16, MergeDtype::kFp32}) {
    const int es = dt == MergeDtype::kFp32 ? 4 : 2;
    // Padded: token stride H * D + 8, head stride D + 8; lse in [H, T] layout.
    const int64_t ts = H * (D + 8) + 8, hs = D + 8;
    std::vector<uint8_t> in(size_t(N) * T * ts * es), out(size_t(T) * ts * es);
    std::vector<float> lin(size_t(N) * T * H), lout(size_t(H) * T, -99.f);
    std::vector<float> dense(size_t(N) * T * H * D), dense_lse(size_t(N) * T * H);
    for (int i = 0; i < N; ++i)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
          const float l = (t == 1 && i == 2) ? -kInf : nd(rng);
          lin[size_t(i) * T * H + h * T + t] = l;
          dense_lse[size_t(i) * T * H + t * H + h] = l;
          for (int c = 0; c < D; ++c) {
            float x = nd(rng);
            const int64_t idx = int64_t(i) * T * ts + t * ts + h * hs + c;
            if (dt == MergeDtype::kBf16) {
              reinterpret_cast<uint16_t*>(in.data())[idx] = codec::float_to_bf16(x);
              x = codec::bf16_to_float(codec::float_to_bf16(x));
            } else if (dt == MergeDtype::kFp16) {
              reinterpret_cast<uint16_t*>(in.data())[idx] = codec::float_to_f16(x);
              x = codec::f16_to_float(codec::float_to_f16(x));
            } else {
              reinterpret_cast<float*>(in.data())[idx] = x;
            }
            dense[((size_t(i) * T + t) * H + h) * D + c] = x;
          }
        }
    MergeAttnStatesParams p;
    p.num_shards = N;
    p.num_tokens = T;
    p.num_heads = H;
    p.head_dim = D;
    p.dtype = dt;
    for (int i = 0; i < N; ++i) {
      p.outs[i] = in.data() + size_t(i) * T * ts * es;
      p.lses[i] = lin.data() + size_t(i) * T * H;
    }
    p.outs_token_stride = p.out_token_stride = ts;
    p.outs_head_stride = p.out_head_stride = hs;
    p.lses_token_stride = p.lse_token_stride = 1;
    p.lses_head_stride = p.lse_head_stride = T;
    p.out = out.data();
    p.lse = lout.data();
    ASSERT_TRUE(ref::merge_attn_states(p).ok());
    std::vector<float> want(size_t(T) * H * D), want_lse(size_t(T) * H);
    ref::lse_merge(dense.data(), dense_lse.data(), N, T * H, D, want.data(), want_lse.data());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        EXPECT_EQ(lout[h * T + t], want_lse[t * H + h]);
        for (int c = 0; c < D; ++c) {
          const int64_t idx = t * ts + h * hs + c;
          const float w = want[(size_t(t) * H + h) * D + c];
          if (dt == MergeDtype::kBf16)
            EXPECT_EQ(reinterpret_cast<uint16_t*>(out.data())[idx], codec::float_to_bf16(w));
          else if (dt == MergeDtype::kFp16)
            EXPECT_EQ(reinterpret_cast<uint16_t*>(out.data())[idx], codec::float_to_f16(w));
          else
            EXPECT_EQ(reinterpret_cast<float*>(out.data())[idx], w);
        }
      }
  }
}

TEST(Codec, F16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t b = uint16_t(h);
    const float f = codec::f16_to_float(b);
    if (std::isnan(f)) {
      EXPECT_EQ(codec::float_to_f16(f), 0x7fffu);
      continue;
    }
    EXPECT_EQ(codec::float_to_f16(f), b) << h;
  }
  EXPECT_EQ(codec::float_to_f16(65504.f), 0x7bffu);
  EXPECT_EQ(codec::float_to_f16(65519.f), 0x7bffu);
  EXPECT_EQ(codec::float_to_f16(65520.f), 0x7c00u);
  EXPECT_EQ(codec::float_to_f16(1.f + 1.f / 2048), 0x3c00u);       // tie to even
  EXPECT_EQ(codec::float_to_f16(1.f + 3.f / 2048), 0x3c02u);       // tie to even (up)
  EXPECT_EQ(codec::float_to_f16(std::ldexp(1.f, -25)), 0x0000u);   // tie to even (0)
  EXPECT_EQ(codec::float_to_f16(std::ldexp(1.5f, -25)), 0x0001u);
  EXPECT_EQ(codec::float_to_f16(-std::ldexp(1.f, -24)), 0x8001u);
  EXPECT_EQ(codec::float_to_f16(std::ldexp(1023.5f, -24)), 0x0400u);  // subnormal rounds to normal
}

}  // namespace
