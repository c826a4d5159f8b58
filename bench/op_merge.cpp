// C9 LSE merge: N shards of (out [T, H, D] bf16, lse [T, H] fp32) -> out, lse.
// Bytes: N * (T*H*D*2 + T*H*4) read + T*H*D*2 + T*H*4 written; the floor is a device copy of
// the same bytes (the harness's % of the copy ceiling).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "formats/codec.h"
#include "reference/oracle.h"
#include "selkv/merge.h"
#include "cache_common.h"

namespace selkv::bench {
namespace {

struct MergeShape {
  int32_t shards = 2;
  int64_t tokens = 4096;
  int32_t heads = 128;
  int32_t dim = 512;
  uint64_t seed = 9;
};

std::string shape_str(const MergeShape& s) {
  return "N=" + std::to_string(s.shards) + " T=" + human_count(s.tokens) + " H=" + std::to_string(s.heads) +
         " D=" + std::to_string(s.dim);
}

// Dense stacked shards: shard i at base + i * T * H * D.
MergeAttnStatesParams merge_params(const MergeShape& s, const uint16_t* outs, const float* lses, int64_t tokens,
                                   void* out, float* lse) {
  MergeAttnStatesParams p;
  p.num_shards = s.shards;
  p.num_tokens = tokens;
  p.num_heads = s.heads;
  p.head_dim = s.dim;
  p.dtype = MergeDtype::kBf16;
  for (int i = 0; i < s.shards; ++i) {
    p.outs[i] = outs + size_t(i) * tokens * s.heads * s.dim;
    p.lses[i] = lses + size_t(i) * tokens * s.heads;
  }
  p.outs_token_stride = p.out_token_stride = int64_t(s.heads) * s.dim;
  p.outs_head_stride = p.out_head_stride = s.dim;
  p.lses_token_stride = p.lse_token_stride = s.heads;
  p.lses_head_stride = p.lse_head_stride = 1;
  p.out = out;
  p.lse = lse;
  return p;
}

class MergeWorkload final : public Workload {
 public:
  explicit MergeWorkload(const MergeShape& s)
      : s_(s),
        rows_(s.tokens * s.heads),
        outs_(size_t(s.shards) * rows_ * s.dim * 2),
        lses_(size_t(s.shards) * rows_ * 4),
        out_(size_t(rows_) * s.dim * 2),
        lse_(size_t(rows_) * 4) {
    device_fill_random_bf16(outs_.get(), size_t(s.shards) * rows_ * s.dim, s.seed, nullptr);
    Rng rng(s.seed ^ 0x15e);
    std::vector<float> l(size_t(s.shards) * rows_);
    for (auto& x : l) x = 3.f * rng.normal();
    SELKV_BENCH_CUDA(cudaMemcpy(lses_.get(), l.data(), l.size() * 4, cudaMemcpyHostToDevice));
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }

  std::string shape() const override { return shape_str(s_); }
  std::string variant() const override { return "bf16"; }
  double bytes() const override { return double(merge_attn_states_bytes(params())); }
  void run(cudaStream_t stream) override { throw_if_error(merge_attn_states(params(), stream)); }

  // Sample tokens (first, middle, last): the oracle on each token's shard slices.
  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(0xff, stream);
    lse_.fill_async(0xff, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const int64_t hd = int64_t(s_.heads) * s_.dim;
    for (int64_t t : {int64_t(0), s_.tokens / 2, s_.tokens - 1}) {
      std::vector<uint16_t> in(size_t(s_.shards) * hd), got(static_cast<size_t>(hd)), want(static_cast<size_t>(hd));
      std::vector<float> lin(size_t(s_.shards) * s_.heads), got_l(size_t(s_.heads)), want_l(size_t(s_.heads));
      for (int i = 0; i < s_.shards; ++i) {
        SELKV_BENCH_CUDA(cudaMemcpy(&in[size_t(i) * hd], outs_.as<uint16_t>() + (size_t(i) * rows_ + t * s_.heads) * s_.dim,
                                    size_t(hd) * 2, cudaMemcpyDeviceToHost));
        SELKV_BENCH_CUDA(cudaMemcpy(&lin[size_t(i) * s_.heads], lses_.as<float>() + size_t(i) * rows_ + t * s_.heads,
                                    size_t(s_.heads) * 4, cudaMemcpyDeviceToHost));
      }
      SELKV_BENCH_CUDA(cudaMemcpy(got.data(), out_.as<uint16_t>() + t * hd, size_t(hd) * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(got_l.data(), lse_.as<float>() + t * s_.heads, size_t(s_.heads) * 4,
                                  cudaMemcpyDeviceToHost));
      const Status st = ref::merge_attn_states(merge_params(s_, in.data(), lin.data(), 1, want.data(), want_l.data()));
      if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
      // 2 bf16 ulps of the result, plus the fp32 accumulation's error where the shards' weighted
      // values cancel: 1e-6 of the largest input of the row (as the GPU tests).
      std::vector<float> row_max(size_t(s_.heads), 0.f);
      for (int i = 0; i < s_.shards; ++i)
        for (int64_t e = 0; e < hd; ++e)
          row_max[size_t(e / s_.dim)] =
              std::fmax(row_max[size_t(e / s_.dim)], std::fabs(codec::bf16_to_float(in[size_t(i * hd + e)])));
      for (int64_t e = 0; e < hd; ++e) {
        const float g = codec::bf16_to_float(got[size_t(e)]), w = codec::bf16_to_float(want[size_t(e)]);
        if (!(std::fabs(g - w) <= std::ldexp(1.f, std::ilogb(std::fabs(w) + 1e-30f) - 6) + 1e-6f * row_max[size_t(e / s_.dim)])) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "t %lld h %lld d %lld: got %g want %g", (long long)t,
                        (long long)(e / s_.dim), (long long)(e % s_.dim), g, w);
          return CheckResult::fail(buf);
        }
      }
      for (int h = 0; h < s_.heads; ++h)
        if (!(std::fabs(got_l[size_t(h)] - want_l[size_t(h)]) <= 1e-5f * std::fmax(1.f, std::fabs(want_l[size_t(h)]))))
          return CheckResult::fail("lse t " + std::to_string(t) + " h " + std::to_string(h));
    }
    return CheckResult::pass("within 2 bf16 ulps + 1e-6 of the row's max input, 3 tokens x " +
                             std::to_string(s_.heads) + " heads");
  }

 private:
  MergeAttnStatesParams params() const {
    return merge_params(s_, outs_.as<uint16_t>(), lses_.as<float>(), s_.tokens, out_.get(), lse_.as<float>());
  }
  MergeShape s_;
  int64_t rows_;
  DeviceBuffer outs_, lses_, out_, lse_;
};

MergeShape shape_from(const Params& p, int64_t default_tokens) {
  MergeShape s;
  s.shards = int32_t(checked_positive("shards", p.get_int("shards", 2)));
  s.tokens = checked_positive("tokens", p.get_int("tokens", default_tokens));
  s.heads = int32_t(checked_positive("heads", p.get_int("heads", 128)));
  s.dim = int32_t(checked_positive("head-dim", p.get_int("head-dim", 512)));
  s.seed = p.seed() ^ 0x9009;
  return s;
}

// No GPU: the oracle on the Params struct against lse_merge on the same values.
CpuReport cpu_demo(const Params& p) {
  const MergeShape s = shape_from(p, 64);
  const int64_t rows = s.tokens * s.heads, n = int64_t(rows) * s.dim;
  Rng rng(s.seed);
  const size_t un = static_cast<size_t>(n), urows = static_cast<size_t>(rows);
  std::vector<uint16_t> in(s.shards * un), out(un);
  std::vector<float> lin(s.shards * urows), lse(urows), dense(in.size()), want(un), want_l(urows);
  for (size_t i = 0; i < in.size(); ++i) dense[i] = codec::bf16_to_float(in[i] = codec::float_to_bf16(rng.normal()));
  for (auto& x : lin) x = 3.f * rng.normal();
  Stopwatch sw;
  const Status st = ref::merge_attn_states(merge_params(s, in.data(), lin.data(), s.tokens, out.data(), lse.data()));
  CpuReport r;
  r.seconds = sw.seconds();
  r.shape = shape_str(s);
  r.bytes = double(s.shards) * (n * 2 + rows * 4) + n * 2 + rows * 4;
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  ref::lse_merge(dense.data(), lin.data(), s.shards, rows, s.dim, want.data(), want_l.data());
  for (int64_t i = 0; i < n; ++i)
    if (out[size_t(i)] != codec::float_to_bf16(want[size_t(i)])) {
      r.check = CheckResult::fail("element " + std::to_string(i) + " differs from lse_merge");
      return r;
    }
  r.check = CheckResult::pass("self-consistent, " + std::to_string(rows) + " rows");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_merge) {
  OpSpec op;
  op.key = "merge";
  op.api = "selkv::merge_attn_states";
  op.summary = "C9 LSE merge of N partial (out, lse) shards (default N=2, T=4096, H=128, D=512 bf16)";
  op.order = 70;
  op.in_default_job = false;
  op.params = {{"shards", "shards merged (merge: 2)"},
               {"tokens", "tokens T (merge: 4096)"},
               {"heads", "heads H (128)"},
               {"head-dim", "head dim D, a multiple of 8 (512)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<MergeWorkload>(shape_from(p, 4096));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  for (int n : {2, 8}) {
    BenchCase c;
    c.op = "merge";
    c.label = "N=" + std::to_string(n) + " T=4K H=128 D=512 bf16";
    c.quick = true;
    c.make = [=](uint64_t seed) -> std::unique_ptr<Workload> {
      MergeShape s;
      s.shards = n;
      s.seed = seed ^ 0x9009;
      return std::make_unique<MergeWorkload>(s);
    };
    case_registry().push_back(std::move(c));
  }
}

}  // namespace selkv::bench
