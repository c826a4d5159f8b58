// C9 merge_attn_states on the GPU against the oracle (ref::merge_attn_states on the same Params
// with host pointers): N = 1..16, bf16 / fp16 / fp32, dense and padded (strided) layouts, [T, H]
// and [H, T] lse, -inf / +inf / NaN rows (incl. NaN in the out of an empty shard), the
// pos_inf_is_empty flag, padding never written, CUDA-graph replay and repeats bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "formats/codec.h"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/merge.h"
#include "test_util.h"

namespace selkv {
namespace {

using test::DevBuf;

constexpr float kInf = std::numeric_limits<float>::infinity();

int elem_bytes(MergeDtype d) { return d == MergeDtype::kFp32 ? 4 : 2; }

void put(uint8_t* base, int64_t idx, MergeDtype d, float v) {
  if (d == MergeDtype::kFp32) {
    std::memcpy(base + idx * 4, &v, 4);
    return;
  }
  const uint16_t h = d == MergeDtype::kBf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
  std::memcpy(base + idx * 2, &h, 2);
}

float get(const uint8_t* base, int64_t idx, MergeDtype d) {
  if (d == MergeDtype::kFp32) {
    float v;
    std::memcpy(&v, base + idx * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, base + idx * 2, 2);
  return d == MergeDtype::kBf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h);
}

// One unit in the last place of the dtype at |x| (x finite).
double ulp(MergeDtype d, double x) {
  const int mant = d == MergeDtype::kBf16 ? 7 : d == MergeDtype::kFp16 ? 10 : 23;
  const int min_exp = d == MergeDtype::kBf16 ? -126 : d == MergeDtype::kFp16 ? -14 : -126;
  int e = x == 0 ? min_exp : std::ilogb(x);
  if (e < min_exp) e = min_exp;
  return std::ldexp(1.0, e - mant);
}

struct Config {
  int N = 2, T = 3, H = 2, D = 64;
  MergeDtype dtype = MergeDtype::kBf16;
  bool padded = false;      // strided rows: extra 16-byte vectors between heads and tokens
  bool lse_head_major = false;  // lse tensors [H, T] (vLLM's layout)
  bool pos_inf_is_empty = false;
  bool with_lse = true;
};

// Host and device copies of one problem, with the Params for both.
struct Case {
  Config c;
  int64_t in_ts = 0, in_hs = 0, out_ts = 0, out_hs = 0;
  int64_t lin_ts = 0, lin_hs = 0, lout_ts = 0, lout_hs = 0;
  int64_t in_elems = 0, lin_elems = 0, out_elems = 0, lout_elems = 0;
  std::vector<std::vector<uint8_t>> h_in;
  std::vector<std::vector<float>> h_lin;
  std::vector<uint8_t> h_out0;   // the initial (poisoned) output
  std::vector<float> h_lout0;
  std::vector<std::unique_ptr<DevBuf>> d_in, d_lin;
  std::unique_ptr<DevBuf> d_out, d_lout;

  explicit Case(const Config& cfg, std::mt19937_64& rng) : c(cfg) {
    const int es = elem_bytes(c.dtype), vec = 16 / es;
    const int pad = c.padded ? vec : 0;
    in_hs = c.D + pad;
    in_ts = int64_t(c.H) * in_hs + 2 * pad;
    out_hs = c.D + 2 * pad;
    out_ts = int64_t(c.H) * out_hs + pad;
    if (c.lse_head_major) {
      lin_ts = 1, lin_hs = c.T + (c.padded ? 3 : 0);
      lout_ts = 1, lout_hs = c.T + (c.padded ? 1 : 0);
    } else {
      lin_hs = 1, lin_ts = c.H + (c.padded ? 3 : 0);
      lout_hs = 1, lout_ts = c.H + (c.padded ? 2 : 0);
    }
    in_elems = int64_t(c.T) * in_ts;
    out_elems = int64_t(c.T) * out_ts;
    lin_elems = c.lse_head_major ? int64_t(c.H) * lin_hs : int64_t(c.T) * lin_ts;
    lout_elems = c.lse_head_major ? int64_t(c.H) * lout_hs : int64_t(c.T) * lout_ts;

    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pattern(0, 9), shard(0, c.N - 1);
    const float nan = std::nanf("");
    h_in.assign(c.N, std::vector<uint8_t>(size_t(in_elems) * es));
    h_lin.assign(c.N, std::vector<float>(size_t(lin_elems), nan));  // padding: NaN, never read
    for (int i = 0; i < c.N; ++i)
      for (int64_t e = 0; e < in_elems; ++e) put(h_in[i].data(), e, c.dtype, nan);
    for (int t = 0; t < c.T; ++t)
      for (int h = 0; h < c.H; ++h) {
        std::vector<float> l(c.N);
        std::vector<bool> nan_out(c.N, false);
        for (int i = 0; i < c.N; ++i) l[i] = 3.f * nd(rng);
        switch (pattern(rng)) {
          case 0:  // some empty shards whose out holds NaN
            for (int i = 0; i < c.N; ++i)
              if (i % 2 == (t + h) % 2) l[i] = -kInf, nan_out[i] = true;
            break;
          case 1:  // all empty (NaN outs too)
            for (int i = 0; i < c.N; ++i) l[i] = -kInf, nan_out[i] = true;
            break;
          case 2:  // one NaN lse
            l[shard(rng)] = nan;
            break;
          case 3:  // +inf in one or two shards
            l[shard(rng)] = kInf;
            l[shard(rng)] = kInf;
            break;
          case 4: {  // +inf shards whose out is NaN, the rest finite or empty
            const int s = shard(rng);
            l[s] = kInf, nan_out[s] = true;
            l[shard(rng)] = -kInf;
            break;
          }
          case 5: {  // one live shard
            const int s = shard(rng);
            for (int i = 0; i < c.N; ++i)
              if (i != s) l[i] = -kInf, nan_out[i] = true;
            break;
          }
          case 6:  // far-apart lses: tiny weights
            l[shard(rng)] += 120.f;
            break;
          default:
            break;
        }
        for (int i = 0; i < c.N; ++i) {
          h_lin[i][t * lin_ts + h * lin_hs] = l[i];
          for (int d = 0; d < c.D; ++d)
            put(h_in[i].data(), t * in_ts + h * in_hs + d, c.dtype, nan_out[i] ? nan : nd(rng));
        }
      }
    h_out0.resize(size_t(out_elems) * es);
    for (size_t b = 0; b < h_out0.size(); ++b) h_out0[b] = uint8_t(0x5a + b);
    h_lout0.assign(size_t(lout_elems), -12345.f);

    for (int i = 0; i < c.N; ++i) {
      d_in.emplace_back(new DevBuf(h_in[i].size()));
      d_in.back()->upload(h_in[i]);
      d_lin.emplace_back(new DevBuf(h_lin[i].size() * 4));
      d_lin.back()->upload(h_lin[i]);
    }
    d_out.reset(new DevBuf(h_out0.size()));
    d_lout.reset(new DevBuf(h_lout0.size() * 4));
    reset();
  }

  // Synchronizes: a pageable upload may still be in flight when cudaMemcpy returns, and the
  // graph test launches on a non-blocking stream.
  void reset() {
    d_out->upload(h_out0);
    d_lout->upload(h_lout0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  MergeAttnStatesParams params(bool device, std::vector<uint8_t>* host_out,
                               std::vector<float>* host_lout) const {
    MergeAttnStatesParams p;
    p.num_shards = c.N;
    p.num_tokens = c.T;
    p.num_heads = c.H;
    p.head_dim = c.D;
    p.dtype = c.dtype;
    for (int i = 0; i < c.N; ++i) {
      p.outs[i] = device ? d_in[i]->ptr : static_cast<const void*>(h_in[i].data());
      p.lses[i] = device ? d_lin[i]->as<float>() : h_lin[i].data();
    }
    p.outs_token_stride = in_ts;
    p.outs_head_stride = in_hs;
    p.lses_token_stride = lin_ts;
    p.lses_head_stride = lin_hs;
    p.out = device ? d_out->ptr : static_cast<void*>(host_out->data());
    p.out_token_stride = out_ts;
    p.out_head_stride = out_hs;
    p.lse = !c.with_lse ? nullptr : device ? d_lout->as<float>() : host_lout->data();
    p.lse_token_stride = lout_ts;
    p.lse_head_stride = lout_hs;
    p.pos_inf_is_empty = c.pos_inf_is_empty;
    return p;
  }
};

std::string describe(const Config& c) {
  return "N=" + std::to_string(c.N) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " D=" + std::to_string(c.D) + " dtype=" + std::to_string(int(c.dtype)) +
         " padded=" + std::to_string(c.padded) + " head_major=" + std::to_string(c.lse_head_major) +
         " pos_inf_is_empty=" + std::to_string(c.pos_inf_is_empty) + " lse=" + std::to_string(c.with_lse) +
         " seed=" + std::to_string(test::test_seed());
}

void run_and_compare(const Config& cfg, uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() + salt);
  Case k(cfg, rng);
  SCOPED_TRACE(describe(cfg));
  ASSERT_TRUE(merge_attn_states(k.params(true, nullptr, nullptr), nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = k.d_out->download<uint8_t>();
  const auto got_l = k.d_lout->download<float>();

  std::vector<uint8_t> want = k.h_out0;
  std::vector<float> want_l = k.h_lout0;
  ASSERT_TRUE(ref::merge_attn_states(k.params(false, &want, &want_l)).ok());

  const MergeDtype dt = cfg.dtype;
  int bad = 0;
  for (int t = 0; t < cfg.T && bad < 10; ++t)
    for (int h = 0; h < cfg.H && bad < 10; ++h) {
      const int64_t base = t * k.out_ts + h * k.out_hs;
      double row_max = 0;
      for (int d = 0; d < cfg.D; ++d) {
        const float w = get(want.data(), base + d, dt);
        if (std::isfinite(w)) row_max = std::max(row_max, std::fabs(double(w)));
      }
      for (int d = 0; d < cfg.D; ++d) {
        const float g = get(got.data(), base + d, dt), w = get(want.data(), base + d, dt);
        bool ok;
        if (std::isnan(w) || std::isinf(w)) {
          ok = std::isnan(w) ? std::isnan(g) : g == w;
        } else {
          // bf16 / fp16: 2 ulps of the oracle's rounded result; fp32: relative to the row.
          const double tol = dt == MergeDtype::kFp32 ? 4e-6 * (std::fabs(double(w)) + row_max)
                                                     : 2 * ulp(dt, std::fabs(w)) + 1e-6 * row_max;
          ok = std::fabs(double(g) - double(w)) <= tol;
        }
        if (!ok && ++bad <= 10)
          ADD_FAILURE() << "out t=" << t << " h=" << h << " d=" << d << " got " << g << " want " << w;
      }
      if (cfg.with_lse) {
        const int64_t li = t * k.lout_ts + h * k.lout_hs;
        const float g = got_l[li], w = want_l[li];
        const bool ok = std::isnan(w) ? std::isnan(g)
                        : std::isinf(w) ? g == w
                                        : std::fabs(double(g) - w) <= 2e-6 * std::max(1.0, std::fabs(double(w)));
        if (!ok && ++bad <= 10) ADD_FAILURE() << "lse t=" << t << " h=" << h << " got " << g << " want " << w;
      }
    }
  // Padding (bytes outside the views) is never written.
  std::vector<bool> in_view(got.size(), false);
  const int es = elem_bytes(dt);
  for (int t = 0; t < cfg.T; ++t)
    for (int h = 0; h < cfg.H; ++h)
      for (int64_t b = 0; b < int64_t(cfg.D) * es; ++b) in_view[(t * k.out_ts + h * k.out_hs) * es + b] = true;
  for (size_t b = 0; b < got.size(); ++b)
    if (!in_view[b]) ASSERT_EQ(got[b], k.h_out0[b]) << "out padding byte " << b << " written";
  std::vector<bool> l_view(got_l.size(), false);
  if (cfg.with_lse)
    for (int t = 0; t < cfg.T; ++t)
      for (int h = 0; h < cfg.H; ++h) l_view[t * k.lout_ts + h * k.lout_hs] = true;
  for (size_t i = 0; i < got_l.size(); ++i)
    if (!l_view[i]) ASSERT_EQ(got_l[i], k.h_lout0[i]) << "lse element " << i << " written";
}

TEST(MergeGpu, MatchesOracleAcrossShardsDtypesLayouts) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 0;
  for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 16})
    for (MergeDtype dt : {MergeDtype::kBf16, MergeDtype::kFp16, MergeDtype::kFp32})
      for (int shape = 0; shape < 3; ++shape) {
        Config c;
        c.N = n;
        c.dtype = dt;
        // D = 72: 9 (bf16) or 18 (fp32) vectors, lanes partly idle; D = 512; D = 1024 fp32:
        // several steps per lane.
        if (shape == 0) c.T = 7, c.H = 5, c.D = 72;
        if (shape == 1) c.T = 5, c.H = 3, c.D = 512;
        if (shape == 2) c.T = 3, c.H = 2, c.D = 1024;
        c.padded = (n + shape) % 2 == 1;
        c.lse_head_major = shape == 1;
        c.pos_inf_is_empty = n % 3 == 0;
        c.with_lse = !(n == 5 && shape == 0);
        run_and_compare(c, ++salt);
        if (HasFatalFailure()) return;
      }
}

TEST(MergeGpu, SmallHeadDimsAndFlags) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 1000;
  for (int d : {8, 16, 24, 40, 64, 128, 256, 576})
    for (bool flag : {false, true})
      for (bool padded : {false, true}) {
        Config c;
        c.N = 2 + d % 5;
        c.T = 9;
        c.H = 4;
        c.D = d;
        c.dtype = d % 16 == 0 ? MergeDtype::kBf16 : MergeDtype::kFp16;
        c.pos_inf_is_empty = flag;
        c.padded = padded;
        c.lse_head_major = flag;
        run_and_compare(c, ++salt);
        if (HasFatalFailure()) return;
      }
}

// More rows than one CTA wave holds at once, so many CTAs run and the row mapping is exercised.
TEST(MergeGpu, ManyRows) {
  SELKV_REQUIRE_GPU();
  Config c;
  c.N = 8;
  c.T = 1031;
  c.H = 16;
  c.D = 128;
  c.padded = true;
  run_and_compare(c, 7);
  c.N = 2;
  c.dtype = MergeDtype::kFp16;
  c.lse_head_major = true;
  c.pos_inf_is_empty = true;
  run_and_compare(c, 8);
}

TEST(MergeGpu, GraphReplayAndRepeatBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 77);
  Config c;
  c.N = 5;
  c.T = 33;
  c.H = 8;
  c.D = 512;
  c.padded = true;
  Case k(c, rng);
  const MergeAttnStatesParams p = k.params(true, nullptr, nullptr);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_TRUE(merge_attn_states(p, s).ok());
  CUDA_OK(cudaStreamSynchronize(s));
  const auto eager_out = k.d_out->download<uint8_t>();
  const auto eager_lse = k.d_lout->download<float>();
  k.reset();
  ASSERT_TRUE(merge_attn_states(p, s).ok());
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(k.d_out->download<uint8_t>(), eager_out);
  auto same_float_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  EXPECT_TRUE(same_float_bits(k.d_lout->download<float>(), eager_lse));

  k.reset();
  CUDA_OK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status st = merge_attn_states(p, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaGraphLaunch(exec, s));  // replay twice: idempotent
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(k.d_out->download<uint8_t>(), eager_out);
  EXPECT_TRUE(same_float_bits(k.d_lout->download<float>(), eager_lse));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// The launcher rejects bad arguments before any launch (messages name the argument).
TEST(MergeGpu, RejectsBeforeLaunch) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 5);
  Config c;
  Case k(c, rng);
  MergeAttnStatesParams p = k.params(true, nullptr, nullptr);
  p.out = const_cast<void*>(p.outs[0]);
  const Status st = merge_attn_states(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("out"), std::string::npos) << st.message();
  CUDA_OK(cudaGetLastError());
}

}  // namespace
}  // namespace selkv
