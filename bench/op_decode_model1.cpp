// C5 sparse MLA decode over the MODEL1 cache (model1_fp8, d_qk 512) with the extra KV cache:
// the benchmark cases of issue 18 (FlashMLA's MODEL1 "production" configs and the d_qk 512 peak
// case), labels "model1 ...", under op "decode".
//
// Inputs (DESIGN §5 data, FlashMLA's test generator in spirit): q ~ randn bf16; both caches
// written through selkv::write_kv_cache (randn/10, pow2 scales), request-disjoint (batch row b
// owns its own shuffled pages of each cache); each query row samples K (K2) distinct positions of
// its row's KV length (uniform in [s_kv/2, s_kv]) and maps them to physical slots; extra
// topk_length (when asked) uniform in [0, K2] per batch row, the suffix poisoned with INT_MAX.
// Metadata once, outside the timed region.
//
// FLOPs (FlashMLA convention): 2 * H * sum over query rows of (K_valid + K2_valid) * (512 + 512).
// Bytes: 584 per valid index + q + indices + out + lse.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "anchor.h"
#include "bench_util.h"
#include "decode_fill.h"
#include "formats/codec.h"
#include "reference/oracle.h"
#include "registry.h"
#include "selkv/cache_ops.h"
#include "selkv/decode.h"

namespace selkv::bench {
namespace {

using M1 = KvFormatTraits<KvFormat::kModel1Fp8>;
constexpr int kD = M1::kDequantDim;  // 512

struct Model1Spec {
  int32_t B = 64, S = 2, H = 64, K = 128, page = 256;
  int64_t s_kv = 16384;
  int32_t K2 = 512, page2 = 64;  // K2 = 0: no extra cache
  int64_t s_kv2 = 16384;
  bool extra_len = false;        // extra_topk_length uniform in [0, K2]
  uint64_t seed = 1;
  AnchorInfo anchor;

  int32_t rows() const { return B * S; }
  std::string shape_str() const {
    std::string s = "model1 B=" + std::to_string(B) + " S_q=" + std::to_string(S) + " H=" + std::to_string(H) +
                    " K=" + human_count(K) + " page=" + std::to_string(page);
    if (K2 > 0)
      s += " extra K2=" + human_count(K2) + " page2=" + std::to_string(page2) + (extra_len ? " extra_topk_length" : "");
    return s;
  }
};

// One paged MODEL1 cache, request-disjoint: batch row b's positions [0, len_b) map through its own
// shuffled pages. slot_of(b, t) gives the physical slot.
struct PagedSide {
  int32_t page = 64;
  int64_t num_blocks = 0, stride = 0, max_blocks = 0;
  std::vector<int64_t> lens;
  std::vector<int32_t> table;  // [B, max_blocks]
  DeviceBuffer cache;

  void build(int32_t B, int32_t page_, int64_t s_kv, uint64_t seed, Rng& rng, cudaStream_t st) {
    page = page_;
    lens.resize(size_t(B));
    int64_t total = 0;
    for (auto& l : lens) {
      l = rng.range(std::max<int64_t>(1, s_kv / 2), s_kv);
      total += (l + page - 1) / page;
      max_blocks = std::max(max_blocks, (l + page - 1) / page);
    }
    num_blocks = total + 1;
    const std::vector<int32_t> perm = permutation(int32_t(num_blocks), rng);
    table.assign(size_t(B) * size_t(max_blocks), -1);
    size_t next = 0;
    for (int32_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < (lens[size_t(b)] + page - 1) / page; ++j) table[size_t(b) * max_blocks + j] = perm[next++];
    stride = M1::page_bytes(page);
    cache = DeviceBuffer(size_t(num_blocks * stride));
    device_write_random_cache(cache.get(), num_blocks, page, stride, KvFormat::kModel1Fp8, seed, st);
  }
  int32_t slot_of(int32_t b, int64_t t) const {
    return table[size_t(b) * size_t(max_blocks) + size_t(t / page)] * page + int32_t(t % page);
  }
  PagedKvCache view() const { return PagedKvCache{cache.get(), num_blocks, page, stride, KvFormat::kModel1Fp8}; }
  // Indices [rows, K]: K distinct positions of the row's length (fewer when shorter; rest -1).
  std::vector<int32_t> indices(int32_t B, int32_t S, int32_t K, Rng& rng, int64_t* valid) const {
    std::vector<int32_t> idx(size_t(B) * S * K, -1);
    for (int32_t b = 0; b < B; ++b)
      for (int32_t s = 0; s < S; ++s) {
        const int64_t n = std::min<int64_t>(K, lens[size_t(b)]);
        const std::vector<int64_t> pos = sample_distinct(lens[size_t(b)], n, rng);
        for (int64_t k = 0; k < n; ++k) idx[(size_t(b) * S + s) * K + size_t(k)] = slot_of(b, pos[size_t(k)]);
        *valid += n;
      }
    return idx;
  }
};

class Model1DecodeWorkload final : public Workload, public Anchored {
 public:
  explicit Model1DecodeWorkload(const Model1Spec& s) : s_(s) {
    cudaStream_t st;
    SELKV_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    build(st);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(st));
    SELKV_BENCH_CUDA(cudaStreamDestroy(st));
  }
  std::string shape() const override { return s_.shape_str(); }
  std::string variant() const override { return s_.extra_len ? "model1 extra_topk_length" : "model1 fixed"; }
  double flops() const override { return 2.0 * s_.H * double(valid_total_) * (kD + kD); }
  double bytes() const override {
    const double rows = s_.rows();
    return double(valid_total_) * M1::kRecordBytes + rows * s_.H * (2.0 * kD + 2.0 * kD + 4) + rows * (s_.K + s_.K2) * 4.0;
  }
  AnchorInfo anchor() const override { return s_.anchor; }
  void run(cudaStream_t stream) override { throw_if_error(sparse_mla_decode(params_, md_, ws_.get(), ws_.bytes(), stream)); }

  // A few rows against the fp64 oracle: their selected tokens of both caches copied into one
  // page-1 cache (main entries then extra entries: one selection, which the oracle tests show
  // equals the union of two).
  CheckResult check(cudaStream_t stream) override {
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const int H = s_.H, K = s_.K, K2 = s_.K2, KT = K + K2;
    std::vector<int64_t> ids = {0};
    if (s_.rows() > 1) ids.push_back(s_.rows() - 1);
    const int n = int(ids.size());
    const int64_t stride1 = M1::page_bytes(1);
    std::vector<uint8_t> mini(size_t(n) * KT * stride1, 0xff);
    std::vector<int32_t> idx(size_t(n) * KT, -1);
    std::vector<uint16_t> q(size_t(n) * H * kD), got(size_t(n) * H * kD);
    std::vector<float> got_lse(size_t(n) * H);
    auto take = [&](const PagedSide& side, int32_t slot, int64_t m) {
      const PagedKvCache v = side.view();
      const auto* base = static_cast<const uint8_t*>(v.data);
      SELKV_BENCH_CUDA(cudaMemcpy(&mini[size_t(m * stride1)], base + v.slot_offset(slot), M1::kRecordStride,
                                  cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&mini[size_t(m * stride1 + M1::scale_offset(0, 1))], base + v.scale_offset(slot),
                                  M1::kScaleStride, cudaMemcpyDeviceToHost));
    };
    for (int i = 0; i < n; ++i) {
      const int64_t r = ids[size_t(i)];
      const int32_t b = int32_t(r / s_.S);
      const size_t qrow = size_t(H) * kD;
      SELKV_BENCH_CUDA(cudaMemcpy(&q[i * qrow], q_.as<uint16_t>() + r * qrow, qrow * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&got[i * qrow], out_.as<uint16_t>() + r * qrow, qrow * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(&got_lse[size_t(i) * H], lse_.as<float>() + r * H, size_t(H) * 4, cudaMemcpyDeviceToHost));
      for (int k = 0; k < K; ++k) {
        const int32_t slot = idx1_[size_t(r) * K + k];
        if (slot < 0) continue;
        const int64_t m = int64_t(i) * KT + k;
        take(main_, slot, m);
        idx[size_t(m)] = int32_t(m);
      }
      const int32_t len2 = s_.extra_len ? len2_[size_t(b)] : K2;
      for (int k = 0; k < std::min(K2, len2); ++k) {
        const int32_t slot = idx2_[size_t(r) * K2 + k];
        if (slot < 0) continue;
        const int64_t m = int64_t(i) * KT + K + k;
        take(extra_, slot, m);
        idx[size_t(m)] = int32_t(m);
      }
    }
    std::vector<float> ref_out(got.size()), ref_lse(got_lse.size());
    ref::SparseDecodeRefArgs a;
    a.q = q.data();
    a.B = n;
    a.S_q = 1;
    a.H = H;
    a.cache = PagedKvCache{mini.data(), int64_t(n) * KT, 1, stride1, KvFormat::kModel1Fp8};
    a.indices = idx.data();
    a.K = KT;
    a.sm_scale = params_.sm_scale;
    a.out = ref_out.data();
    a.lse = ref_lse.data();
    const Status st = ref::check_sparse_decode_args(a);
    if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
    ref::sparse_decode(a);
    double xy = 0, xx = 0, yy = 0;
    for (size_t i = 0; i < ref_out.size(); ++i) {
      const float rr = codec::bf16_to_float(codec::float_to_bf16(ref_out[i])), x = codec::bf16_to_float(got[i]);
      const float err = std::fabs(x - rr);
      if (!(err < 1e-3f || err < 2.01f / 128.f * std::fabs(rr)))
        return CheckResult::fail("out[" + std::to_string(i) + "] " + std::to_string(x) + " vs oracle " + std::to_string(rr));
      xy += double(x) * rr, xx += double(x) * x, yy += double(rr) * rr;
    }
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      const float err = std::fabs(got_lse[i] - ref_lse[i]);
      if (!(err < 1e-6f || err < 8.01f / 65536.f * std::fabs(ref_lse[i])) && !(std::isinf(ref_lse[i]) && got_lse[i] == ref_lse[i]))
        return CheckResult::fail("lse[" + std::to_string(i) + "] " + std::to_string(got_lse[i]) + " vs oracle " +
                                 std::to_string(ref_lse[i]));
    }
    const double cos = xx + yy > 0 ? 1.0 - 2.0 * xy / (xx + yy) : 0.0;
    if (!(cos < 5e-6)) return CheckResult::fail("cosine distance " + std::to_string(cos));
    return CheckResult::pass("DESIGN §5 tolerances, 2 rows vs fp64 oracle");
  }

 private:
  void build(cudaStream_t st) {
    Rng rng(s_.seed);
    const int32_t B = s_.B, S = s_.S, H = s_.H, rows = s_.rows();
    main_.build(B, s_.page, s_.s_kv, s_.seed, rng, st);
    valid_total_ = 0;
    idx1_ = main_.indices(B, S, s_.K, rng, &valid_total_);
    idx1_dev_ = DeviceBuffer::from(idx1_);
    if (s_.K2 > 0) {
      extra_.build(B, s_.page2, s_.s_kv2, s_.seed * 7 + 3, rng, st);
      int64_t v2 = 0;
      idx2_ = extra_.indices(B, S, s_.K2, rng, &v2);
      if (s_.extra_len) {
        len2_.resize(size_t(B));
        v2 = 0;
        const std::vector<int32_t> fixed_len = env_extra_lengths();  // SELKV_BENCH_EXTRA_LEN
        for (int32_t b = 0; b < B; ++b) {
          // drawn even when SELKV_BENCH_EXTRA_LEN sets it: the other inputs stay the drawn case's
          len2_[size_t(b)] = int32_t(rng.range(0, s_.K2));
          if (!fixed_len.empty()) len2_[size_t(b)] = std::clamp(fixed_len[size_t(b) % fixed_len.size()], 0, s_.K2);
          for (int32_t s = 0; s < S; ++s) {
            int32_t* row = &idx2_[(size_t(b) * S + s) * s_.K2];
            for (int32_t k = len2_[size_t(b)]; k < s_.K2; ++k) row[k] = INT_MAX;  // never read
            for (int32_t k = 0; k < len2_[size_t(b)]; ++k) v2 += row[k] >= 0;
          }
        }
        len2_dev_ = DeviceBuffer::from(len2_);
      }
      valid_total_ += v2;
      idx2_dev_ = DeviceBuffer::from(idx2_);
    }
    q_ = DeviceBuffer(size_t(rows) * H * kD * 2);
    device_fill_normal_bf16(q_.get(), size_t(rows) * H * kD, 1.f, 0.f, s_.seed * 41 + 7, st);
    out_ = DeviceBuffer(size_t(rows) * H * kD * 2);
    lse_ = DeviceBuffer(size_t(rows) * H * 4);

    params_.q = q_.get();
    params_.batch = B;
    params_.seq_q = S;
    params_.num_heads = H;
    params_.cache = main_.view();
    params_.indices = idx1_dev_.as<int32_t>();
    params_.topk = s_.K;
    if (s_.K2 > 0) {
      params_.extra_cache = extra_.view();
      params_.extra_indices = idx2_dev_.as<int32_t>();
      params_.extra_topk = s_.K2;
      params_.extra_topk_length = s_.extra_len ? len2_dev_.as<int32_t>() : nullptr;
    }
    params_.sm_scale = float(std::pow(double(kD), -0.55));
    params_.out = out_.get();
    params_.lse = lse_.as<float>();
    set_contiguous_strides(&params_);

    md_buf_ = DeviceBuffer(decode_metadata_size(B, S));
    DecodeShape shape{B, S, H, s_.K, nullptr, 0};
    shape.min_blocks_per_part = env_min_blocks();  // SELKV_BENCH_MIN_BLOCKS, as the other decode cases
    shape.partials = env_partials();               // SELKV_BENCH_PARTIALS
    shape.extra_topk = params_.extra_topk;
    shape.extra_topk_length = params_.extra_topk_length;
    throw_if_error(make_decode_metadata(shape, md_buf_.get(), md_buf_.bytes(), &md_, st));
    ws_ = DeviceBuffer(std::max<size_t>(decode_workspace_size(md_), 16));
  }

  Model1Spec s_;
  int64_t valid_total_ = 0;
  PagedSide main_, extra_;
  std::vector<int32_t> idx1_, idx2_, len2_;
  DeviceBuffer idx1_dev_, idx2_dev_, len2_dev_, q_, out_, lse_, md_buf_, ws_;
  SparseDecodeParams params_;
  DecodeMetadata md_;
};

}  // namespace

SELKV_BENCH_REGISTER(register_decode_model1) {
  auto add = [](Model1Spec s, bool quick, double anchor_us) {
    s.anchor.anchor_us = anchor_us;
    s.anchor.anchor_name = "FlashMLA";
    BenchCase c;
    c.op = "decode";
    char anchor[48] = "";
    if (anchor_us > 0) std::snprintf(anchor, sizeof anchor, " (FlashMLA %.1f us)", anchor_us);
    c.label = s.shape_str() + anchor;
    c.quick = quick;
    c.make = [s](uint64_t seed) -> std::unique_ptr<Workload> {
      Model1Spec t = s;
      t.seed = seed ^ 0x3001;
      return std::make_unique<Model1DecodeWorkload>(t);
    };
    case_registry().push_back(std::move(c));
  };
  // Issue 18's FlashMLA figures (H200, its own timing), S_q = 2, s_kv = extra s_kv = 16384,
  // main pages of 256: H64 topk 128 + extra 512 (pages 64); H128 topk 128 + extra 1024 (pages
  // 64); the same with extra pages of 2, extra topk 1024 and extra_topk_length.
  const int batches[] = {2, 64, 128, 256};
  const double h64[] = {14.6, 49.5, 92.5, 175.9}, h128[] = {17.2, 105.7, 205.6, 405.5};
  const double h64p2[] = {14.5, 74.7, 120.6, 216.9}, h128p2[] = {16.1, 89.4, 147.7, 265.8};
  for (int i = 0; i < 4; ++i) {
    Model1Spec s;
    s.B = batches[i];
    s.H = 64;
    s.K2 = 512;
    add(s, true, h64[i]);
    s.H = 128;
    s.K2 = 1024;
    add(s, true, h128[i]);
    s.page2 = 2;
    s.extra_len = true;
    s.H = 64;
    add(s, true, h64p2[i]);
    s.H = 128;
    add(s, true, h128p2[i]);
  }
  // Peak d_qk 512: H128, B 148, K 16384, s_kv 32768, no extra cache (~2.8 GB cache; full grid).
  {
    Model1Spec s;
    s.B = 148;
    s.H = 128;
    s.K = 16384;
    s.page = 64;
    s.s_kv = 32768;
    s.K2 = 0;
    add(s, false, 2689.5);
  }
}

}  // namespace selkv::bench
