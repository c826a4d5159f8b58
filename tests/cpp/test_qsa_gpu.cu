// C8 QSA sparse prefill on the GPU against the oracle (ref::qsa_sparse_prefill, fp64, on the same
// Params with host pointers) with DESIGN §5 tolerances, and the GPU plan (qsa_plan) against its
// reference ref::qsa_plan byte for byte. Random problems carry every garbage class of DESIGN §2
// and selkv/qsa.h: bad request ids, stale positions past seq_len, blocks past the live length,
// negative / huge block ids, block-table entries -1 / num_pages / INT_MAX / INT_MIN, logical pages
// past the table width, non-monotonic tables, partial tails of 0-3 tokens and empty rows; every
// cache slot that no valid entry points at is NaN, so a stray read shows. Expanded and compact
// forms, separate and interleaved K/V give the same bits; graph replay equals eager bit for bit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "qsa/qsa_layout.h"
#include "qsa_test_util.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"
#include "test_util.h"

namespace {

using namespace selkv;
using qsa_test::Problem;
using test::DevBuf;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
Problem make_problem(const Config& c, std::mt19937_64& rng) {
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
void poison_unused(Problem& pr) {
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
Result run_gpu(DeviceProblem& dp, const Problem& pr, QsaSelectionForm form, const std::string& what,
               bool force_simple = false) {
  Result res;
  QsaSparsePrefillParams p = dp.p;
  p.form = form;
  p.force_simple = force_simple;
  EXPECT_EQ(cudaMemset(dp.out->ptr, 0x77, dp.out->bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(dp.lse->ptr, 0x55, dp.lse->bytes), cudaSuccess);
  const Status st = qsa_sparse_prefill(p, nullptr);
  EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
  if (!st.ok() || !test::sync_or_abort(nullptr, what)) return res;
  res.out = test::down<uint16_t>(*dp.out, pr.out.size());
  res.lse = test::down<float>(*dp.lse, pr.lse.size());
  return res;
}

// The oracle's result for pr's current form (writes pr.out / pr.lse).
Result run_oracle(Problem& pr) {
  const Status st = ref::qsa_sparse_prefill(pr.p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return {pr.out, pr.lse};
}

// DESIGN §5 per (row, head): empty rows exactly 0 / -inf, NaN rows NaN everywhere, else out
// |err| < 1e-3 or rel < 2.01/128 against the oracle's dtype-rounded out, cosine distance < 5e-6,
// lse |err| < 1e-6 or rel < 8.01/65536. Returns the number of empty (row, head)s seen.
int64_t expect_close(const Problem& pr, const Result& g, const Result& ref, const std::string& what,
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

// The GPU plan of dp's selection in `form`, against ref::qsa_plan byte for byte (the buffer is
// filled with garbage first: every byte must be written).
void expect_plan_equal(DeviceProblem& dp, Problem& pr, QsaSelectionForm form, const std::string& what) {
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
  const std::vector<int32_t> got = test::down<int32_t>(md, bytes / 4);
  EXPECT_TRUE(test::bits_equal(got, want)) << what << ": plan buffer";
  pr.p.form = QsaSelectionForm::kExpanded;
  pr.p.num_rows = pr.R;
}

// One Config end to end: the oracle (expanded, and compact equal to it), the GPU on both forms
// (equal bits, within tolerance), the plan of both forms, and (for the layout pair) separate and
// interleaved K/V equal bit for bit.
void check_config(Config c, uint64_t seed) {
  const std::string what = c.name() + " seed " + std::to_string(seed);
  Result bits[2];
  for (int il = 0; il < 2; ++il) {
    c.interleaved = il == 1;
    std::mt19937_64 rng(seed);
    Problem pr = make_problem(c, rng);
    poison_unused(pr);
    DeviceProblem dp(pr);
    const std::string w = what + (il ? " interleaved" : " separate");
    pr.p.form = QsaSelectionForm::kExpanded;
    const Result ref = run_oracle(pr);
    const Result ge = run_gpu(dp, pr, QsaSelectionForm::kExpanded, w + " expanded");
    const Result gc = run_gpu(dp, pr, QsaSelectionForm::kCompact, w + " compact");
    const int64_t empty = expect_close(pr, ge, ref, w + " expanded");
    EXPECT_GT(empty, 0) << w << ": the problem should hold empty rows";
    EXPECT_TRUE(test::bits_equal(ge.out, gc.out)) << w << ": expanded vs compact out";
    EXPECT_TRUE(test::bits_equal(ge.lse, gc.lse)) << w << ": expanded vs compact lse";
    if (il == 0) {
      expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, w + " plan expanded");
      expect_plan_equal(dp, pr, QsaSelectionForm::kCompact, w + " plan compact");
    }
    bits[il] = ge;
  }
  EXPECT_TRUE(test::bits_equal(bits[0].out, bits[1].out)) << what << ": separate vs interleaved out";
  EXPECT_TRUE(test::bits_equal(bits[0].lse, bits[1].lse)) << what << ": separate vs interleaved lse";
}

TEST(QsaGpu, MatchesOracleAcrossDtypeHeadDimGroupAndPageSize) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(seed));
  for (QsaDtype dt : {QsaDtype::kFp16, QsaDtype::kBf16})
    for (int D : {256, 128})
      for (int G : {1, 2, 6, 8}) {
        Config c;
        c.dtype = dt;
        c.D = D;
        c.G = G;
        c.Hkv = G == 8 ? 1 : 2;
        c.P = (G % 2 == 0) ? 16 : 784;
        if (!test::full_grid() && !(G == 2 && D == 256)) continue;
        check_config(c, seed + uint64_t(G * 1000 + D + int(dt)));
      }
}

TEST(QsaGpu, PageSize784AndLongSelections) {
  SELKV_REQUIRE_GPU();
  const uint64_t seed = test::test_seed() + 7;
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test::test_seed()));
  Config c;
  c.P = 784;
  c.K = 96;
  c.max_len = 1600;
  c.R = 40;
  c.G = 4;
  c.Hkv = 2;
  check_config(c, seed);
  c.P = 16;
  c.dtype = QsaDtype::kBf16;
  check_config(c, seed + 1);
}

// Rows whose expanded groups are not 4-token blocks (a repeated token, tokens of two blocks): the
// plan flags them (counts = -1, byte-equal to the reference) and the attention stays exact.
TEST(QsaGpu, IrregularExpandedRowsStayExact) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 11);
  Config c;
  c.R = 8;
  c.num_req = 1;
  c.max_len = 128;
  Problem pr = make_problem(c, rng);
  for (int64_t r = 0; r < pr.R; ++r) {
    pr.req[size_t(r)] = 0;
    pr.pos[size_t(r)] = 100;
  }
  pr.lens[0] = 128;
  for (int w = 0; w < pr.width; ++w) pr.table[size_t(w)] = int32_t((w * 5 + 1) % pr.pages);
  const int64_t cols = qsa_expanded_cols(pr.K);
  int32_t* s0 = pr.sel.data();
  std::fill(s0, s0 + pr.R * cols, -1);
  const int32_t rows[4][8] = {{8, 9, 10, 10, 40, 41, 42, 43},     // repeated token
                              {8, 9, 12, 13, 40, 41, 42, 43},     // two blocks in one group
                              {40, 41, 42, 43, 8, 9, 10, 11},     // regular (sorted by the plan)
                              {3, -1, 77, 5000, 101, 100, 99, 98}};  // garbage, then a reversed group
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 8; ++i) s0[r * cols + i] = rows[r][i];
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  const Result g = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "irregular");
  expect_close(pr, g, ref, "irregular");
  expect_plan_equal(dp, pr, QsaSelectionForm::kExpanded, "irregular plan");
  std::vector<int32_t> md(qsa_metadata_size(pr.R, pr.K) / 4);
  ASSERT_TRUE(ref::qsa_plan(pr.p, md.data(), md.size() * 4).ok());
  EXPECT_EQ(md[qsa::counts_offset() + 0], qsa::kIrregular);
  EXPECT_EQ(md[qsa::counts_offset() + 1], qsa::kIrregular);
  EXPECT_EQ(md[qsa::counts_offset() + 2], 2);
}

// NaN in q (one row) and in the K of one valid entry (another row): those rows / heads are NaN,
// out and lse; the other rows are unaffected.
TEST(QsaGpu, NanInQOrValidKMakesTheRowNan) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 13);
  Config c;
  c.R = 12;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  const uint16_t nan = 0x7E00;
  int64_t with_entries[2] = {-1, -1};
  for (int64_t r = 0, n = 0; r < pr.R && n < 2; ++r)
    if (!ref::qsa_row_entries(pr.p, r).empty()) with_entries[n++] = r;
  ASSERT_GE(with_entries[1], 0);
  pr.q[size_t((with_entries[0] * pr.Hq + 1) * pr.D + 5)] = nan;  // row a, head 1
  const ref::QsaEntry e = ref::qsa_row_entries(pr.p, with_entries[1]).front();
  pr.kptr(e.page, e.slot, 0)[7] = nan;  // every row using that token, heads of kv head 0
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  EXPECT_TRUE(std::isnan(ref.lse[size_t(with_entries[0] * pr.Hq + 1)]));
  EXPECT_TRUE(std::isnan(ref.lse[size_t(with_entries[1] * pr.Hq)]));
  const Result g = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "nan");
  expect_close(pr, g, ref, "nan");
}

TEST(QsaGpu, GraphReplayEqualsEagerBitwise) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 17);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.R = 64;
  c.K = 32;
  c.max_len = 400;
  Problem pr = make_problem(c, rng);
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result eager = run_gpu(dp, pr, QsaSelectionForm::kCompact, "eager");
  const size_t md_bytes = qsa_metadata_size(pr.R, pr.K);
  DevBuf md(md_bytes);
  QsaSparsePrefillParams p = dp.p;
  p.form = QsaSelectionForm::kCompact;
  p.metadata = md.ptr;
  p.metadata_bytes = md_bytes;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMemset(dp.out->ptr, 0, dp.out->bytes));
  CUDA_OK(cudaMemset(dp.lse->ptr, 0, dp.lse->bytes));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status ps = qsa_plan(p, md.ptr, md_bytes, s);
  const Status as = qsa_sparse_prefill(p, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(ps.ok()) << ps.to_string();
  ASSERT_TRUE(as.ok()) << as.to_string();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) {
    CUDA_OK(cudaGraphLaunch(exec, s));
    ASSERT_TRUE(test::sync_or_abort(s, "graph replay"));
    EXPECT_TRUE(test::bits_equal(test::down<uint16_t>(*dp.out, pr.out.size()), eager.out)) << "replay " << i;
    EXPECT_TRUE(test::bits_equal(test::down<float>(*dp.lse, pr.lse.size()), eager.lse)) << "replay " << i;
  }
  pr.p.form = QsaSelectionForm::kCompact;
  std::vector<int32_t> want(md_bytes / 4);
  ASSERT_TRUE(ref::qsa_plan(pr.p, want.data(), md_bytes).ok());
  EXPECT_TRUE(test::bits_equal(test::down<int32_t>(md, md_bytes / 4), want)) << "plan from the graph";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// No lse pointer: out alone, the same bits as with lse.
TEST(QsaGpu, WithoutLseSameOut) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(test::test_seed() + 19);
  Config c;
  Problem pr = make_problem(c, rng);
  DeviceProblem dp(pr);
  const Result with = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "with lse");
  dp.p.lse = nullptr;
  CUDA_OK(cudaMemset(dp.lse->ptr, 0x55, dp.lse->bytes));
  CUDA_OK(cudaMemset(dp.out->ptr, 0x77, dp.out->bytes));
  ASSERT_TRUE(qsa_sparse_prefill(dp.p, nullptr).ok());
  ASSERT_TRUE(test::sync_or_abort(nullptr, "without lse"));
  EXPECT_TRUE(test::bits_equal(test::down<uint16_t>(*dp.out, pr.out.size()), with.out));
  const std::vector<float> l = test::down<float>(*dp.lse, pr.lse.size());
  uint32_t w;
  std::memcpy(&w, &l[0], 4);
  EXPECT_EQ(w, 0x55555555u) << "lse written although null";
}

// Qwen's shape at the route boundary: 4095 and 4096 rows (a plan given, so 4096 asks for the
// page-4 route), 512-block selections (2051 columns), Hq 6 / Hkv 1, D 256, page 16; default
// routing and force_simple agree with the oracle (and, both being exact, with each other).
TEST(QsaGpu, LargeBatchAtTheRouteBoundary) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  std::mt19937_64 rng(test::test_seed() + 23);
  Config c;
  c.G = 6;
  c.Hkv = 1;
  c.K = 512;
  c.R = 4096;
  c.num_req = 4;
  c.max_len = 4096;
  Problem pr = make_problem(c, rng);
  // Most rows: a full 512-block selection of live blocks of the row's request.
  for (int64_t r = 0; r < pr.R; ++r) {
    if (r % 9 == 0) continue;  // keep the generator's garbage rows
    const int rq = int(r % c.num_req);
    const int32_t pos = 2048 + int32_t(rng() % 2000);
    std::vector<int32_t> all((pos + 1) / 4);
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(all.size(), 512));
    std::fill(pr.sel.begin() + r * qsa_expanded_cols(c.K), pr.sel.begin() + (r + 1) * qsa_expanded_cols(c.K), -1);
    pr.select(r, rq, pos, all);
  }
  poison_unused(pr);
  DeviceProblem dp(pr);
  const Result ref = run_oracle(pr);
  const size_t md_bytes = qsa_metadata_size(pr.R, pr.K);
  DevBuf md(md_bytes);
  ASSERT_TRUE(qsa_plan(dp.p, md.ptr, md_bytes, nullptr).ok());
  dp.p.metadata = md.ptr;
  dp.p.metadata_bytes = md_bytes;
  EXPECT_TRUE(qsa_page4_wanted(dp.p) || std::getenv("SELKV_QSA_PAGE4") != nullptr);
  const Result def = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 default route");
  expect_close(pr, def, ref, "4096 rows, default route");
  const Result simple = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4096 force_simple", true);
  expect_close(pr, simple, ref, "4096 rows, force_simple");
  // 4095 rows: the same rows, the simple route (plan of the 4095-row call).
  dp.p.num_rows = 4095;
  const size_t md2_bytes = qsa_metadata_size(4095, pr.K);
  DevBuf md2(md2_bytes);
  ASSERT_TRUE(qsa_plan(dp.p, md2.ptr, md2_bytes, nullptr).ok());
  dp.p.metadata = md2.ptr;
  dp.p.metadata_bytes = md2_bytes;
  EXPECT_FALSE(qsa_page4_wanted(dp.p));
  const Result small = run_gpu(dp, pr, QsaSelectionForm::kExpanded, "4095 rows");
  expect_close(pr, small, ref, "4095 rows", 4095);
  expect_plan_equal(dp, pr, QsaSelectionForm::kCompact, "4095 rows plan (compact)");
}

}  // namespace
