// The C8 GPU tests' problem generator and checks (test_qsa_gpu.cu, test_qsa_page4_gpu.cu): random
// problems with every garbage class of DESIGN §2 and selkv/qsa.h (bad request ids, stale positions
// past seq_len, blocks past the live length, negative / huge block ids, block-table entries -1 /
// num_pages / INT_MAX / INT_MIN, logical pages past the table width, non-monotonic tables, partial
// tails of 0-3 tokens, empty rows), NaN in every cache slot no valid entry uses, device copies,
// and the oracle comparison with DESIGN §5 tolerances.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "qsa/qsa_group_layout.h"
#include "qsa_test_util.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"
#include "test_util.h"

namespace qsa_gpu_test {

using namespace selkv;
using qsa_test::Problem;
using test::DevBuf;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Config {
  QsaDtype dtype = QsaDtype::kFp16;
  int D = 256, Hkv = 2, G = 2;
  int P = 16;
  int K = 16;
  int64_t R = 24;
  int num_req = 3;
  int max_len = 200;  // live tokens of a request at most
  bool interleaved = false;
  std::string name() const {
    return std::string(dtype == QsaDtype::kBf16 ? "bf16" : "fp16") + " D" + std::to_string(D) + " Hkv" +
           std::to_string(Hkv) + " G" + std::to_string(G) + " P" + std::to_string(P) + " K" + std::to_string(K) +
           " R" + std::to_string(R) + (interleaved ? " interleaved" : " separate");
  }
};

// A random problem with every garbage class. Rows select both forms (Problem::select).
inline Problem make_problem(const Config& c, std::mt19937_64& rng) {
  Problem pr;
  pr.dtype = c.dtype;
  pr.R = c.R;
  pr.Hq = c.Hkv * c.G;
  pr.Hkv = c.Hkv;
  pr.D = c.D;
  pr.P = c.P;
  pr.K = c.K;
  pr.num_req = c.num_req;
  pr.interleaved = c.interleaved;
  const int pages_per_req = (c.max_len + c.P - 1) / c.P;
  pr.width = pages_per_req + 2;  // two columns past every live length (real pages in the padding)
  pr.pages = int64_t(c.num_req) * pages_per_req + 3;
  pr.build();
  pr.fill_random(rng, 0.1f);
  pr.p.scale = float(std::pow(double(c.D), -0.55));

  // Non-monotonic block table: a random permutation of the pages, with bad entries sprinkled in.
  std::vector<int32_t> perm(size_t(pr.pages));
  for (int64_t i = 0; i < pr.pages; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int32_t bad_pages[] = {-1, int32_t(pr.pages), std::numeric_limits<int32_t>::max(),
                               std::numeric_limits<int32_t>::min()};
  std::uniform_int_distribution<int> coin(0, 99);
  for (int q = 0; q < c.num_req; ++q)
    for (int w = 0; w < pr.width; ++w) {
      int32_t& e = pr.table[size_t(q * pr.width + w)];
      e = perm[size_t((q * pr.width + w) % pr.pages)];
      if (coin(rng) < 8) e = bad_pages[coin(rng) % 4];
    }
  for (int q = 0; q < c.num_req; ++q) pr.lens[size_t(q)] = c.max_len - int32_t(coin(rng) % 17);
  // Request 0 claims more live tokens than its table row covers: its tokens with t / P >= width
  // are invalid although the entries after its row (request 1's) are real pages.
  const int32_t covered = pr.width * c.P;
  pr.lens[0] = covered + 2 * c.P;

  const int32_t bad_req[] = {-1, c.num_req, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  for (int64_t r = 0; r < c.R; ++r) {
    int rq = int(coin(rng)) % c.num_req;
    if (coin(rng) < 6) rq = bad_req[coin(rng) % 4];
    const int32_t len = rq >= 0 && rq < c.num_req ? pr.lens[size_t(rq)] : c.max_len;
    // Causal position: mostly live, some stale past seq_len; every tail length 0-3 shows up.
    int32_t pos = int32_t(coin(rng) * int64_t(len) / 100);
    if (coin(rng) < 8) pos = len + int32_t(coin(rng) % 40);
    pos = std::max(0, (pos & ~3) + int32_t(r % 4) - 1);
    const int32_t complete = (pos + 1) / 4;  // blocks before the causal partial block
    std::vector<int32_t> blocks;
    const int want = coin(rng) < 5 ? 0 : 1 + int(coin(rng)) % c.K;
    std::set<int32_t> used;
    for (int i = 0; i < want && int(blocks.size()) < c.K; ++i) {
      int32_t b;
      const int kind = coin(rng);
      if (kind < 6) b = complete + 1 + int32_t(coin(rng) % 8);    // past the position (stale)
      else if (kind < 9) b = (len + 3) / 4 + int32_t(coin(rng));  // past the live length
      else if (kind < 11) b = 1 << 27;                            // far past everything
      else if (kind < 13) b = -1 - int32_t(coin(rng) % 3);        // negative
      else if (kind < 18 && len > covered) b = covered / 4 + int32_t(coin(rng) % (c.P / 2));  // past the width
      else if (complete > 0) b = int32_t(rng() % uint64_t(complete));
      else continue;
      if (b >= 0 && b < complete && !used.insert(b).second) continue;  // real blocks: distinct
      blocks.push_back(b);
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    pr.select(r, rq, pos, blocks);
  }
  pr.req[0] = bad_req[rng() % 4];  // at least one empty row
  return pr;
}

// NaN into every K / V slot (all heads, all of D) that no valid entry of any row uses.
inline void poison_unused(Problem& pr) {
  std::vector<char> used(size_t(pr.pages * pr.P), 0);
  for (int64_t r = 0; r < pr.R; ++r)
    for (const ref::QsaEntry& e : ref::qsa_row_entries(pr.p, r)) used[size_t(e.page * pr.P + e.slot)] = 1;
  const uint16_t nan = pr.dtype == QsaDtype::kBf16 ? 0x7FC0 : 0x7E00;
  for (int64_t pg = 0; pg < pr.pages; ++pg)
    for (int64_t s = 0; s < pr.P; ++s) {
      if (used[size_t(pg * pr.P + s)]) continue;
      for (int h = 0; h < pr.Hkv; ++h) {
        std::fill(pr.kptr(pg, s, h), pr.kptr(pg, s, h) + pr.D, nan);
        std::fill(pr.vptr(pg, s, h), pr.vptr(pg, s, h) + pr.D, nan);
      }
    }
}

// Device copies of a Problem's arrays and a Params over them (same shapes and strides).
struct DeviceProblem {
  std::vector<std::unique_ptr<DevBuf>> bufs;
  std::vector<std::pair<const void*, size_t>> host;  // what each buffer copies
  QsaSparsePrefillParams p;
  DevBuf* out = nullptr;
  DevBuf* lse = nullptr;

  template <typename T>
  DevBuf* add(const std::vector<T>& v) {
    bufs.push_back(std::make_unique<DevBuf>(std::max<size_t>(v.size() * sizeof(T), 16)));
    if (!v.empty()) bufs.back()->upload(v);
    host.push_back({v.data(), v.size() * sizeof(T)});
    return bufs.back().get();
  }
  template <typename T>
  T* map(const T* h) const {
    if (h == nullptr) return nullptr;
    const auto* b = reinterpret_cast<const uint8_t*>(h);
    for (size_t i = 0; i < host.size(); ++i) {
      const auto* base = static_cast<const uint8_t*>(host[i].first);
      if (host[i].second > 0 && b >= base && b < base + host[i].second)
        return reinterpret_cast<T*>(bufs[i]->as<uint8_t>() + (b - base));
    }
    ADD_FAILURE() << "host pointer not uploaded";
    return nullptr;
  }

  explicit DeviceProblem(const Problem& pr) {
    add(pr.q);
    add(pr.kv);
    add(pr.k);
    add(pr.v);
    add(pr.table);
    add(pr.lens);
    add(pr.req);
    add(pr.pos);
    add(pr.sel);
    add(pr.ids);
    add(pr.counts);
    out = add(pr.out);
    lse = add(pr.lse);
    p = pr.p;
    p.q = map(pr.p.q);
    p.k_cache.data = map(pr.p.k_cache.data);
    p.v_cache.data = map(pr.p.v_cache.data);
    p.block_table = map(pr.p.block_table);
    p.seq_lens = map(pr.p.seq_lens);
    p.req_ids = map(pr.p.req_ids);
    p.positions = map(pr.p.positions);
    p.selection = map(pr.p.selection);
    p.block_ids = map(pr.p.block_ids);
    p.block_counts = map(pr.p.block_counts);
    p.out = map(static_cast<const uint16_t*>(pr.p.out));
    p.lse = pr.p.lse ? map(pr.p.lse) : nullptr;
  }
};

struct Result {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

// Runs the GPU op on `dp` with the given form (both are uploaded), garbage in the outputs first.
// Runs `call` (a GPU entry over Params, on the default stream) on `dp` with the given form (both
// are uploaded), garbage in the outputs first.
template <typename Call>
Result run_gpu_with(DeviceProblem& dp, const Problem& pr, QsaSelectionForm form, const std::string& what,
                    Call&& call) {
  Result res;
  QsaSparsePrefillParams p = dp.p;
  p.form = form;
  EXPECT_EQ(cudaMemset(dp.out->ptr, 0x77, dp.out->bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(dp.lse->ptr, 0x55, dp.lse->bytes), cudaSuccess);
  const Status st = call(p);
  EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
  if (!st.ok() || !test::sync_or_abort(nullptr, what)) return res;
  res.out = test::down<uint16_t>(*dp.out, pr.out.size());
  res.lse = test::down<float>(*dp.lse, pr.lse.size());
  return res;
}

// qsa_sparse_prefill (the routed entry) on `dp`.
inline Result run_gpu(DeviceProblem& dp, const Problem& pr, QsaSelectionForm form, const std::string& what,
                      bool force_simple = false) {
  return run_gpu_with(dp, pr, form, what, [&](QsaSparsePrefillParams p) {
    p.force_simple = force_simple;
    return qsa_sparse_prefill(p, nullptr);
  });
}

// The oracle's result for pr's current form (writes pr.out / pr.lse).
inline Result run_oracle(Problem& pr) {
  const Status st = ref::qsa_sparse_prefill(pr.p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return {pr.out, pr.lse};
}

// DESIGN §5 per (row, head): empty rows exactly 0 / -inf, NaN rows NaN everywhere, else out
// |err| < 1e-3 or rel < 2.01/128 against the oracle's dtype-rounded out, cosine distance < 5e-6,
// lse |err| < 1e-6 or rel < 8.01/65536. Returns the number of empty (row, head)s seen.
inline int64_t expect_close(const Problem& pr, const Result& g, const Result& ref, const std::string& what,
                     int64_t rows = -1) {
  const int64_t R = rows < 0 ? pr.R : rows, Hq = pr.Hq, D = pr.D;
  if (g.out.size() < size_t(R * Hq * D) || g.lse.size() < size_t(R * Hq)) {
    ADD_FAILURE() << what << ": no GPU result";
    return 0;
  }
  int64_t bad = 0, bad_lse = 0, bad_special = 0, empty = 0;
  double xy = 0, xx = 0, yy = 0;
  for (int64_t i = 0; i < R * Hq; ++i) {
    const float rl = ref.lse[size_t(i)], gl = g.lse[size_t(i)];
    const uint16_t* go = g.out.data() + i * D;
    const uint16_t* ro = ref.out.data() + i * D;
    if (std::isnan(rl) || rl == kNegInf) {
      const bool want_nan = std::isnan(rl);
      bool ok = want_nan ? std::isnan(gl) : gl == kNegInf;
      for (int64_t d = 0; d < D && ok; ++d) ok = want_nan ? std::isnan(pr.f(go[d])) : (go[d] & 0x7FFF) == 0;
      if (!ok && bad_special++ < 5)
        ADD_FAILURE() << what << ": row " << i / Hq << " head " << i % Hq << " should be "
                      << (want_nan ? "NaN" : "empty (0, -inf)") << "; lse " << gl << " out[0] " << pr.f(go[0]);
      if (!want_nan) ++empty;
      continue;
    }
    for (int64_t d = 0; d < D; ++d) {
      const float x = pr.f(go[d]), r = pr.f(ro[d]);
      const float err = std::fabs(x - r);
      if (!(err < 1e-3f || err < 2.01f / 128.f * std::fabs(r)) && bad++ < 5)
        ADD_FAILURE() << what << ": row " << i / Hq << " head " << i % Hq << " d " << d << ": gpu " << x << " ref "
                      << r;
      xy += double(x) * r;
      xx += double(x) * x;
      yy += double(r) * r;
    }
    const float err = std::fabs(gl - rl);
    if (!(err < 1e-6f || err < 8.01f / 65536.f * std::fabs(rl)) && bad_lse++ < 5)
      ADD_FAILURE() << what << ": lse row " << i / Hq << " head " << i % Hq << ": gpu " << gl << " ref " << rl;
  }
  EXPECT_EQ(bad, 0) << what;
  EXPECT_EQ(bad_lse, 0) << what;
  EXPECT_EQ(bad_special, 0) << what;
  if (xx + yy > 0) EXPECT_LT(1.0 - 2.0 * xy / (xx + yy), 5e-6) << what << ": cosine distance";
  return empty;
}

// The GPU plan (qsa_plan) of dp's selection in `form` against ref::qsa_plan byte for byte (the
// buffer is filled with garbage first: every word must be written).
inline void expect_plan_equal(DeviceProblem& dp, Problem& pr, QsaSelectionForm form, const std::string& what) {
  QsaSparsePrefillParams p = dp.p;
  p.form = form;
  pr.p.form = form;
  pr.p.num_rows = p.num_rows;  // the call's rows (a prefix of the problem's)
  const size_t bytes = qsa_metadata_size(p.num_rows, pr.K);
  ASSERT_GT(bytes, 0u);
  DevBuf md(bytes);
  ASSERT_NE(md.ptr, nullptr);
  CUDA_OK(cudaMemset(md.ptr, 0xA5, bytes));
  const Status st = qsa_plan(p, md.ptr, bytes, nullptr);
  ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
  ASSERT_TRUE(test::sync_or_abort(nullptr, what));
  std::vector<int32_t> want(bytes / 4);
  ASSERT_TRUE(ref::qsa_plan(pr.p, want.data(), bytes).ok());
  EXPECT_TRUE(test::bits_equal(test::down<int32_t>(md, bytes / 4), want)) << what << ": plan buffer";
  pr.p.form = QsaSelectionForm::kExpanded;
  pr.p.num_rows = pr.R;
}

}  // namespace qsa_gpu_test
