// Oracle for sparse attention: C5 decode over the FP8 paged cache and C7 prefill over bf16 KV.
// Both reduce to the same fp64 kernel (attend_row) over a gathered list of key rows, so the two
// paths agree bit for bit on the same keys; they differ only in how keys are found and decoded.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"
#include "common/sm_scale.h"
#include "formats/codec.h"
#include "reference/oracle.h"
#include "reference/parallel.h"

namespace selkv::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The two products below are register-blocked for speed, but every output element is still a
// plain sequential fp64 sum (scores over d ascending, outputs over keys ascending, starting from
// 0). Blocked and tail paths therefore give identical bits, independent of H, n and threading.
constexpr int kKeyBlk = 4;   // keys per score micro-tile
constexpr int kHeadBlk = 4;  // heads per score micro-tile
constexpr int kPvHeads = 4;  // heads per output micro-tile
constexpr int kPvCols = 4;   // value columns per output micro-tile
constexpr int kPvKeys = 64;  // keys per output pass (keeps the value tile in L1)

// s[j, h] = sum_d keys[j, d] * qt[d, h] for j < n, h < H; qt is q transposed [d_qk, H].
void scores(const double* keys, int n, const double* qt, int H, int d_qk, double* s) {
  for (int j0 = 0; j0 < n; j0 += kKeyBlk) {
    const int nj = std::min(kKeyBlk, n - j0);
    for (int h0 = 0; h0 < H; h0 += kHeadBlk) {
      const int nh = std::min(kHeadBlk, H - h0);
      if (nj == kKeyBlk && nh == kHeadBlk) {
        double acc[kKeyBlk][kHeadBlk] = {};
        for (int d = 0; d < d_qk; ++d) {
          const double* qd = qt + size_t(d) * H + h0;
          for (int jj = 0; jj < kKeyBlk; ++jj) {
            const double k = keys[size_t(j0 + jj) * d_qk + d];
            for (int hh = 0; hh < kHeadBlk; ++hh) acc[jj][hh] += k * qd[hh];
          }
        }
        for (int jj = 0; jj < kKeyBlk; ++jj)
          for (int hh = 0; hh < kHeadBlk; ++hh) s[size_t(j0 + jj) * H + h0 + hh] = acc[jj][hh];
      } else {
        for (int jj = 0; jj < nj; ++jj)
          for (int hh = 0; hh < nh; ++hh) {
            double acc = 0.0;
            for (int d = 0; d < d_qk; ++d)
              acc += keys[size_t(j0 + jj) * d_qk + d] * qt[size_t(d) * H + h0 + hh];
            s[size_t(j0 + jj) * H + h0 + hh] = acc;
          }
      }
    }
  }
}

// o[h, c] += sum_j p[j, h] * keys[j, c] over j < n, for h < H, c < kVDim (o is [H, kVDim]).
void weighted_values(const double* p, int n, int H, const double* keys, int d_qk, double* o) {
  constexpr int kV = fmt::kVDim;
  static_assert(kV % kPvCols == 0);
  for (int j0 = 0; j0 < n; j0 += kPvKeys) {
    const int j1 = std::min(n, j0 + kPvKeys);
    for (int c0 = 0; c0 < kV; c0 += kPvCols) {
      int h0 = 0;
      for (; h0 + kPvHeads <= H; h0 += kPvHeads) {
        double acc[kPvHeads][kPvCols];
        for (int hh = 0; hh < kPvHeads; ++hh)
          for (int cc = 0; cc < kPvCols; ++cc) acc[hh][cc] = o[size_t(h0 + hh) * kV + c0 + cc];
        for (int j = j0; j < j1; ++j) {
          const double* v = keys + size_t(j) * d_qk + c0;
          const double* pj = p + size_t(j) * H + h0;
          for (int hh = 0; hh < kPvHeads; ++hh)
            for (int cc = 0; cc < kPvCols; ++cc) acc[hh][cc] += pj[hh] * v[cc];
        }
        for (int hh = 0; hh < kPvHeads; ++hh)
          for (int cc = 0; cc < kPvCols; ++cc) o[size_t(h0 + hh) * kV + c0 + cc] = acc[hh][cc];
      }
      for (; h0 < H; ++h0)
        for (int cc = 0; cc < kPvCols; ++cc) {
          double acc = o[size_t(h0) * kV + c0 + cc];
          for (int j = j0; j < j1; ++j) acc += p[size_t(j) * H + h0] * keys[size_t(j) * d_qk + c0 + cc];
          o[size_t(h0) * kV + c0 + cc] = acc;
        }
    }
  }
}

// One query position, all heads. q: bf16 rows [H] with row stride d_qk; keys: fp64 [n, d_qk]
// holding bf16 values; v = keys[:, :512]. Writes out [H, 512], lse [H], max_logits [H] (the
// last two optional).
void attend_row(const uint16_t* q, int H, int d_qk, const std::vector<double>& keys, int n,
                double sm_scale, const float* attn_sink, float* out, float* lse,
                float* max_logits) {
  constexpr int kV = fmt::kVDim;
  if (n == 0) {
    std::memset(out, 0, sizeof(float) * size_t(H) * kV);
    for (int h = 0; h < H; ++h) {
      if (lse) lse[h] = -std::numeric_limits<float>::infinity();
      if (max_logits) max_logits[h] = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  std::vector<double> qt(size_t(d_qk) * H);
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < d_qk; ++d)
      qt[size_t(d) * H + h] = codec::bf16_to_float(q[size_t(h) * d_qk + d]);

  std::vector<double> s(size_t(n) * H);  // dots, then scores, then unnormalized weights [n, H]
  scores(keys.data(), n, qt.data(), H, d_qk, s.data());

  std::vector<double> m(H, kNegInf), sum(H, 0.0);
  for (size_t i = 0; i < s.size(); ++i) s[i] *= sm_scale;
  for (int j = 0; j < n; ++j)
    for (int h = 0; h < H; ++h) m[h] = std::max(m[h], s[size_t(j) * H + h]);
  for (int j = 0; j < n; ++j)
    for (int h = 0; h < H; ++h) {
      double& p = s[size_t(j) * H + h];
      p = std::exp(p - m[h]);
      sum[h] += p;
    }

  std::vector<double> o(size_t(H) * kV, 0.0);
  weighted_values(s.data(), n, H, keys.data(), d_qk, o.data());
  for (int h = 0; h < H; ++h) {
    const double l = m[h] + std::log(sum[h]);
    double scale = 1.0 / sum[h];
    if (attn_sink) scale /= 1.0 + std::exp(double(attn_sink[h]) - l);
    for (int c = 0; c < kV; ++c) out[size_t(h) * kV + c] = float(o[size_t(h) * kV + c] * scale);
    if (lse) lse[h] = float(l);
    // A NaN that reached the softmax makes the whole row NaN, max_logits included (the max
    // itself skips NaN).
    if (max_logits) max_logits[h] = std::isnan(l) ? float(l) : float(m[h]);
  }
}

// Entries [0, limit) of an index row are candidates; limit = K or clamp(topk_length, 0, K).
int row_limit(const int32_t* topk_length, int64_t i, int K) {
  if (!topk_length) return K;
  return std::max(0, std::min(K, int(topk_length[i])));
}

}  // namespace

// ---- C5 ----------------------------------------------------------------------------------------
namespace {

Status check_ref_cache(const char* kOp, const char* name, const PagedKvCache& c) {
  SELKV_CHECK_ARG(c.num_blocks >= 0, name, "num_blocks must be >= 0");
  SELKV_CHECK_ARG(c.page_size >= 1, name, "page_size must be >= 1, got ", c.page_size);
  SELKV_CHECK_ARG(c.block_stride_bytes >= fmt::page_bytes(c.format, c.page_size), name,
                  "block_stride_bytes must be >= page_bytes(format, page_size) = ",
                  fmt::page_bytes(c.format, c.page_size));
  SELKV_CHECK_ARG(c.data != nullptr || c.num_blocks == 0, name, "data must not be null");
  return Status::Ok();
}

// The valid entries [0, limit) of one index row of `cache`, decoded and appended to keys (D dims
// each); returns how many.
int gather_keys(const PagedKvCache& cache, const int32_t* idx, int limit, int D, std::vector<double>& keys) {
  const int64_t num_slots = cache.num_slots();
  std::vector<uint16_t> rec(static_cast<size_t>(D));
  int n = 0;
  for (int k = 0; k < limit; ++k) {
    const int64_t slot = idx[k];
    if (slot < 0 || slot >= num_slots) continue;
    decode_slot(cache, slot, rec.data());
    for (int d = 0; d < D; ++d) keys.push_back(codec::bf16_to_float(rec[size_t(d)]));
    ++n;
  }
  return n;
}

}  // namespace

Status check_sparse_decode_args(const SparseDecodeRefArgs& a) {
  constexpr const char* kOp = "selkv::ref::sparse_decode";
  SELKV_CHECK_ARG(a.B >= 0 && a.S_q >= 0 && a.H >= 0, "B/S_q/H", "must be >= 0");
  SELKV_CHECK_ARG(a.K >= 0, "K", "must be >= 0, got ", a.K);
  SELKV_CHECK_ARG(a.cache.format == KvFormat::kDsMlaFp8 || a.cache.format == KvFormat::kModel1Fp8,
                  "cache.format", "sparse decode reads ds_mla_fp8 (576-dim) or model1_fp8 (512-dim) records");
  SELKV_RETURN_IF_ERROR(check_ref_cache(kOp, "cache", a.cache));
  SELKV_CHECK_ARG(a.K2 >= 0, "K2", "must be >= 0, got ", a.K2);
  if (a.K2 > 0) {
    SELKV_CHECK_ARG(a.cache.format == KvFormat::kModel1Fp8, "extra_cache",
                    "an extra cache needs format model1_fp8");
    SELKV_CHECK_ARG(a.extra_cache.format == a.cache.format, "extra_cache.format", "must be the cache's");
    SELKV_RETURN_IF_ERROR(check_ref_cache(kOp, "extra_cache", a.extra_cache));
  } else {
    SELKV_CHECK_ARG(a.extra_topk_length == nullptr, "extra_topk_length", "given without an extra cache (K2 = 0)");
  }
  SELKV_RETURN_IF_ERROR(::selkv::detail::check_sm_scale(kOp, a.sm_scale));
  if (int64_t(a.B) * a.S_q * a.H == 0) return Status::Ok();
  SELKV_CHECK_ARG(a.q != nullptr, "q", "must not be null");
  SELKV_CHECK_ARG(a.indices != nullptr || a.K == 0, "indices", "must not be null");
  SELKV_CHECK_ARG(a.extra_indices != nullptr || a.K2 == 0, "extra_indices", "must not be null");
  SELKV_CHECK_ARG(a.out != nullptr, "out", "must not be null");
  return Status::Ok();
}

void sparse_decode(const SparseDecodeRefArgs& a) {
  if (!check_sparse_decode_args(a).ok()) return;
  const int kD = fmt::dequant_dim(a.cache.format);
  const int64_t rows = int64_t(a.B) * a.S_q;
  if (rows * a.H == 0) return;
  detail::parallel_rows(rows, a.threads, [&](int64_t row) {
    const int64_t b = row / a.S_q;
    const int limit = row_limit(a.topk_length, b, a.K);
    const int limit2 = a.K2 > 0 ? row_limit(a.extra_topk_length, b, a.K2) : 0;
    // Decode each selected record once for all heads: the main cache's, then the extra cache's.
    std::vector<double> keys;
    keys.reserve(size_t(limit + limit2) * kD);
    int n = gather_keys(a.cache, a.indices + row * a.K, limit, kD, keys);
    if (limit2 > 0) n += gather_keys(a.extra_cache, a.extra_indices + row * a.K2, limit2, kD, keys);
    float* lse = a.lse ? a.lse + row * a.H : nullptr;
    attend_row(a.q + row * a.H * kD, a.H, kD, keys, n, double(a.sm_scale), a.attn_sink,
               a.out + row * a.H * fmt::kVDim, lse, nullptr);
    if (n == 0 && lse != nullptr && a.empty_lse_pos_inf)
      for (int h = 0; h < a.H; ++h) lse[h] = std::numeric_limits<float>::infinity();
  });
}

// ---- C7 ----------------------------------------------------------------------------------------
Status check_sparse_prefill_args(const SparsePrefillRefArgs& a) {
  constexpr const char* kOp = "selkv::ref::sparse_prefill";
  SELKV_CHECK_ARG(a.T >= 0 && a.H >= 0, "T/H", "must be >= 0");
  SELKV_CHECK_ARG(a.d_qk == fmt::kQkDim || a.d_qk == fmt::kNopeDim, "d_qk",
                  "must be 576 or 512, got ", a.d_qk);
  SELKV_CHECK_ARG(a.K >= 0, "K", "must be >= 0, got ", a.K);
  SELKV_CHECK_ARG(a.num_kv >= 0, "num_kv", "must be >= 0, got ", a.num_kv);
  SELKV_CHECK_ARG(a.kv != nullptr || a.num_kv == 0, "kv", "must not be null");
  SELKV_RETURN_IF_ERROR(::selkv::detail::check_sm_scale(kOp, a.sm_scale));
  if (int64_t(a.T) * a.H == 0) return Status::Ok();
  SELKV_CHECK_ARG(a.q != nullptr, "q", "must not be null");
  SELKV_CHECK_ARG(a.indices != nullptr || a.K == 0, "indices", "must not be null");
  SELKV_CHECK_ARG(a.out != nullptr, "out", "must not be null");
  return Status::Ok();
}

void sparse_prefill(const SparsePrefillRefArgs& a) {
  if (!check_sparse_prefill_args(a).ok()) return;
  if (int64_t(a.T) * a.H == 0) return;
  const int D = a.d_qk;
  detail::parallel_rows(a.T, a.threads, [&](int64_t t) {
    const int32_t* idx = a.indices + t * a.K;
    const int limit = row_limit(a.topk_length, t, a.K);
    std::vector<double> keys;
    keys.reserve(size_t(limit) * D);
    int n = 0;
    for (int k = 0; k < limit; ++k) {
      const int64_t i = idx[k];
      if (i < 0 || i >= a.num_kv) continue;
      const uint16_t* kv = a.kv + i * D;
      for (int d = 0; d < D; ++d) keys.push_back(codec::bf16_to_float(kv[d]));
      ++n;
    }
    attend_row(a.q + t * a.H * D, a.H, D, keys, n, double(a.sm_scale), a.attn_sink,
               a.out + t * a.H * fmt::kVDim, a.lse ? a.lse + t * a.H : nullptr,
               a.max_logits ? a.max_logits + t * a.H : nullptr);
  });
}

}  // namespace selkv::ref
