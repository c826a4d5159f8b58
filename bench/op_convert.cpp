// C2 index conversion: request-local top-k positions -> physical slots through the block table.
// Bytes: indices read + slots written (+ valid counts when requested).
#include <algorithm>
#include <climits>
#include <cstring>

#include "cache_common.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"

namespace selkv::bench {
namespace {

constexpr int32_t kPoison = 0x7b7b7b7b;
constexpr int64_t kReqIdTail = 64;  // req_id_per_token is longer than the rows converted

struct ConvertShape {
  int64_t rows = 4096;
  int32_t topk = 2048;
  int32_t page = 64;
  int32_t reqs = 8;
  bool counts = false, compact = false;
  uint64_t seed = 2;
  int64_t sample = 4096;
};

// Requests with contexts of topk/2 .. 8*topk tokens on randomly placed blocks; rows are split
// into contiguous per-request runs (as prefill tokens are). Each row holds a random number of
// valid positions followed by -1, with ~1% garbage sprinkled in (INT_MAX, INT_MIN, negatives,
// positions past the block table); ~0.5% of block-table entries are invalid block ids; the
// req_id vector has a garbage tail past `rows`, and a few rows are padding (req id -1).
struct ConvertInputs {
  ConvertShape s;
  int32_t max_blocks = 0;
  int64_t bt_stride = 0, num_blocks = 0;
  std::vector<int32_t> indices, req_id, block_table;

  explicit ConvertInputs(const ConvertShape& shape) : s(shape) {
    Rng rng(s.seed);
    std::vector<int64_t> ctx(size_t(s.reqs));
    int64_t total_blocks = 0;
    for (auto& c : ctx) {
      c = rng.range(std::max<int64_t>(1, s.topk / 2), 8 * int64_t(s.topk));
      const int64_t nb = (c + s.page - 1) / s.page;
      max_blocks = std::max<int32_t>(max_blocks, int32_t(nb));
      total_blocks += nb;
    }
    bt_stride = max_blocks + 3;
    num_blocks = total_blocks + 16;
    const std::vector<int32_t> perm = permutation(int32_t(num_blocks), rng);
    block_table.assign(size_t(s.reqs * bt_stride), -1);
    size_t next = 0;
    for (int32_t r = 0; r < s.reqs; ++r) {
      const int64_t nb = (ctx[size_t(r)] + s.page - 1) / s.page;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t id = perm[next++];
        if (rng.range(0, 199) == 0) id = rng.range(0, 1) ? -2 : int32_t(num_blocks + rng.range(0, 99));
        block_table[size_t(r * bt_stride + b)] = id;
      }
    }
    req_id.resize(size_t(s.rows + kReqIdTail));
    for (int64_t t = 0; t < s.rows; ++t) {
      req_id[size_t(t)] = rng.range(0, 511) == 0 ? -1 : int32_t(t * s.reqs / s.rows);
    }
    for (int64_t t = s.rows; t < s.rows + kReqIdTail; ++t)
      req_id[size_t(t)] = int32_t(rng.range(0, 1) ? s.reqs + 1000 : -3);

    indices.assign(size_t(s.rows * s.topk), -1);
    for (int64_t t = 0; t < s.rows; ++t) {
      const int64_t L = ctx[size_t(std::min<int64_t>(t * s.reqs / s.rows, s.reqs - 1))];
      const int64_t cap = std::min<int64_t>(s.topk, L);
      const int64_t nvalid = rng.range(std::max<int64_t>(1, cap / 2), cap);
      int32_t* row = &indices[size_t(t * s.topk)];
      for (int64_t k = 0; k < nvalid; ++k) row[k] = int32_t(rng.range(0, L - 1));
      for (int64_t k = 0; k < s.topk; ++k) {
        if (rng.range(0, 99) != 0) continue;
        switch (rng.range(0, 3)) {
          case 0: row[k] = INT_MAX; break;
          case 1: row[k] = INT_MIN; break;
          case 2: row[k] = -int32_t(rng.range(2, 1000)); break;
          default: row[k] = int32_t(int64_t(max_blocks) * s.page + rng.range(0, 1000)); break;
        }
      }
    }
  }

  ConvertIndicesParams params(const int32_t* idx, const int32_t* rid, const int32_t* bt, int64_t rows,
                              int32_t* out, int32_t* counts) const {
    ConvertIndicesParams p;
    p.req_local_indices = idx;
    p.indices_row_stride = s.topk;
    p.req_id_per_token = rid;
    p.block_table = bt;
    p.block_table_row_stride = bt_stride;
    p.num_reqs = s.reqs;
    p.max_blocks_per_req = max_blocks;
    p.num_tokens = rows;
    p.topk = s.topk;
    p.page_size = s.page;
    p.num_blocks = num_blocks;
    p.out_slots = out;
    p.out_row_stride = s.topk;
    p.valid_counts = s.counts ? counts : nullptr;
    p.compact = s.compact;
    return p;
  }
  std::string shape_str() const {
    return "T=" + std::to_string(s.rows) + " K=" + std::to_string(s.topk) + " page=" +
           std::to_string(s.page) + " reqs=" + std::to_string(s.reqs);
  }
  std::string variant() const {
    return s.compact ? (s.counts ? "counts+compact" : "compact") : (s.counts ? "counts" : "plain");
  }
  double bytes() const { return double(s.rows) * s.topk * 8.0 + (s.counts ? 4.0 * s.rows : 0.0); }
};

// Oracle on one row (pointers offset to row t).
Status oracle_row(const ConvertInputs& in, int64_t t, int32_t* out, int32_t* count) {
  return ref::convert_req_indices_to_slots(in.params(&in.indices[size_t(t * in.s.topk)], &in.req_id[size_t(t)],
                                                     in.block_table.data(), 1, out, count));
}

class ConvertWorkload final : public Workload {
 public:
  explicit ConvertWorkload(const ConvertShape& s)
      : in_(s),
        idx_(DeviceBuffer::from(in_.indices)),
        rid_(DeviceBuffer::from(in_.req_id)),
        bt_(DeviceBuffer::from(in_.block_table)),
        out_(size_t(s.rows) * s.topk * 4),
        counts_(size_t(s.rows) * 4) {}

  std::string shape() const override { return in_.shape_str(); }
  std::string variant() const override { return in_.variant(); }
  double bytes() const override { return in_.bytes(); }
  void run(cudaStream_t stream) override {
    throw_if_error(convert_req_indices_to_slots(
        in_.params(idx_.as<int32_t>(), rid_.as<int32_t>(), bt_.as<int32_t>(), in_.s.rows, out_.as<int32_t>(),
                   counts_.as<int32_t>()),
        stream));
  }
  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(0x7b, stream);
    counts_.fill_async(0x7b, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const std::vector<int32_t> got = out_.download<int32_t>();
    const std::vector<int32_t> got_counts = counts_.download<int32_t>();
    Rng rng(in_.s.seed ^ 0xc4ec);
    std::vector<int64_t> rows;
    if (in_.s.rows <= in_.s.sample) {
      for (int64_t t = 0; t < in_.s.rows; ++t) rows.push_back(t);
    } else {
      rows = sample_distinct(in_.s.rows, in_.s.sample, rng);
    }
    const int K = in_.s.topk;
    std::vector<int32_t> want(static_cast<size_t>(K));
    int64_t checked = 0;
    for (int64_t t : rows) {
      int32_t want_count = kPoison;
      const Status st = oracle_row(in_, t, want.data(), &want_count);
      if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
      for (int k = 0; k < K; ++k) {
        const int32_t g = got[size_t(t * K + k)];
        if (g != want[size_t(k)])
          return CheckResult::fail("row " + std::to_string(t) + " k " + std::to_string(k) + ": got " +
                                   std::to_string(g) + " want " + std::to_string(want[size_t(k)]) +
                                   " (index " + std::to_string(in_.indices[size_t(t * K + k)]) + ")");
      }
      if (in_.s.counts && got_counts[size_t(t)] != want_count)
        return CheckResult::fail("row " + std::to_string(t) + " valid count: got " +
                                 std::to_string(got_counts[size_t(t)]) + " want " + std::to_string(want_count));
      ++checked;
    }
    return CheckResult::pass("bit-exact, " + std::to_string(checked) + " rows");
  }

 private:
  ConvertInputs in_;
  DeviceBuffer idx_, rid_, bt_, out_, counts_;
};

ConvertShape shape_from(const Params& p, int64_t default_rows, int32_t default_topk) {
  ConvertShape s;
  s.rows = checked_positive("tokens", p.get_int("tokens", default_rows));
  s.topk = int32_t(checked_positive("topk", p.get_int("topk", default_topk)));
  s.page = checked_page_size(p.get_int("page-size", 64));
  s.reqs = int32_t(checked_positive("reqs", p.get_int("reqs", 8)));
  const std::string mode = p.get_str("convert-mode", "compact");
  if (mode == "plain") {
  } else if (mode == "counts") {
    s.counts = true;
  } else if (mode == "compact") {
    s.counts = s.compact = true;
  } else {
    throw std::invalid_argument("--convert-mode: expected plain, counts or compact, got '" + mode + "'");
  }
  s.seed = p.seed() ^ 0x2002;
  s.sample = p.sample();
  return s;
}

// No GPU: the oracle converts every row; the check recomputes each entry with the textbook
// formula written out here independently.
CpuReport cpu_demo(const Params& p) {
  const ConvertInputs in(shape_from(p, 64, 256));
  const auto& s = in.s;
  std::vector<int32_t> out(size_t(s.rows * s.topk), kPoison), counts(size_t(s.rows), kPoison);
  Stopwatch sw;
  const Status st = ref::convert_req_indices_to_slots(
      in.params(in.indices.data(), in.req_id.data(), in.block_table.data(), s.rows, out.data(), counts.data()));
  CpuReport r;
  r.seconds = sw.seconds();
  r.shape = in.shape_str() + " " + in.variant();
  r.bytes = in.bytes();
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  std::vector<int32_t> want;
  for (int64_t t = 0; t < s.rows; ++t) {
    want.clear();
    const int32_t req = in.req_id[size_t(t)];
    for (int k = 0; k < s.topk; ++k) {
      const int64_t pos = in.indices[size_t(t * s.topk + k)];
      int32_t slot = -1;
      if (req >= 0 && req < s.reqs && pos >= 0 && pos / s.page < in.max_blocks) {
        const int64_t blk = in.block_table[size_t(req * in.bt_stride + pos / s.page)];
        if (blk >= 0 && blk < in.num_blocks) slot = int32_t(blk * s.page + pos % s.page);
      }
      if (!s.compact || slot >= 0) want.push_back(slot);
    }
    const int32_t n_valid = int32_t(std::count_if(want.begin(), want.end(), [](int32_t v) { return v >= 0; }));
    want.resize(size_t(s.topk), -1);
    if (std::memcmp(want.data(), &out[size_t(t * s.topk)], size_t(s.topk) * 4) != 0 ||
        (s.counts && counts[size_t(t)] != n_valid)) {
      r.check = CheckResult::fail("row " + std::to_string(t) + " differs from the direct formula");
      return r;
    }
  }
  r.check = CheckResult::pass("self-consistent, " + std::to_string(s.rows) + " rows");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_convert) {
  OpSpec op;
  op.key = "convert";
  op.api = "selkv::convert_req_indices_to_slots";
  op.summary = "C2 index conversion: request-local top-k -> physical slots (default T=4096, K=2048)";
  op.order = 20;
  op.params = {{"tokens", "rows to convert (convert: 4096)"},
               {"topk", "top-k entries per row (2048)"},
               {"reqs", "requests in the batch (8)"},
               {"convert-mode", "plain | counts | compact (compact = counts + compaction)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<ConvertWorkload>(shape_from(p, 4096, 2048));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  auto add = [](int64_t rows, int32_t topk, bool counts, bool compact, bool quick, bool graph) {
    BenchCase c;
    c.op = "convert";
    c.label = "T=" + std::to_string(rows) + " K=" + std::to_string(topk) +
              (compact ? " counts+compact" : counts ? " counts" : " plain");
    c.quick = quick;
    c.graph = graph;
    c.make = [=](uint64_t seed) -> std::unique_ptr<Workload> {
      ConvertShape s;
      s.rows = rows;
      s.topk = topk;
      s.counts = counts;
      s.compact = compact;
      s.seed = seed ^ 0x2002;
      return std::make_unique<ConvertWorkload>(s);
    };
    case_registry().push_back(std::move(c));
  };
  add(4096, 2048, false, false, true, false);
  add(4096, 2048, true, false, false, false);
  add(4096, 2048, true, true, true, false);
  add(64, 2048, true, true, true, true);  // a decode batch, graph replay
}

}  // namespace selkv::bench
