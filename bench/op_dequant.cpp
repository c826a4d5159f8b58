// C4 selected-row dequant (selkv::dequant_selected_kv): paged FP8 cache + physical top-k indices
// [T, K] -> bf16 workspace rows + remapped indices (seed 003).
//
// Cases (DESIGN §6, docs/prefill-design.md §1): T=64, K=2048, P=1M (N < P: selected path) and
// T=4096, K=2048, P=128K (N >= P: full pool), both formats, page 64, every index valid (uniform
// over the pool, duplicates allowed). Bytes = records read + bf16 rows written + indices read and
// written: min(N, P) * (record + 2 * D) + N * 8. % ceiling = that over the measured copy bandwidth.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cache_common.h"
#include "fp8_pool.h"
#include "reference/oracle.h"
#include "selkv/dequant.h"

namespace selkv::bench {
namespace {

struct DequantShape {
  int64_t T = 4096;
  int32_t K = 2048;
  int64_t P = 1 << 17;
  int32_t page = 64;
  KvFormat format = KvFormat::kDsMlaFp8;
  uint64_t seed = 4;
  int64_t sample = 4096;

  int64_t rows() const { return dequant_selected_workspace_rows(T, K, P); }
  bool selected() const { return dequant_selected_mode(T, K, P) == DequantMode::kSelected; }
  std::string str() const {
    return "T=" + human_count(T) + " K=" + human_count(K) + " P=" + human_count(P) + " page=" + std::to_string(page) +
           " " + format_name(format);
  }
  double bytes() const {
    return double(rows()) * (fmt::record_bytes(format) + 2.0 * fmt::dequant_dim(format)) + double(T) * K * 8.0;
  }
};

class DequantWorkload final : public Workload {
 public:
  explicit DequantWorkload(const DequantShape& s)
      : s_(s), pool_(s.format, s.P, s.page, false, s.seed ^ 0xd0) {
    s_.P = pool_.num_slots();
    Rng rng(s_.seed);
    idx_.resize(size_t(s_.T) * s_.K);
    for (auto& v : idx_) v = int32_t(rng.range(0, s_.P - 1));
    idx_dev_ = DeviceBuffer::from(idx_);
    out_idx_ = DeviceBuffer(std::max<size_t>(idx_.size() * 4, 16));
    ws_ = DeviceBuffer(std::max<size_t>(size_t(s_.rows()) * fmt::dequant_dim(s_.format) * 2, 16));
    p_.cache = pool_.view();
    p_.indices = idx_dev_.as<int32_t>();
    p_.indices_row_stride = s_.K;
    p_.num_tokens = s_.T;
    p_.topk = s_.K;
    p_.workspace = ws_.get();
    p_.workspace_rows = s_.rows();
    p_.workspace_row_stride = fmt::dequant_dim(s_.format);
    p_.out_indices = out_idx_.as<int32_t>();
    p_.out_indices_row_stride = s_.K;
  }

  std::string shape() const override { return s_.str(); }
  std::string variant() const override { return s_.selected() ? "selected" : "full pool"; }
  double bytes() const override { return s_.bytes(); }
  void run(cudaStream_t stream) override { throw_if_error(dequant_selected_kv(p_, stream)); }

  CheckResult check(cudaStream_t stream) override {
    ws_.fill_async(0xff, stream);
    out_idx_.fill_async(0x77, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const std::vector<int32_t> got = out_idx_.download<int32_t>();
    const int64_t N = s_.T * s_.K;
    for (int64_t e = 0; e < N; ++e) {  // every remapped index (all entries are valid here)
      const int32_t want = s_.selected() ? int32_t(e) : idx_[size_t(e)];
      if (got[size_t(e)] != want)
        return CheckResult::fail("out_indices[" + std::to_string(e) + "] = " + std::to_string(got[size_t(e)]) +
                                 ", want " + std::to_string(want));
    }
    // A sample of workspace rows, bit for bit against decode_record of the source record.
    const int D = fmt::dequant_dim(s_.format);
    Rng rng(s_.seed ^ 0xc4);
    std::vector<uint16_t> want(static_cast<size_t>(D)), row(static_cast<size_t>(D));
    const int64_t n = std::min<int64_t>(s_.sample, s_.rows());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = i < 2 ? (i == 0 ? 0 : s_.rows() - 1) : rng.range(0, s_.rows() - 1);
      const int64_t slot = s_.selected() ? idx_[size_t(r)] : r;
      pool_.decode(slot, want.data());
      SELKV_BENCH_CUDA(cudaMemcpy(row.data(), ws_.as<uint16_t>() + r * D, size_t(D) * 2, cudaMemcpyDeviceToHost));
      if (std::memcmp(row.data(), want.data(), size_t(D) * 2) != 0)
        return CheckResult::fail("workspace row " + std::to_string(r) + " (slot " + std::to_string(slot) +
                                 ") differs from decode_record");
    }
    return CheckResult::pass("bit-exact: all " + std::to_string(N) + " remapped indices, " + std::to_string(n) +
                             " workspace rows");
  }

 private:
  DequantShape s_;
  Fp8Pool pool_;
  std::vector<int32_t> idx_;
  DeviceBuffer idx_dev_, out_idx_, ws_;
  DequantSelectedParams p_;
};

DequantShape shape_from(const Params& p, bool cpu) {
  DequantShape s;
  s.T = checked_positive("tokens", p.get_int("tokens", cpu ? 8 : 4096));
  s.K = int32_t(checked_positive("topk", p.get_int("topk", cpu ? 256 : 2048)));
  s.P = checked_positive("pool", p.get_int("pool", cpu ? 4096 : 131072));
  s.page = checked_page_size(p.get_int("page-size", 64));
  s.format = parse_format(p.get_str("format", "ds_mla_fp8"));
  s.seed = p.seed() ^ 0x4004;
  s.sample = p.sample();
  return s;
}

// No GPU: the oracle in both modes on a small pool, self-checked against decode_record.
CpuReport cpu_demo(const Params& prm) {
  DequantShape s = shape_from(prm, true);
  CpuReport r;
  r.shape = s.str() + " (selected) + full pool";
  Rng rng(s.seed);
  const int rec = fmt::record_bytes(s.format), D = fmt::dequant_dim(s.format);
  double secs = 0, bytes = 0;
  for (int64_t P : {s.P, std::max<int64_t>(s.page, s.T * s.K / 4)}) {  // selected, then full pool
    const int64_t blocks = (P + s.page - 1) / s.page;
    const PagedKvCache view{nullptr, blocks, s.page, fmt::page_bytes(s.format, s.page), s.format};
    std::vector<uint8_t> cache(size_t(blocks * view.block_stride_bytes));
    fill_random_cache(cache.data(), blocks, s.page, view.block_stride_bytes, s.format, rng);
    std::vector<int32_t> idx(size_t(s.T) * s.K), out(idx.size());
    for (auto& v : idx) v = rng.range(0, 9) == 0 ? -1 : int32_t(rng.range(0, view.num_slots() - 1));
    const int64_t rows = dequant_selected_workspace_rows(s.T, s.K, view.num_slots());
    std::vector<uint16_t> ws(size_t(rows) * D);
    DequantSelectedParams p;
    p.cache = view;
    p.cache.data = cache.data();
    p.indices = idx.data();
    p.indices_row_stride = s.K;
    p.num_tokens = s.T;
    p.topk = s.K;
    p.workspace = ws.data();
    p.workspace_rows = rows;
    p.workspace_row_stride = D;
    p.out_indices = out.data();
    p.out_indices_row_stride = s.K;
    Stopwatch sw;
    const Status st = ref::dequant_selected(p);
    secs += sw.seconds();
    bytes += double(rows) * (rec + 2.0 * D) + double(idx.size()) * 8;
    if (!st.ok()) {
      r.check = CheckResult::fail(st.to_string());
      return r;
    }
    std::vector<uint16_t> want(static_cast<size_t>(D));
    for (size_t e = 0; e < idx.size(); ++e) {
      if (idx[e] < 0) {
        if (out[e] != -1) { r.check = CheckResult::fail("invalid entry not remapped to -1"); return r; }
        continue;
      }
      const int64_t row = out[e];
      PagedKvCache host = view;
      host.data = cache.data();
      ref::decode_slot(host, idx[e], want.data());
      if (row < 0 || row >= rows || std::memcmp(&ws[size_t(row) * D], want.data(), size_t(D) * 2) != 0) {
        r.check = CheckResult::fail("entry " + std::to_string(e) + ": workspace row differs from decode_record");
        return r;
      }
    }
  }
  r.seconds = secs;
  r.bytes = bytes;
  r.check = CheckResult::pass("both modes: every valid entry's row == decode_record, invalid -> -1");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_dequant) {
  OpSpec op;
  op.key = "dequant";
  op.api = "selkv::dequant_selected_kv";
  op.summary = "C4 selected-row dequant: FP8 pool + top-k slots -> bf16 workspace + remapped indices (default "
               "T=4096 K=2048 P=128K, full pool)";
  op.order = 50;
  op.params = {{"tokens", "query tokens T (dequant: 4096)"},
               {"topk", "index entries per token K (2048)"},
               {"pool", "physical slots P (131072); T*K < P takes the selected path"},
               {"page-size", "tokens per cache page (64)"},
               {"format", "ds_mla_fp8 | nope_fp8 | model1_fp8 (ds_mla_fp8)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<DequantWorkload>(shape_from(p, false));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  auto add = [](int64_t T, int32_t K, int64_t P, KvFormat f, bool quick) {
    BenchCase c;
    c.op = "dequant";
    DequantShape s;
    s.T = T;
    s.K = K;
    s.P = P;
    s.format = f;
    c.label = s.str() + (s.selected() ? " selected" : " full pool");
    c.quick = quick;
    c.make = [s](uint64_t seed) -> std::unique_ptr<Workload> {
      DequantShape t = s;
      t.seed = seed ^ 0x4004;
      return std::make_unique<DequantWorkload>(t);
    };
    case_registry().push_back(std::move(c));
  };
  // Seed 003 shapes.
  add(64, 2048, 1 << 20, KvFormat::kDsMlaFp8, true);     // selected: N = 128K < P = 1M
  add(4096, 2048, 1 << 17, KvFormat::kDsMlaFp8, true);   // full pool: N = 8M >= P = 128K
  add(64, 2048, 1 << 20, KvFormat::kNopeFp8, false);
  add(4096, 2048, 1 << 17, KvFormat::kNopeFp8, false);
  add(64, 2048, 1 << 20, KvFormat::kModel1Fp8, false);
  add(4096, 2048, 1 << 17, KvFormat::kModel1Fp8, false);
}

}  // namespace selkv::bench
