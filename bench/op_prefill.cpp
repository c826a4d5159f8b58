// C7 sparse MLA prefill over bf16 KV (selkv::sparse_mla_prefill) and the composed paths
// (selkv/composed.h): FP8 cache -> C4 -> C7 and C3 gather of a chunk -> C7.
//
// Inputs (DESIGN §5 data): q ~ randn bf16 [T, H, D_qk]; kv ~ randn/10 bf16 [N, D_qk] (plain
// case) or FP8 records of randn/10 latents (composed cases, Fp8Pool); every token has K valid
// indices, uniform over its kv range (duplicates allowed). FLOPs (FlashMLA convention)
// 2 * H * T * K * (D_qk + 512); % ceiling against the measured bf16 matmul. Bytes: q + out +
// max_logits + lse + indices + the kv rows once (N * D_qk * 2), plus the C4 / C3 traffic of the
// composed cases. FlashMLA anchors (H200, its published / measured times) for the N=32K cases;
// the composed cases report their time relative to the plain case of the same shape.
// Each call takes milliseconds: the harness's reps are plenty.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "anchor.h"
#include "cache_common.h"
#include "decode_fill.h"
#include "formats/codec.h"
#include "fp8_pool.h"
#include "prefill/composed_ref.h"
#include "reference/oracle.h"
#include "selkv/composed.h"
#include "selkv/prefill.h"

namespace selkv::bench {
namespace {

enum class Route { kPlain, kDequant, kGather };

struct PrefillSpec {
  int64_t T = 4096;
  int32_t H = 128, D = 576, K = 2048;
  int64_t N = 32768;  // kv rows (plain, gather) or pool slots (dequant)
  Route route = Route::kPlain;
  bool sink = false;  // attn_sink [H] fused in the epilogue
  int32_t reqs = 8;   // gather: requests of the chunk
  int check_tokens = 3;
  uint64_t seed = 7;
  AnchorInfo anchor;

  KvFormat format() const { return D == 576 ? KvFormat::kDsMlaFp8 : KvFormat::kNopeFp8; }
  std::string str() const {
    return "T=" + human_count(T) + " H=" + std::to_string(H) + " D=" + std::to_string(D) + " K=" + human_count(K) +
           " N=" + human_count(N);
  }
  std::string route_name() const {
    const std::string r = route == Route::kPlain ? "bf16 kv" : route == Route::kDequant ? "fp8 pool->C4->C7" : "C3 chunk->C7";
    return sink ? r + " +attn_sink" : r;
  }
};

// DESIGN §5 prefill tolerances on bf16 outputs vs the oracle's (already rounded to bf16).
CheckResult compare(const std::vector<uint16_t>& out, const std::vector<float>& ml, const std::vector<float>& lse,
                    const std::vector<uint16_t>& r_out, const std::vector<float>& r_ml,
                    const std::vector<float>& r_lse, int H, const std::vector<int64_t>& toks) {
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double x = codec::bf16_to_float(out[i]), y = codec::bf16_to_float(r_out[i]);
    const double e = std::fabs(x - y);
    if (std::isnan(x) || !(e < 8e-4 || e < 3.01 / 128 * std::fabs(y))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "token %lld head %d col %d: out %.6g, oracle %.6g",
                    (long long)toks[i / (size_t(H) * 512)], int(i / 512 % H), int(i % 512), x, y);
      return CheckResult::fail(buf);
    }
    xy += x * y; xx += x * x; yy += y * y;
  }
  const double cd = xx + yy > 0 ? 1.0 - 2.0 * xy / (xx + yy) : 0.0;
  if (!(cd < 7e-6)) return CheckResult::fail("cosine distance " + std::to_string(cd) + " >= 7e-6");
  auto close = [](float g, float r) {
    if (std::isinf(r)) return g == r;
    const double e = std::fabs(double(g) - r);
    return e < 1e-6 || e < 2.01 / 65536 * std::fabs(double(r));
  };
  for (size_t i = 0; i < lse.size(); ++i)
    if (!close(lse[i], r_lse[i]) || !close(ml[i], r_ml[i])) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "token %lld head %d: lse %.9g (oracle %.9g), max_logits %.9g (oracle %.9g)",
                    (long long)toks[i / size_t(H)], int(i % H), lse[i], r_lse[i], ml[i], r_ml[i]);
      return CheckResult::fail(buf);
    }
  char buf[128];
  std::snprintf(buf, sizeof buf, "prefill tolerances, %zu tokens x %d heads vs fp64 oracle (cos dist %.2e)",
                toks.size(), H, cd);
  return CheckResult::pass(buf);
}

class PrefillWorkload final : public Workload, public Anchored {
 public:
  explicit PrefillWorkload(const PrefillSpec& s) : s_(s) {
    if (s_.K < 64 || s_.K % 64) throw std::invalid_argument("--topk must be a positive multiple of 64");
    if (s_.H != 64 && s_.H != 128) throw std::invalid_argument("--heads must be 64 or 128");
    if (s_.D != 576 && s_.D != 512) throw std::invalid_argument("--d-qk must be 576 or 512");
    const int64_t T = s_.T;
    Rng rng(s_.seed);
    q_ = DeviceBuffer(size_t(T) * s_.H * s_.D * 2);
    device_fill_normal_bf16(q_.get(), size_t(T) * s_.H * s_.D, 1.f, 0.f, s_.seed * 41 + 3, nullptr);
    out_ = DeviceBuffer(size_t(T) * s_.H * 512 * 2);
    ml_ = DeviceBuffer(size_t(T) * s_.H * 4);
    lse_ = DeviceBuffer(size_t(T) * s_.H * 4);
    // Index rows: token t attends inside [lo(t), hi(t)) (the whole kv, or its request's rows).
    idx_.resize(size_t(T) * s_.K);
    if (s_.route == Route::kGather) build_chunk(rng);
    for (int64_t t = 0; t < T; ++t) {
      const auto [lo, hi] = range_of(t);
      for (int k = 0; k < s_.K; ++k) idx_[size_t(t) * s_.K + k] = int32_t(rng.range(lo, hi - 1));
    }
    idx_dev_ = DeviceBuffer::from(idx_);

    SparsePrefillParams& a = attn_;
    a.q = q_.get();
    a.num_tokens = T;
    a.num_heads = s_.H;
    a.d_qk = s_.D;
    a.topk = s_.K;
    a.sm_scale = float(std::pow(double(s_.D), -0.55));
    set_contiguous_strides(&a);
    a.indices = idx_dev_.as<int32_t>();
    a.out = out_.get();
    a.max_logits = ml_.as<float>();
    a.lse = lse_.as<float>();
    if (s_.sink) {  // sinks around the logits' scale: some heads barely scaled, some halved
      sink_.resize(size_t(s_.H));
      for (auto& v : sink_) v = float(rng.normal() * 2.0);
      sink_dev_ = DeviceBuffer::from(sink_);
      a.attn_sink = sink_dev_.as<float>();
    }
    if (s_.route == Route::kPlain) {
      kv_ = DeviceBuffer(size_t(s_.N) * s_.D * 2);
      device_fill_normal_bf16(kv_.get(), size_t(s_.N) * s_.D, 0.1f, 1.f, s_.seed * 43 + 5, nullptr);
      a.kv = kv_.get();
      a.num_kv = s_.N;
    } else {
      a.kv_row_stride = 0;
      if (s_.route == Route::kDequant) {
        pool_ = std::make_unique<Fp8Pool>(s_.format(), s_.N, 64, true, s_.seed ^ 0xf8);
        dq_.attn = a;
        dq_.cache = pool_->view();
        ws_ = DeviceBuffer(dequant_prefill_workspace_size(T, s_.K, pool_->num_slots(), s_.format()));
        dq_.workspace = ws_.get();
        dq_.workspace_bytes = ws_.bytes();
      } else {
        ga_.attn = a;
        ga_.gather.cache = pool_->view().data;
        ga_.gather.num_blocks = pool_->view().num_blocks;
        ga_.gather.page_size = 64;
        ga_.gather.block_stride_bytes = pool_->view().block_stride_bytes;
        ga_.gather.format = s_.format();
        ga_.gather.block_table = bt_dev_.as<int32_t>();
        ga_.gather.block_table_row_stride = max_blocks_;
        ga_.gather.max_blocks_per_req = max_blocks_;
        ga_.gather.seq_starts = starts_dev_.as<int32_t>();
        ga_.gather.seq_lens = lens_dev_.as<int32_t>();
        ga_.gather.ws_starts = ws_starts_dev_.as<int32_t>();
        ga_.gather.num_reqs = s_.reqs;
        ga_.num_kv_rows = s_.N;
        ws_ = DeviceBuffer(gather_prefill_workspace_size(s_.N, s_.format()));
        ga_.workspace = ws_.get();
        ga_.workspace_bytes = ws_.bytes();
      }
    }
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }

  std::string shape() const override { return s_.str(); }
  std::string variant() const override { return s_.route_name(); }
  double flops() const override { return 2.0 * s_.H * double(s_.T) * s_.K * (s_.D + 512); }
  double bytes() const override {
    const double T = double(s_.T);
    double b = T * s_.H * (2.0 * s_.D + 2.0 * 512 + 8) + T * s_.K * 4 + double(s_.N) * s_.D * 2;
    const int rec = fmt::record_bytes(s_.format());
    if (s_.route == Route::kDequant) {
      const double rows = double(dequant_selected_workspace_rows(s_.T, s_.K, s_.N));
      b += rows * (rec + 2.0 * s_.D) + T * s_.K * 8;  // C4: records + rows written + indices r/w
    } else if (s_.route == Route::kGather) {
      b += double(s_.N) * (rec + 2.0 * s_.D);          // C3: records + rows written
    }
    return b;
  }
  AnchorInfo anchor() const override { return s_.anchor; }

  void run(cudaStream_t stream) override {
    switch (s_.route) {
      case Route::kPlain: throw_if_error(sparse_mla_prefill(attn_, stream)); break;
      case Route::kDequant: throw_if_error(dequant_sparse_mla_prefill(dq_, stream)); break;
      case Route::kGather: throw_if_error(gather_sparse_mla_prefill(ga_, stream)); break;
    }
  }

  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(0xff, stream);
    ml_.fill_async(0xff, stream);
    lse_.fill_async(0xff, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const int H = s_.H, D = s_.D, K = s_.K;
    Rng rng(s_.seed ^ 0x9f);
    std::vector<int64_t> toks = {0, s_.T - 1};
    while (int(toks.size()) < s_.check_tokens) toks.push_back(rng.range(0, s_.T - 1));
    toks.resize(size_t(std::min<int64_t>(int64_t(toks.size()), s_.T)));
    const int n = int(toks.size());
    // A compact host problem: each checked entry gets its own kv row (the bf16 row the op must
    // have read: kv itself, or decode_record of the source FP8 record).
    std::vector<uint16_t> q(size_t(n) * H * D), kv(size_t(n) * K * D), out(size_t(n) * H * 512);
    std::vector<int32_t> idx(size_t(n) * K);
    std::vector<float> ml(size_t(n) * H), lse(size_t(n) * H);
    for (int i = 0; i < n; ++i) {
      const int64_t t = toks[size_t(i)];
      const size_t qrow = size_t(H) * D, orow = size_t(H) * 512;
      SELKV_BENCH_CUDA(cudaMemcpy(&q[i * qrow], q_.as<uint16_t>() + t * qrow, qrow * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&out[i * orow], out_.as<uint16_t>() + t * orow, orow * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&ml[size_t(i) * H], ml_.as<float>() + t * H, size_t(H) * 4, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&lse[size_t(i) * H], lse_.as<float>() + t * H, size_t(H) * 4, cudaMemcpyDeviceToHost));
      for (int k = 0; k < K; ++k) {
        const size_t e = size_t(i) * K + k;
        const int32_t v = idx_[size_t(t) * K + k];
        idx[e] = int32_t(e);
        uint16_t* dst = &kv[e * D];
        if (s_.route == Route::kPlain) {
          SELKV_BENCH_CUDA(cudaMemcpy(dst, kv_.as<uint16_t>() + int64_t(v) * D, size_t(D) * 2, cudaMemcpyDeviceToHost));
        } else {
          ref::decode_record(pool_->record(s_.route == Route::kDequant ? v : slot_of_row(v)), s_.format(), dst);
        }
      }
    }
    std::vector<float> r_out(out.size()), r_ml(ml.size()), r_lse(lse.size());
    ref::SparsePrefillRefArgs a;
    a.q = q.data(); a.T = n; a.H = H; a.d_qk = D; a.kv = kv.data(); a.num_kv = int64_t(n) * K;
    a.indices = idx.data(); a.K = K; a.sm_scale = attn_.sm_scale;
    a.attn_sink = s_.sink ? sink_.data() : nullptr;
    a.out = r_out.data(); a.max_logits = r_ml.data(); a.lse = r_lse.data();
    const Status st = ref::check_sparse_prefill_args(a);
    if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
    ref::sparse_prefill(a);
    std::vector<uint16_t> r_bf(r_out.size());
    for (size_t i = 0; i < r_out.size(); ++i) r_bf[i] = codec::float_to_bf16(r_out[i]);
    return compare(out, ml, lse, r_bf, r_ml, r_lse, H, toks);
  }

 private:
  std::pair<int64_t, int64_t> range_of(int64_t t) const {
    if (s_.route != Route::kGather) return {0, s_.N};
    const int r = int(t * s_.reqs / s_.T);
    return {ws_starts_[size_t(r)], ws_starts_[size_t(r)] + lens_[size_t(r)]};
  }
  // Gather route: the physical slot behind workspace row `row`.
  int64_t slot_of_row(int64_t row) const {
    int r = 0;
    while (r + 1 < s_.reqs && row >= ws_starts_[size_t(r + 1)]) ++r;
    const int64_t pos = starts_[size_t(r)] + (row - ws_starts_[size_t(r)]);
    return int64_t(bt_[size_t(r) * max_blocks_ + pos / 64]) * 64 + pos % 64;
  }
  // Gather route: reqs requests of N / reqs tokens each (the last takes the remainder), starting
  // at a non-page-aligned position of their own shuffled blocks; rows packed in request order.
  void build_chunk(Rng& rng) {
    const int R = s_.reqs;
    starts_.resize(size_t(R));
    lens_.resize(size_t(R));
    ws_starts_.resize(size_t(R));
    int64_t row = 0, total_blocks = 0;
    max_blocks_ = 1;
    for (int r = 0; r < R; ++r) {
      lens_[size_t(r)] = int32_t(r + 1 < R ? s_.N / R : s_.N - row);
      starts_[size_t(r)] = int32_t(rng.range(1, 63));
      ws_starts_[size_t(r)] = int32_t(row);
      row += lens_[size_t(r)];
      const int64_t nb = (starts_[size_t(r)] + lens_[size_t(r)] + 63) / 64;
      max_blocks_ = std::max<int32_t>(max_blocks_, int32_t(nb));
      total_blocks += nb;
    }
    pool_ = std::make_unique<Fp8Pool>(s_.format(), total_blocks * 64 + 64, 64, true, s_.seed ^ 0xf9);
    const std::vector<int32_t> perm = permutation(int32_t(pool_->view().num_blocks), rng);
    bt_.assign(size_t(R) * max_blocks_, -1);
    size_t next = 0;
    for (int r = 0; r < R; ++r)
      for (int64_t b = 0; b < (starts_[size_t(r)] + lens_[size_t(r)] + 63) / 64; ++b)
        bt_[size_t(r) * max_blocks_ + b] = perm[next++];
    bt_dev_ = DeviceBuffer::from(bt_);
    starts_dev_ = DeviceBuffer::from(starts_);
    lens_dev_ = DeviceBuffer::from(lens_);
    ws_starts_dev_ = DeviceBuffer::from(ws_starts_);
  }

  PrefillSpec s_;
  std::vector<int32_t> idx_, bt_, starts_, lens_, ws_starts_;
  std::vector<float> sink_;
  int32_t max_blocks_ = 1;
  std::unique_ptr<Fp8Pool> pool_;
  DeviceBuffer q_, kv_, out_, ml_, lse_, idx_dev_, ws_, bt_dev_, starts_dev_, lens_dev_, ws_starts_dev_, sink_dev_;
  SparsePrefillParams attn_;
  DequantPrefillParams dq_;
  GatherPrefillParams ga_;
};

PrefillSpec spec_from(const Params& p, bool cpu) {
  PrefillSpec s;
  s.T = checked_positive("tokens", p.get_int("tokens", cpu ? 4 : 4096));
  s.H = int32_t(p.get_int("heads", cpu ? 64 : 128));
  s.D = int32_t(p.get_int("d-qk", 576));
  s.K = int32_t(checked_positive("topk", p.get_int("topk", cpu ? 256 : 2048)));
  s.N = checked_positive("s-kv", p.get_int("s-kv", cpu ? 2048 : 32768));
  const std::string route = p.get_str("route", "bf16");
  if (route == "bf16") s.route = Route::kPlain;
  else if (route == "dequant") s.route = Route::kDequant;
  else if (route == "gather") s.route = Route::kGather;
  else throw std::invalid_argument("--route: expected bf16, dequant or gather, got '" + route + "'");
  s.sink = p.get_int("attn-sink", 0) != 0;
  s.check_tokens = int(std::max<int64_t>(1, p.get_int("check-rows", 3)));
  s.seed = p.seed() ^ 0x7007;
  return s;
}

// No GPU: the strided host oracle (what the torch CPU op runs) against ref::sparse_prefill on a
// dense copy, with a padded q / out layout, topk_length and invalid entries.
CpuReport cpu_demo(const Params& prm) {
  const PrefillSpec s = spec_from(prm, true);
  if (s.H != 64 && s.H != 128) throw std::invalid_argument("--heads must be 64 or 128");
  Rng rng(s.seed);
  const int T = int(s.T), H = s.H, D = s.D, K = s.K;
  const int64_t qts = int64_t(H) * (D + 64), ots = int64_t(H) * 520;  // padded token strides
  std::vector<uint16_t> q(size_t(T) * qts), kv = random_bf16(size_t(s.N) * D, 0.1f, rng),
      out(size_t(T) * ots, 0xffff);
  const auto qd = random_bf16(size_t(T) * H * D, 1.f, rng);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) std::memcpy(&q[size_t(t) * qts + size_t(h) * D], &qd[(size_t(t) * H + h) * D], size_t(D) * 2);
  std::vector<int32_t> idx(size_t(T) * K), len(static_cast<size_t>(T));
  for (auto& v : idx) v = rng.range(0, 7) == 0 ? -1 : int32_t(rng.range(0, s.N - 1));
  for (auto& l : len) l = int32_t(rng.range(0, K));
  std::vector<float> ml(size_t(T) * H), lse(size_t(T) * H);
  SparsePrefillParams p;
  p.q = q.data(); p.num_tokens = T; p.num_heads = H; p.d_qk = D; p.kv = kv.data(); p.num_kv = s.N;
  p.indices = idx.data(); p.topk = K; p.topk_length = len.data(); p.sm_scale = 0.06f;
  p.out = out.data(); p.max_logits = ml.data(); p.lse = lse.data();
  set_contiguous_strides(&p);
  p.q_token_stride = qts;
  p.out_head_stride = 520;
  p.out_token_stride = ots;
  CpuReport r;
  r.shape = s.str() + " strided";
  r.bytes = double(T) * K * D * 2;
  Stopwatch sw;
  Status st = ref::sparse_mla_prefill_strided(p);
  r.seconds = sw.seconds();
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  std::vector<float> d_out(size_t(T) * H * 512), d_ml(ml.size()), d_lse(lse.size());
  ref::SparsePrefillRefArgs a;
  a.q = qd.data(); a.T = T; a.H = H; a.d_qk = D; a.kv = kv.data(); a.num_kv = s.N; a.indices = idx.data();
  a.K = K; a.topk_length = len.data(); a.sm_scale = 0.06f; a.out = d_out.data(); a.max_logits = d_ml.data();
  a.lse = d_lse.data();
  ref::sparse_prefill(a);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const size_t i = size_t(t) * H + h;
      if (std::memcmp(&lse[i], &d_lse[i], 4) || std::memcmp(&ml[i], &d_ml[i], 4)) {
        r.check = CheckResult::fail("strided stats differ from the dense oracle");
        return r;
      }
      for (int d = 0; d < 512; ++d)
        if (out[size_t(t) * ots + size_t(h) * 520 + d] != codec::float_to_bf16(d_out[i * 512 + d])) {
          r.check = CheckResult::fail("strided out differs from the dense oracle");
          return r;
        }
      for (int d = 512; d < 520; ++d)
        if (out[size_t(t) * ots + size_t(h) * 520 + d] != 0xffff) {
          r.check = CheckResult::fail("padding between heads was written");
          return r;
        }
    }
  r.check = CheckResult::pass("strided oracle == dense oracle bit-exact, padding untouched");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_prefill) {
  OpSpec op;
  op.key = "prefill";
  op.api = "selkv::sparse_mla_prefill";
  op.summary = "C7 sparse MLA prefill over bf16 KV (default T=4096 H=128 D=576 K=2048 N=32K); --route dequant|gather "
               "runs the composed paths from the FP8 cache";
  op.order = 60;
  op.params = {{"tokens", "query tokens T (prefill: 4096)"},
               {"heads", "query heads H, 64 or 128 (128)"},
               {"d-qk", "576 (ds_mla_fp8) or 512 (nope_fp8) (576)"},
               {"topk", "indices per token K, a multiple of 64 (2048)"},
               {"s-kv", "kv rows N / pool slots / gathered chunk rows (32768)"},
               {"attn-sink", "1: a fused attn_sink [H] (0)"},
               {"route", "bf16 | dequant (FP8 pool -> C4 -> C7) | gather (C3 chunk -> C7) (bf16)"},
               {"check-rows", "tokens compared with the fp64 oracle (3)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<PrefillWorkload>(spec_from(p, false));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  auto add = [](PrefillSpec s, bool quick, double anchor_us, const std::string& key = "",
                const std::string& rel_key = "", double rel_max = 0) {
    s.anchor.anchor_us = anchor_us;
    s.anchor.anchor_name = "FlashMLA";
    s.anchor.key = key;
    s.anchor.rel_key = rel_key;
    s.anchor.rel_max = rel_max;
    BenchCase c;
    c.op = "prefill";
    char anchor[48] = "";
    if (anchor_us > 0) std::snprintf(anchor, sizeof anchor, " (FlashMLA %.0f us)", anchor_us);
    c.label = s.str() + " " + s.route_name() + anchor;
    c.quick = quick;
    c.make = [s](uint64_t seed) -> std::unique_ptr<Workload> {
      PrefillSpec t = s;
      t.seed = seed ^ 0x7007;
      return std::make_unique<PrefillWorkload>(t);
    };
    case_registry().push_back(std::move(c));
  };
  PrefillSpec s;  // T=4096, H=128, D=576, K=2048
  for (int64_t n : {8192, 32768, 131072}) {
    s.N = n;
    if (n == 32768) add(s, true, 3835.0, "h128_d576_n32k");
    else add(s, false, 0);
  }
  s.N = 32768;
  s.D = 512;
  add(s, false, 0, "h128_d512_n32k");
  s.D = 576;
  s.H = 64;
  add(s, true, 2042.0, "h64_d576_n32k");
  s.H = 128;
  s.K = 2112;  // 64 * 33: an odd number of 64-row steps
  add(s, false, 0);
  s.K = 2048;
  // Composed paths at the anchor shape: the C7 part equals h128_d576_n32k; target <= 1.10x of it.
  s.route = Route::kDequant;  // pool of 32K slots: T*K = 8M >= P, full-pool C4
  add(s, false, 0, "", "h128_d576_n32k", 1.10);
  s.route = Route::kGather;   // 8 requests, 4K rows each, gathered into a 32K-row chunk
  add(s, false, 0, "", "h128_d576_n32k", 1.10);
  // Fused attn_sink: target <= 1.05x the plain call of the same shape. At the anchor shape and at
  // FlashMLA's small-K performance config (H=64 D=512 K=512), where the old unfused path cost most.
  s.route = Route::kPlain;
  s.sink = true;
  add(s, true, 0, "", "h128_d576_n32k", 1.05);
  PrefillSpec small;
  small.H = 64;
  small.D = 512;
  small.K = 512;
  add(small, true, 0, "h64_d512_k512");
  small.sink = true;
  add(small, true, 0, "", "h64_d512_k512", 1.05);
}

}  // namespace selkv::bench
