// C3 gather + upconvert: paged FP8 records of several requests (non-page-aligned starts) ->
// dense bf16 rows at given workspace offsets.
// Bytes per token (ds_mla_fp8): 656 read + 1152 written.
#include <algorithm>
#include <array>
#include <cstring>

#include "cache_common.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"

namespace selkv::bench {
namespace {

constexpr uint8_t kPoison = 0xff;
constexpr int64_t kTailRows = 16;  // output rows past out_rows that must stay untouched

struct GatherShape {
  int64_t total = 32768;
  int32_t reqs = 8;
  int32_t page = 64;
  KvFormat format = KvFormat::kDsMlaFp8;
  uint64_t seed = 3;
  int64_t sample = 4096;
};

// Requests get random shares of `total`; each starts at a random position that is not a page
// boundary; blocks are spread randomly over the cache; workspace rows are packed in order.
struct GatherInputs {
  GatherShape s;
  int32_t max_blocks = 0;
  int64_t bt_stride = 0, num_blocks = 0, block_stride = 0;
  std::vector<int32_t> block_table, starts, lens, ws;
  std::vector<uint8_t> cache;

  explicit GatherInputs(const GatherShape& shape) : s(shape) {
    Rng rng(s.seed);
    std::vector<double> w(size_t(s.reqs));
    double wsum = 0;
    for (auto& x : w) wsum += (x = 1.0 + 2.0 * rng.uniform());
    lens.resize(size_t(s.reqs));
    int64_t assigned = 0;
    for (int32_t r = 0; r < s.reqs; ++r) {
      int64_t n = r + 1 == s.reqs ? s.total - assigned : int64_t(double(s.total) * w[size_t(r)] / wsum);
      n = std::clamp<int64_t>(n, 0, s.total - assigned);
      lens[size_t(r)] = int32_t(n);
      assigned += n;
    }
    starts.resize(size_t(s.reqs));
    ws.resize(size_t(s.reqs));
    int64_t total_blocks = 0, row = 0;
    for (int32_t r = 0; r < s.reqs; ++r) {
      int64_t st = rng.range(1, 4 * int64_t(s.page));
      if (s.page > 1 && st % s.page == 0) st += 1;
      starts[size_t(r)] = int32_t(st);
      ws[size_t(r)] = int32_t(row);
      row += lens[size_t(r)];
      const int64_t nb = (st + lens[size_t(r)] + s.page - 1) / s.page;
      max_blocks = std::max<int32_t>(max_blocks, int32_t(nb));
      total_blocks += nb;
    }
    bt_stride = max_blocks + 2;
    num_blocks = total_blocks + 8;
    block_stride = fmt::page_bytes(s.format, s.page);
    const std::vector<int32_t> perm = permutation(int32_t(num_blocks), rng);
    block_table.assign(size_t(s.reqs * bt_stride), -1);
    size_t next = 0;
    for (int32_t r = 0; r < s.reqs; ++r) {
      const int64_t nb = (starts[size_t(r)] + lens[size_t(r)] + s.page - 1) / s.page;
      for (int64_t b = 0; b < nb; ++b) block_table[size_t(r * bt_stride + b)] = perm[next++];
    }
    cache.resize(size_t(num_blocks * block_stride));
    fill_random_cache(cache.data(), num_blocks, s.page, block_stride, s.format, rng);
  }

  int dim() const { return fmt::dequant_dim(s.format); }
  GatherKvParams params(const void* c, const int32_t* bt, const int32_t* st, const int32_t* ln,
                        const int32_t* w, int32_t nreq, void* out, int64_t out_rows) const {
    GatherKvParams p;
    p.cache = c;
    p.num_blocks = num_blocks;
    p.page_size = s.page;
    p.block_stride_bytes = block_stride;
    p.format = s.format;
    p.block_table = bt;
    p.block_table_row_stride = bt_stride;
    p.max_blocks_per_req = max_blocks;
    p.seq_starts = st;
    p.seq_lens = ln;
    p.ws_starts = w;
    p.num_reqs = nreq;
    p.out = out;
    p.out_row_stride = dim();
    p.out_rows = out_rows;
    return p;
  }
  std::string shape_str() const {
    return "N=" + human_count(s.total) + " reqs=" + std::to_string(s.reqs) + " page=" + std::to_string(s.page) +
           " " + format_name(s.format);
  }
  double bytes() const { return double(s.total) * (fmt::record_bytes(s.format) + 2.0 * dim()); }

  // Windows of rows [off, off+n) per request to compare: head, tail, one random window, or
  // everything when the total is within the sample budget.
  std::vector<std::array<int64_t, 3>> windows(Rng& rng) const {
    std::vector<std::array<int64_t, 3>> v;
    for (int32_t r = 0; r < s.reqs; ++r) {
      const int64_t len = lens[size_t(r)];
      if (len == 0) continue;
      if (s.total <= s.sample) {
        v.push_back({r, 0, len});
        continue;
      }
      const int64_t n = std::min<int64_t>(len, 80);
      v.push_back({r, 0, n});
      v.push_back({r, len - n, n});
      const int64_t m = std::min<int64_t>(len, 64);
      v.push_back({r, rng.range(0, len - m), m});
    }
    return v;
  }
};

class GatherWorkload final : public Workload {
 public:
  explicit GatherWorkload(const GatherShape& s)
      : in_(s),
        cache_(DeviceBuffer::from(in_.cache)),
        bt_(DeviceBuffer::from(in_.block_table)),
        starts_(DeviceBuffer::from(in_.starts)),
        lens_(DeviceBuffer::from(in_.lens)),
        ws_(DeviceBuffer::from(in_.ws)),
        out_(size_t(s.total + kTailRows) * in_.dim() * 2) {}

  std::string shape() const override { return in_.shape_str(); }
  std::string variant() const override { return "bf16"; }
  double bytes() const override { return in_.bytes(); }
  void run(cudaStream_t stream) override {
    throw_if_error(gather_kv_bf16(in_.params(cache_.get(), bt_.as<int32_t>(), starts_.as<int32_t>(),
                                             lens_.as<int32_t>(), ws_.as<int32_t>(), in_.s.reqs, out_.get(),
                                             in_.s.total),
                                  stream));
  }
  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(kPoison, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> got = out_.download<uint16_t>();
    const int dim = in_.dim();
    Rng rng(in_.s.seed ^ 0xc4ec);
    std::vector<uint16_t> want;
    int64_t rows = 0;
    for (const auto& [r, off, n] : in_.windows(rng)) {
      const int32_t st = in_.starts[size_t(r)] + int32_t(off), ln = int32_t(n), zero = 0;
      want.assign(size_t(n * dim), 0);
      const Status status = ref::gather_kv_bf16(in_.params(in_.cache.data(), &in_.block_table[size_t(r * in_.bt_stride)],
                                                           &st, &ln, &zero, 1, want.data(), n));
      if (!status.ok()) return CheckResult::fail("oracle: " + status.to_string());
      const int64_t row0 = in_.ws[size_t(r)] + off;
      for (int64_t i = 0; i < n * dim; ++i) {
        if (got[size_t(row0 * dim + i)] != want[size_t(i)]) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "req %d row %lld col %lld: got 0x%04x want 0x%04x", int(r),
                        (long long)(off + i / dim), (long long)(i % dim), got[size_t(row0 * dim + i)], want[size_t(i)]);
          return CheckResult::fail(buf);
        }
      }
      rows += n;
    }
    for (int64_t i = in_.s.total * dim; i < int64_t(got.size()); ++i)
      if (got[size_t(i)] != 0xffff) return CheckResult::fail("an output row past out_rows was written");
    return CheckResult::pass("bit-exact, " + std::to_string(rows) + " rows");
  }

 private:
  GatherInputs in_;
  DeviceBuffer cache_, bt_, starts_, lens_, ws_, out_;
};

GatherShape shape_from(const Params& p, int64_t default_total) {
  GatherShape s;
  s.total = checked_positive("tokens", p.get_int("tokens", default_total));
  s.reqs = int32_t(checked_positive("reqs", p.get_int("reqs", 8)));
  s.page = checked_page_size(p.get_int("page-size", 64));
  s.format = parse_format(p.get_str("format", "ds_mla_fp8"));
  s.seed = p.seed() ^ 0x3003;
  s.sample = p.sample();
  return s;
}

// No GPU: the oracle gathers everything; each row is compared with decode_record of the record
// its position maps to through the block table.
CpuReport cpu_demo(const Params& p) {
  const GatherInputs in(shape_from(p, 1024));
  const int dim = in.dim();
  std::vector<uint16_t> out(size_t(in.s.total * dim), 0xffff);
  Stopwatch sw;
  const Status st = ref::gather_kv_bf16(in.params(in.cache.data(), in.block_table.data(), in.starts.data(),
                                                  in.lens.data(), in.ws.data(), in.s.reqs, out.data(), in.s.total));
  CpuReport r;
  r.seconds = sw.seconds();
  r.shape = in.shape_str();
  r.bytes = in.bytes();
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  std::vector<uint16_t> want(static_cast<size_t>(dim));
  for (int32_t q = 0; q < in.s.reqs; ++q) {
    for (int64_t i = 0; i < in.lens[size_t(q)]; ++i) {
      const int64_t pos = in.starts[size_t(q)] + i;
      const int64_t blk = in.block_table[size_t(q * in.bt_stride + pos / in.s.page)];
      ref::decode_token(&in.cache[size_t(blk * in.block_stride)], in.s.format, in.s.page, pos % in.s.page, want.data());
      if (std::memcmp(want.data(), &out[size_t((in.ws[size_t(q)] + i) * dim)], size_t(dim) * 2) != 0) {
        r.check = CheckResult::fail("req " + std::to_string(q) + " row " + std::to_string(i) +
                                    " differs from decode_record");
        return r;
      }
    }
  }
  r.check = CheckResult::pass("self-consistent, " + std::to_string(in.s.total) + " rows");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_gather) {
  OpSpec op;
  op.key = "gather";
  op.api = "selkv::gather_kv_bf16";
  op.summary = "C3 gather + upconvert: paged FP8 -> dense bf16 for a prefill chunk (default 32K tokens)";
  op.order = 30;
  op.params = {{"tokens", "total tokens gathered (gather: 32768)"},
               {"reqs", "requests in the chunk (8)"},
               {"page-size", "tokens per cache page (64)"},
               {"format", "ds_mla_fp8 | nope_fp8 | model1_fp8 (ds_mla_fp8)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<GatherWorkload>(shape_from(p, 32768));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  auto add = [](int64_t total, KvFormat f, bool quick) {
    BenchCase c;
    c.op = "gather";
    c.label = "N=" + human_count(total) + " " + format_name(f);
    c.quick = quick;
    c.make = [=](uint64_t seed) -> std::unique_ptr<Workload> {
      GatherShape s;
      s.total = total;
      s.format = f;
      s.seed = seed ^ 0x3003;
      return std::make_unique<GatherWorkload>(s);
    };
    case_registry().push_back(std::move(c));
  };
  add(8192, KvFormat::kDsMlaFp8, false);
  add(32768, KvFormat::kDsMlaFp8, true);
  add(32768, KvFormat::kModel1Fp8, false);
  add(131072, KvFormat::kDsMlaFp8, false);
  add(32768, KvFormat::kNopeFp8, false);
}

}  // namespace selkv::bench
