// C8 QSA sparse prefill (selkv::qsa_sparse_prefill): R query rows, each selecting 512 random
// 4-token blocks of its request's context plus its causal partial block (vLLM's expanded
// [R, 2051] selection), fp16, page 16. The other cases time the simple kernel (force_simple; the
// plan, qsa_plan, is built once outside the timed call); "page4" cases build their group plan
// (qsa::qsa_group_plan) inside every timed call.
// "page4" cases time the page-4 route (qsa::qsa_sparse_prefill_page4: the SM90 page-4 kernel and
// the fix-up pass) whatever qsa_route picks; "route" cases time what a caller of the public API
// runs: qsa_sparse_prefill on the kernel qsa_route picks, with qsa_plan inside the timed call when
// the route wants one. "overlap N%" cases give each row N% of the previous row's blocks
// (neighbouring query tokens select mostly the same blocks), the rest random. "K=N" cases pass
// the selection at its top-k width ([R, 4N + 3], max_blocks N) instead of [R, 2051] with -1 padding.
// Bytes (the floor, DESIGN §6): the unique K / V tokens the batch selects (each read once, every
// kv head) + q + the selection + out + lse, at the copy rate. The variant also states the K / V
// bytes the simple kernel gathers (every selected token once per row and kv head), the traffic a
// kernel without cross-row reuse moves.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <numeric>

#include "cache_common.h"
#include "formats/codec.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_group_plan.h"
#include "qsa/qsa_page4.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"

namespace selkv::bench {
namespace {

struct QsaShape {
  int64_t rows = 4096;
  int32_t q_heads = 16;
  int32_t kv_heads = 2;
  int32_t dim = 256;
  int32_t blocks = 512;  // selected per row
  int32_t page = 16;
  int32_t context = 8192;  // live tokens of each request
  bool interleaved = false;
  bool force_simple = false;
  bool page4 = false;      // time qsa::qsa_sparse_prefill_page4
  bool route = false;      // time qsa_sparse_prefill as routed, qsa_plan inside the call when wanted
  int32_t max_blocks = kQsaMaxBlocks;  // the selection's width: [R, 4 max_blocks + 3]
  int32_t rows_per_cta = 0;  // page4: rows one CTA groups (0: the kernel's default)
  int32_t overlap = 0;     // % of the previous row's blocks a row keeps (0: independent random rows)
  uint64_t seed = 0x95a;
};

std::string shape_str(const QsaShape& s) {
  return "R=" + human_count(s.rows) + " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " D=" + std::to_string(s.dim) + " blocks=" + std::to_string(s.blocks) + " ctx=" + human_count(s.context) +
         " page=" + std::to_string(s.page) +
         (s.max_blocks != kQsaMaxBlocks ? " K=" + std::to_string(s.max_blocks) : "") + (s.overlap > 0 ? " overlap=" + std::to_string(s.overlap) + "%" : "") +
         (s.page4 && s.rows_per_cta > 0 ? " rows/cta=" + std::to_string(s.rows_per_cta) : "");
}

class QsaWorkload final : public Workload {
 public:
  explicit QsaWorkload(const QsaShape& s) : s_(s) {
    // Requests of `context` tokens; each holds up to 4096 rows at its last positions.
    rows_per_req_ = std::min<int64_t>(s.rows, 4096);
    num_req_ = int32_t((s.rows + rows_per_req_ - 1) / rows_per_req_);
    const int32_t pages_per_req = (s.context + s.page - 1) / s.page;
    pages_ = int64_t(num_req_) * pages_per_req;
    slot_elems_ = int64_t(s.kv_heads) * s.dim;
    const int64_t cache_elems = pages_ * s.page * slot_elems_;
    Rng rng(s.seed);
    // Non-monotonic block table: a permutation of the pages.
    const std::vector<int32_t> perm = permutation(int32_t(pages_), rng);
    table_.assign(perm.begin(), perm.end());
    lens_.assign(size_t(num_req_), s.context);
    req_.resize(size_t(s.rows));
    pos_.resize(size_t(s.rows));
    const int64_t cols = qsa_expanded_cols(s.max_blocks);
    sel_.assign(size_t(s.rows * cols), -1);
    std::vector<char> used(size_t(pages_ * s.page), 0);
    std::vector<int32_t> pool, prev;
    std::vector<char> chosen;
    for (int64_t r = 0; r < s.rows; ++r) {
      const int32_t rq = int32_t(r / rows_per_req_);
      const int32_t p = s.context - int32_t(rows_per_req_) + int32_t(r % rows_per_req_);
      req_[size_t(r)] = rq;
      pos_[size_t(r)] = p;
      const int32_t complete = (p + 1) / 4;
      pool.resize(size_t(complete));
      std::iota(pool.begin(), pool.end(), 0);
      const int32_t n = std::min(s.blocks, complete);
      for (int32_t i = 0; i < n; ++i) std::swap(pool[size_t(i)], pool[size_t(i + int32_t(rng.next() % uint64_t(complete - i)))]);
      if (s.overlap > 0 && r % rows_per_req_ != 0 && int32_t(prev.size()) == n) {
        // Keep the previous row's blocks, replace (100 - overlap)% of them by blocks it lacks.
        chosen.assign(size_t(complete), 0);
        for (int32_t b : prev) chosen[size_t(b)] = 1;
        const int32_t replace = n - int32_t(int64_t(n) * s.overlap / 100);
        for (int32_t k = 0; k < replace && n < complete; ++k) {
          int32_t b;
          do b = int32_t(rng.next() % uint64_t(complete)); while (chosen[size_t(b)]);
          const size_t victim = size_t(rng.next() % uint64_t(n));
          chosen[size_t(prev[victim])] = 0;
          chosen[size_t(b)] = 1;
          prev[victim] = b;
        }
        std::copy(prev.begin(), prev.end(), pool.begin());
      }
      prev.assign(pool.begin(), pool.begin() + n);
      int32_t* row = sel_.data() + r * cols;
      int c = 0;
      auto mark = [&](int32_t t) {
        row[c++] = t;
        used[size_t(int64_t(table_[size_t(int64_t(rq) * pages_per_req + t / s.page)]) * s.page + t % s.page)] = 1;
        ++gathered_tokens_;
      };
      for (int32_t i = 0; i < n; ++i)
        for (int k = 0; k < 4; ++k) mark(4 * pool[size_t(i)] + k);
      for (int32_t t = 4 * complete; t <= p; ++t) mark(t);
    }
    unique_tokens_ = std::count(used.begin(), used.end(), char(1));

    q_ = DeviceBuffer(size_t(s.rows) * s.q_heads * s.dim * 2);
    kv_ = DeviceBuffer(size_t(cache_elems) * 2 * 2);
    device_fill_random_bf16(q_.get(), size_t(s.rows) * s.q_heads * s.dim, s.seed ^ 1, nullptr);
    device_fill_random_bf16(kv_.get(), size_t(cache_elems) * 2, s.seed ^ 2, nullptr);
    // The bf16 fill is reinterpreted as fp16 below: keep the values small and finite.
    fix_fp16(q_, size_t(s.rows) * s.q_heads * s.dim, 1.f);
    fix_fp16(kv_, size_t(cache_elems) * 2, 0.1f);
    table_d_ = upload(table_);
    lens_d_ = upload(lens_);
    req_d_ = upload(req_);
    pos_d_ = upload(pos_);
    sel_d_ = upload(sel_);
    out_ = DeviceBuffer(size_t(s.rows) * s.q_heads * s.dim * 2);
    lse_ = DeviceBuffer(size_t(s.rows) * s.q_heads * 4);
    // page4: the group plan, rebuilt inside every timed call; else the public plan (the same group
    // plan), built once here and passed along (the simple kernel does not read it).
    md_bytes_ = qsa_metadata_size(s.rows, s.max_blocks);
    md_ = DeviceBuffer(md_bytes_);
    // The page-4 route's workspace; SELKV_BENCH_QSA_NO_WORKSPACE=1 leaves it out (whole groups a
    // CTA), for A/B runs.
    const char* no_ws = std::getenv("SELKV_BENCH_QSA_NO_WORKSPACE");
    if (no_ws == nullptr || std::string(no_ws) != "1") {
      ws_bytes_ = qsa_workspace_size(s.dim);
      ws_ = DeviceBuffer(ws_bytes_);
    }
    const QsaSparsePrefillParams p = params(q_.get(), kv_.get(), table_d_.as<int32_t>(), lens_d_.as<int32_t>(),
                                            req_d_.as<int32_t>(), pos_d_.as<int32_t>(), sel_d_.as<int32_t>(),
                                            out_.get(), lse_.as<float>(), s.rows);
    if (!s.page4 && !s.route) throw_if_error(qsa_plan(p, md_.get(), md_bytes_, nullptr));
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }

  std::string shape() const override { return shape_str(s_); }
  std::string variant() const override {
    char buf[200];
    const QsaSparsePrefillParams p = device_params();
    std::snprintf(buf, sizeof buf, "fp16 %s %s; gathered %.3g GB, floor %.3g GB",
                  s_.interleaved ? "interleaved" : "separate",
                  s_.page4 || qsa_route(p) == QsaKernel::kPage4 ? "page4" : "simple",
                  double(gathered_tokens_) * slot_elems_ * 4 / 1e9, bytes() / 1e9);
    return buf;
  }
  double bytes() const override {
    const double kv = double(unique_tokens_) * double(slot_elems_) * 2 * 2;
    const double q_out = double(s_.rows) * s_.q_heads * s_.dim * 2 * 2 + double(s_.rows) * s_.q_heads * 4;
    return kv + q_out + double(sel_.size()) * 4;
  }
  double flops() const override {
    // Per gathered token and query head: q.k and p.v, 2 * D FLOPs each.
    return double(gathered_tokens_) * s_.q_heads * 4.0 * s_.dim;
  }
  void run(cudaStream_t stream) override {
    const QsaSparsePrefillParams p = device_params();
    if (s_.route && qsa_page4_wanted(p)) throw_if_error(qsa_plan(p, md_.get(), md_bytes_, stream));
    if (!s_.page4) {
      throw_if_error(qsa_sparse_prefill(p, stream));
      return;
    }
    const int rows = s_.rows_per_cta != 0 ? s_.rows_per_cta : qsa::qsa_page4_max_rows(s_.q_heads / s_.kv_heads);
    // The route's plan (groups that share too little handed to the fix-up) at the default grouping;
    // the rows/cta sweep lists every group.
    throw_if_error(qsa::qsa_group_plan(p, rows, md_.get(), md_bytes_, stream, /*hand_over=*/s_.rows_per_cta == 0));
    throw_if_error(qsa::qsa_sparse_prefill_page4(p, stream, s_.rows_per_cta));
  }

  // Rows 0, R/2 and R-1 through the oracle on host copies of their inputs.
  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(0xff, stream);
    lse_.fill_async(0xff, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const int64_t cache_elems = pages_ * s_.page * slot_elems_;
    std::vector<uint16_t> kv(size_t(cache_elems) * 2);
    SELKV_BENCH_CUDA(cudaMemcpy(kv.data(), kv_.get(), kv.size() * 2, cudaMemcpyDeviceToHost));
    const int64_t hd = int64_t(s_.q_heads) * s_.dim, cols = qsa_expanded_cols(s_.max_blocks);
    for (int64_t r : {int64_t(0), s_.rows / 2, s_.rows - 1}) {
      const size_t n = static_cast<size_t>(hd);
      std::vector<uint16_t> q(n), got(n), want(n);
      std::vector<float> got_l(size_t(s_.q_heads)), want_l(size_t(s_.q_heads));
      SELKV_BENCH_CUDA(cudaMemcpy(q.data(), q_.as<uint16_t>() + r * hd, size_t(hd) * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(got.data(), out_.as<uint16_t>() + r * hd, size_t(hd) * 2, cudaMemcpyDeviceToHost));
      SELKV_BENCH_CUDA(cudaMemcpy(got_l.data(), lse_.as<float>() + r * s_.q_heads, size_t(s_.q_heads) * 4,
                                  cudaMemcpyDeviceToHost));
      const QsaSparsePrefillParams p = params(q.data(), kv.data(), table_.data(), lens_.data(), &req_[size_t(r)],
                                              &pos_[size_t(r)], sel_.data() + r * cols, want.data(), want_l.data(), 1);
      const Status st = ref::qsa_sparse_prefill(p);
      if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
      for (int64_t e = 0; e < hd; ++e) {
        const float g = codec::f16_to_float(got[size_t(e)]), w = codec::f16_to_float(want[size_t(e)]);
        if (!(std::fabs(g - w) < 1e-3f || std::fabs(g - w) < 2.01f / 128.f * std::fabs(w))) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "row %lld h %lld d %lld: got %g want %g", (long long)r,
                        (long long)(e / s_.dim), (long long)(e % s_.dim), g, w);
          return CheckResult::fail(buf);
        }
      }
      for (int h = 0; h < s_.q_heads; ++h) {
        const float g = got_l[size_t(h)], w = want_l[size_t(h)];
        if (!(std::fabs(g - w) < 1e-6f || std::fabs(g - w) < 8.01f / 65536.f * std::fabs(w)))
          return CheckResult::fail("lse row " + std::to_string(r) + " h " + std::to_string(h));
      }
    }
    return CheckResult::pass("DESIGN §5 tolerances, 3 rows x " + std::to_string(s_.q_heads) + " heads");
  }

 private:
  static DeviceBuffer upload(const std::vector<int32_t>& v) {
    DeviceBuffer b(std::max<size_t>(v.size() * 4, 16));
    SELKV_BENCH_CUDA(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return b;
  }
  // Random bf16 bits -> fp16 bits of the same value times `scale` (host round trip, setup only).
  static void fix_fp16(DeviceBuffer& b, size_t n, float scale) {
    std::vector<uint16_t> h(n);
    SELKV_BENCH_CUDA(cudaMemcpy(h.data(), b.get(), n * 2, cudaMemcpyDeviceToHost));
    for (auto& x : h) x = codec::float_to_f16(codec::bf16_to_float(x) * scale);
    SELKV_BENCH_CUDA(cudaMemcpy(b.get(), h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  QsaSparsePrefillParams params(const void* q, const void* kv, const int32_t* table, const int32_t* lens,
                                const int32_t* req, const int32_t* pos, const int32_t* sel, void* out, float* lse,
                                int64_t rows) const {
    QsaSparsePrefillParams p;
    p.dtype = QsaDtype::kFp16;
    p.num_rows = rows;
    p.num_q_heads = s_.q_heads;
    p.num_kv_heads = s_.kv_heads;
    p.head_dim = s_.dim;
    p.q = q;
    p.q_row_stride = int64_t(s_.q_heads) * s_.dim;
    p.q_head_stride = s_.dim;
    const auto* base = static_cast<const uint16_t*>(kv);
    const int64_t page_elems = int64_t(s_.page) * slot_elems_;
    if (s_.interleaved) {
      p.k_cache = {base, 2 * page_elems, slot_elems_, s_.dim};
      p.v_cache = {base + page_elems, 2 * page_elems, slot_elems_, s_.dim};
    } else {
      p.k_cache = {base, page_elems, slot_elems_, s_.dim};
      p.v_cache = {base + pages_ * page_elems, page_elems, slot_elems_, s_.dim};
    }
    p.num_pages = pages_;
    p.page_size = s_.page;
    p.block_table = table;
    p.block_table_stride = (s_.context + s_.page - 1) / s_.page;
    p.num_req = num_req_;
    p.block_table_width = int32_t(p.block_table_stride);
    p.seq_lens = lens;
    p.req_ids = req;
    p.positions = pos;
    p.form = QsaSelectionForm::kExpanded;
    p.max_blocks = s_.max_blocks;
    p.selection = sel;
    p.selection_stride = qsa_expanded_cols(s_.max_blocks);
    p.scale = float(1.0 / std::sqrt(double(s_.dim)));
    p.out = out;
    p.out_row_stride = int64_t(s_.q_heads) * s_.dim;
    p.out_head_stride = s_.dim;
    p.lse = lse;
    p.lse_row_stride = s_.q_heads;
    p.lse_head_stride = 1;
    p.force_simple = s_.force_simple;
    return p;
  }
  QsaSparsePrefillParams device_params() const {
    QsaSparsePrefillParams p = params(q_.get(), kv_.get(), table_d_.as<int32_t>(), lens_d_.as<int32_t>(),
                                      req_d_.as<int32_t>(), pos_d_.as<int32_t>(), sel_d_.as<int32_t>(), out_.get(),
                                      lse_.as<float>(), s_.rows);
    p.metadata = md_.get();
    p.metadata_bytes = md_bytes_;
    p.workspace = ws_bytes_ > 0 ? ws_.get() : nullptr;
    p.workspace_bytes = ws_bytes_;
    return p;
  }

  QsaShape s_;
  int64_t rows_per_req_ = 0, pages_ = 0, slot_elems_ = 0;
  int32_t num_req_ = 0;
  int64_t unique_tokens_ = 0, gathered_tokens_ = 0;
  std::vector<int32_t> table_, lens_, req_, pos_, sel_;
  DeviceBuffer q_, kv_, table_d_, lens_d_, req_d_, pos_d_, sel_d_, out_, lse_, md_, ws_;
  size_t md_bytes_ = 0, ws_bytes_ = 0;
};

QsaShape shape_from(const Params& p) {
  QsaShape s;
  s.rows = checked_positive("tokens", p.get_int("tokens", 4096));
  s.q_heads = int32_t(checked_positive("heads", p.get_int("heads", 16)));
  s.kv_heads = int32_t(checked_positive("kv-heads", p.get_int("kv-heads", 2)));
  s.dim = int32_t(checked_positive("head-dim", p.get_int("head-dim", 256)));
  s.blocks = int32_t(checked_positive("topk", p.get_int("topk", 512)));
  s.context = int32_t(checked_positive("s-kv", p.get_int("s-kv", 8192)));
  s.page = int32_t(checked_positive("page-size", p.get_int("page-size", 16)));
  s.page4 = p.get_int("page4", 0) != 0;
  s.route = p.get_int("route", 0) != 0;
  s.max_blocks = int32_t(p.get_int("select-k", kQsaMaxBlocks));
  if (s.max_blocks < 1 || s.max_blocks > kQsaMaxBlocks || s.blocks > s.max_blocks)
    throw std::invalid_argument("--select-k must be in [--topk, 512]");
  if (s.page4 && s.route) throw std::invalid_argument("--page4 and --route exclude each other");
  s.rows_per_cta = int32_t(p.get_int("rows-per-cta", 0));
  s.overlap = int32_t(p.get_int("overlap", 0));
  if (s.overlap < 0 || s.overlap > 100) throw std::invalid_argument("--overlap must be in [0, 100]");
  s.seed = p.seed() ^ 0x95a;
  return s;
}

}  // namespace

SELKV_BENCH_REGISTER(register_qsa) {
  OpSpec op;
  op.key = "qsa";
  op.api = "selkv::qsa_sparse_prefill";
  op.summary = "C8 QSA sparse prefill, 512 selected 4-token blocks per row (default R=4096, Hq=16, Hkv=2, D=256 fp16)";
  op.order = 80;
  op.in_default_job = false;
  op.params = {{"tokens", "query rows R (qsa: 4096)"},
               {"heads", "query heads Hq (qsa: 16)"},
               {"kv-heads", "kv heads Hkv (qsa: 2)"},
               {"head-dim", "head dim D, 128 or 256 (qsa: 256)"},
               {"topk", "selected blocks per row, <= 512 (qsa: 512)"},
               {"s-kv", "context tokens per request (qsa: 8192)"},
               {"page-size", "page size, a multiple of 4 (qsa: 16)"},
               {"page4", "1: time the page-4 route (qsa: 0, the simple kernel)"},
               {"route", "1: time qsa_sparse_prefill as routed, qsa_plan inside the call when wanted (qsa: 0)"},
               {"select-k", "max_blocks K of the selection buffer [R, 4K + 3] (qsa: 512)"},
               {"rows-per-cta", "page-4 rows per CTA, 0 = default (qsa: 0)"},
               {"overlap", "% of the previous row's blocks each row keeps (qsa: 0, random rows)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> { return std::make_unique<QsaWorkload>(shape_from(p)); };
  op_registry().push_back(std::move(op));

  struct Case {
    int64_t rows;
    int32_t hq, hkv, context;
    bool interleaved;
    bool page4 = false;
    int32_t blocks = 512;
    int32_t overlap = 0;
    int32_t rows_per_cta = 0;
    bool route = false;
    int32_t max_blocks = kQsaMaxBlocks;
  };
  std::vector<Case> cases;
  for (auto [hq, hkv] : {std::pair{16, 2}, std::pair{32, 4}})
    for (int64_t rows : {int64_t(1), int64_t(64), int64_t(4096), int64_t(16384)})
      cases.push_back({rows, hq, hkv, 8192, false});
  // The anchor shape (Qwen QSA: Hq 6, Hkv 1, interleaved K/V) at 8K and 128K contexts.
  cases.push_back({4096, 6, 1, 8192, true});
  cases.push_back({4096, 6, 1, 131072, true});
  // The page-4 route on the cases: the anchor shape with random 512 / 128 / 16-block
  // selections (2048 / 512 / 64 tokens) at 8K and 128K, with 90-99% overlap between neighbouring
  // rows, a rows-per-CTA sweep, and the Hq 16 / Hkv 2 grid's large batches.
  for (int32_t ctx : {8192, 131072})
    for (int32_t blocks : {512, 128, 16}) cases.push_back({4096, 6, 1, ctx, true, true, blocks});
  for (int32_t ctx : {8192, 131072})
    for (int32_t blocks : {128, 16}) cases.push_back({4096, 6, 1, ctx, true, false, blocks});  // simple, same
  for (int32_t ctx : {8192, 131072})
    for (int32_t ov : {90, 95, 99}) cases.push_back({4096, 6, 1, ctx, true, true, 512, ov});
  // Contexts between: where a group's sharing (8K ~2.6, 128K ~1.0) crosses the plan's threshold.
  for (int32_t ctx : {16384, 32768})
    for (bool page4 : {false, true}) cases.push_back({4096, 6, 1, ctx, true, page4, 512});
  // Below the route's 4096 rows: the simple kernel (the route's choice) beside the page-4 kernel.
  for (int64_t rows : {int64_t(64), int64_t(256), int64_t(511)})
    for (bool page4 : {false, true}) cases.push_back({rows, 6, 1, 8192, true, page4, 512});
  // rows/cta 8 and 9: 512 / 456 groups instead of the default 10 rows' 410 (3.1 waves on 132 SMs).
  for (int32_t rpc : {1, 2, 5, 8, 9})
    for (int32_t ov : {0, 90}) cases.push_back({4096, 6, 1, 8192, true, true, 512, ov, rpc});
  for (int64_t rows : {int64_t(4096), int64_t(16384)}) cases.push_back({rows, 16, 2, 8192, false, true});
  // Selections at their top-k width (K = blocks): both kernels and the default route.
  for (int32_t blocks : {16, 32, 64, 128, 192, 256, 384})
    for (int mode = 0; mode < 3; ++mode)
      cases.push_back({4096, 6, 1, 8192, true, mode == 1, blocks, 0, 0, mode == 2, blocks});
  for (int32_t blocks : {16, 128}) cases.push_back({4096, 6, 1, 131072, true, false, blocks, 0, 0, true, blocks});
  for (const Case& k : cases) {
    BenchCase c;
    c.op = "qsa";
    c.label = std::string(k.page4 ? "qsa page4" : k.route ? "qsa route" : "qsa") + " R=" + human_count(k.rows) + " Hq=" + std::to_string(k.hq) +
              " Hkv=" + std::to_string(k.hkv) + " D=256 " + std::to_string(k.blocks) + " blocks ctx=" +
              human_count(k.context) + " page=16 fp16" + (k.interleaved ? " interleaved" : "") +
              (k.overlap > 0 ? " overlap=" + std::to_string(k.overlap) + "%" : "") +
              (k.rows_per_cta > 0 ? " rows/cta=" + std::to_string(k.rows_per_cta) : "") +
              (k.max_blocks != kQsaMaxBlocks ? " K=" + std::to_string(k.max_blocks) : "");
    c.quick = !k.page4 && k.blocks == 512 && (k.rows == 64 || (k.rows == 4096 && k.hq == 6 && k.context == 8192));
    c.graph = k.rows <= 64;
    c.make = [k](uint64_t seed) -> std::unique_ptr<Workload> {
      QsaShape s;
      s.rows = k.rows;
      s.q_heads = k.hq;
      s.kv_heads = k.hkv;
      s.context = k.context;
      s.interleaved = k.interleaved;
      s.page4 = k.page4;
      s.blocks = k.blocks;
      s.overlap = k.overlap;
      s.rows_per_cta = k.rows_per_cta;
      s.route = k.route;
      s.max_blocks = k.max_blocks;
      s.force_simple = !k.page4 && !k.route;  // the other cases time the simple kernel
      s.seed = seed ^ 0x95a;
      return std::make_unique<QsaWorkload>(s);
    };
    case_registry().push_back(std::move(c));
  }
}

}  // namespace selkv::bench
