// C6 pack (selkv::pack_selected_kv): the selected 656-byte records of a paged ds_mla_fp8 cache
// -> the packed KV buffer (include/selkv/packed.h), seed 000's decode shapes.
//
// Workload: batch entry b owns the physical slots [b * s_kv, (b + 1) * s_kv) (request-disjoint
// KV ranges, dense pages of 64); each query row selects K distinct slots of its own range in
// random order, every entry valid. Bytes = 2 * rows * K * 656 (records read + written; the
// indices and validity words, < 0.7 %, are left out).
//
// The floor: each shape also runs a cudaMemcpyAsync device-to-device copy of rows * K * 656 bytes
// as its own case, timed by the same harness (L2 flushed, same repetitions), keyed
// "pack-copy/<shape>"; the pack case reports its time relative to it (AnchorInfo::rel_key,
// target <= 1.15x).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "anchor.h"
#include "cache_common.h"
#include "fp8_pool.h"
#include "reference/oracle.h"
#include "selkv/packed.h"

namespace selkv::bench {
namespace {

constexpr double kCopyTarget = 1.15;  // pack time / copy time of the same bytes

struct PackShape {
  int32_t B = 4, S = 2, K = 2048;
  int64_t s_kv = 8192;
  int32_t page = 64;
  uint64_t seed = 6;
  int64_t sample = 4096;

  int64_t rows() const { return int64_t(B) * S; }
  int64_t entries() const { return rows() * K; }
  size_t record_bytes() const { return size_t(entries()) * fmt::kDsMlaRecordBytes; }
  std::string str() const {
    return "B=" + std::to_string(B) + " S_q=" + std::to_string(S) + " K=" + human_count(K) +
           " s_kv=" + human_count(s_kv) + " page=" + std::to_string(page);
  }
  std::string copy_key() const { return "pack-copy/" + str(); }
};

// Row r = b * S + s: K distinct slots of batch entry b's range, random order.
std::vector<int32_t> make_indices(const PackShape& s, Rng& rng) {
  std::vector<int32_t> idx(size_t(s.entries()));
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t base = (r / s.S) * s.s_kv;
    const auto pick = sample_distinct(s.s_kv, s.K, rng);
    for (int k = 0; k < s.K; ++k) idx[size_t(r * s.K + k)] = int32_t(base + pick[size_t(k)]);
  }
  return idx;
}

class PackWorkload final : public Workload, public Anchored {
 public:
  explicit PackWorkload(const PackShape& s)
      : s_(s), pool_(KvFormat::kDsMlaFp8, int64_t(s.B) * s.s_kv, s.page, false, s.seed ^ 0xc6) {
    Rng rng(s_.seed);
    idx_ = make_indices(s_, rng);
    idx_dev_ = DeviceBuffer::from(idx_);
    bytes_ = packed_kv_workspace_size(s_.B, s_.S, s_.K);
    out_ = DeviceBuffer(std::max<size_t>(bytes_, 16));
    p_.cache = pool_.view();
    p_.indices = idx_dev_.as<int32_t>();
    p_.indices_batch_stride = int64_t(s_.S) * s_.K;
    p_.indices_seq_stride = s_.K;
    p_.batch = s_.B;
    p_.seq_q = s_.S;
    p_.topk = s_.K;
    p_.packed_kv = out_.get();
    p_.packed_kv_bytes = bytes_;
  }

  std::string shape() const override { return s_.str(); }
  std::string variant() const override { return "pack"; }
  double bytes() const override { return 2.0 * double(s_.record_bytes()); }
  void run(cudaStream_t stream) override { throw_if_error(pack_selected_kv(p_, stream)); }
  AnchorInfo anchor() const override {
    AnchorInfo a;
    a.rel_key = s_.copy_key();
    a.rel_max = kCopyTarget;
    return a;
  }

  // Every validity word (all entries are valid here) and a sample of records, byte for byte
  // against the pool's host copy of the selected slot.
  CheckResult check(cudaStream_t stream) override {
    out_.fill_async(0xff, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    std::vector<uint32_t> words(size_t(s_.entries() / 32));
    SELKV_BENCH_CUDA(cudaMemcpy(words.data(), out_.as<uint8_t>() + s_.record_bytes(), words.size() * 4,
                                cudaMemcpyDeviceToHost));
    for (size_t w = 0; w < words.size(); ++w)
      if (words[w] != 0xffffffffu)
        return CheckResult::fail("validity word " + std::to_string(w) + " = " + std::to_string(words[w]));
    Rng rng(s_.seed ^ 0x5a);
    const int64_t n = std::min<int64_t>(s_.sample, s_.entries());
    std::vector<uint8_t> rec(fmt::kDsMlaRecordBytes);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = i < 2 ? (i == 0 ? 0 : s_.entries() - 1) : rng.range(0, s_.entries() - 1);
      SELKV_BENCH_CUDA(cudaMemcpy(rec.data(), out_.as<uint8_t>() + e * fmt::kDsMlaRecordBytes, rec.size(),
                                  cudaMemcpyDeviceToHost));
      if (std::memcmp(rec.data(), pool_.record(idx_[size_t(e)]), rec.size()) != 0)
        return CheckResult::fail("entry " + std::to_string(e) + " (slot " + std::to_string(idx_[size_t(e)]) +
                                 ") differs from the cache record");
    }
    return CheckResult::pass("byte-exact: all " + std::to_string(words.size()) + " validity words, " +
                             std::to_string(n) + " records");
  }

 private:
  PackShape s_;
  Fp8Pool pool_;
  std::vector<int32_t> idx_;
  DeviceBuffer idx_dev_, out_;
  size_t bytes_ = 0;
  PackSelectedKvParams p_;
};

// The floor of a shape: one device-to-device copy of the same record bytes.
class CopyFloorWorkload final : public Workload, public Anchored {
 public:
  explicit CopyFloorWorkload(const PackShape& s) : s_(s), src_(s.record_bytes()), dst_(s.record_bytes()) {
    src_.fill_async(0x5c, nullptr);
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }
  std::string shape() const override { return s_.str(); }
  std::string variant() const override { return "d2d copy floor"; }
  double bytes() const override { return 2.0 * double(s_.record_bytes()); }
  void run(cudaStream_t stream) override {
    SELKV_BENCH_CUDA(cudaMemcpyAsync(dst_.get(), src_.get(), s_.record_bytes(), cudaMemcpyDeviceToDevice, stream));
  }
  AnchorInfo anchor() const override {
    AnchorInfo a;
    a.key = s_.copy_key();
    return a;
  }
  CheckResult check(cudaStream_t) override { return CheckResult{}; }  // nothing to check

 private:
  PackShape s_;
  DeviceBuffer src_, dst_;
};

PackShape shape_from(const Params& p, bool cpu) {
  PackShape s;
  s.B = int32_t(checked_positive("batch", p.get_int("batch", cpu ? 2 : 4)));
  s.S = int32_t(checked_positive("seq-q", p.get_int("seq-q", 2)));
  s.K = int32_t(checked_positive("topk", p.get_int("topk", cpu ? 256 : 2048)));
  if (s.K % 64 != 0) throw std::invalid_argument("--topk must be a multiple of 64");
  s.s_kv = checked_positive("s-kv", p.get_int("s-kv", cpu ? 1024 : 8192));
  if (s.s_kv < s.K) throw std::invalid_argument("--s-kv must be >= --topk (K distinct slots per row)");
  s.page = checked_page_size(p.get_int("page-size", 64));
  s.seed = p.seed() ^ 0x6006;
  s.sample = p.sample();
  return s;
}

// No GPU: the oracle on a small shape, self-checked record by record against the cache.
CpuReport cpu_demo(const Params& prm) {
  const PackShape s = shape_from(prm, true);
  CpuReport r;
  r.shape = s.str();
  Rng rng(s.seed);
  const int64_t blocks = (int64_t(s.B) * s.s_kv + s.page - 1) / s.page;
  const PagedKvCache view{nullptr, blocks, s.page, int64_t(s.page) * fmt::kDsMlaRecordBytes, KvFormat::kDsMlaFp8};
  std::vector<uint8_t> cache(size_t(blocks * view.block_stride_bytes));
  fill_random_records(cache.data(), view.num_slots(), KvFormat::kDsMlaFp8, rng);
  std::vector<int32_t> idx = make_indices(s, rng);
  for (size_t i = 0; i < idx.size(); i += 7) idx[i] = -1;  // some invalid entries
  const size_t bytes = packed_kv_workspace_size(s.B, s.S, s.K);
  std::vector<uint8_t> out(bytes, 0xff);
  PackSelectedKvParams p;
  p.cache = view;
  p.cache.data = cache.data();
  p.indices = idx.data();
  p.indices_batch_stride = int64_t(s.S) * s.K;
  p.indices_seq_stride = s.K;
  p.batch = s.B;
  p.seq_q = s.S;
  p.topk = s.K;
  p.packed_kv = out.data();
  p.packed_kv_bytes = bytes;
  Stopwatch sw;
  const Status st = ref::pack_selected_kv(p);
  r.seconds = sw.seconds();
  r.bytes = 2.0 * double(s.record_bytes());
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  const std::vector<uint8_t> zero(fmt::kDsMlaRecordBytes, 0);
  for (int64_t e = 0; e < s.entries(); ++e) {
    const bool valid = idx[size_t(e)] >= 0;
    const uint8_t* want = valid ? cache.data() + view.slot_offset(idx[size_t(e)]) : zero.data();
    uint32_t word;
    std::memcpy(&word, out.data() + s.record_bytes() + 4 * (e / 32), 4);
    if (std::memcmp(out.data() + e * fmt::kDsMlaRecordBytes, want, fmt::kDsMlaRecordBytes) != 0 ||
        ((word >> (e % 32)) & 1u) != uint32_t(valid)) {
      r.check = CheckResult::fail("entry " + std::to_string(e) + " differs from the cache record / validity bit");
      return r;
    }
  }
  r.check = CheckResult::pass("every entry == its cache record (or zeros), validity bits");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_pack) {
  OpSpec op;
  op.key = "pack";
  op.api = "selkv::pack_selected_kv";
  op.summary = "C6 pack: selected FP8 records -> packed KV buffer (default B=4 S_q=2 K=2048 s_kv=8192)";
  op.order = 55;
  op.in_default_job = false;
  op.params = {{"batch", "batch B (pack: 4)"},
               {"seq-q", "query rows per batch entry S_q (2)"},
               {"topk", "K, a multiple of 64 (2048)"},
               {"s-kv", "slots per batch entry; rows select K distinct of them (8192)"},
               {"page-size", "tokens per cache page (64)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<PackWorkload>(shape_from(p, false));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  // Seed 000: K = 2048, B in {1, 2, 4, 7, 8}, S_q in {1, 2, 3, 4, 8, 16}; each shape's copy floor
  // first, then the pack (which reads the floor's time).
  for (int32_t B : {1, 2, 4, 7, 8})
    for (int32_t S : {1, 2, 3, 4, 8, 16}) {
      PackShape s;
      s.B = B;
      s.S = S;
      const bool quick = (B == 1 && S == 1) || (B == 4 && S == 2) || (B == 8 && S == 16);
      BenchCase floor;
      floor.op = "pack";
      floor.label = s.str() + " d2d copy floor";
      floor.quick = quick;
      floor.make = [s](uint64_t) -> std::unique_ptr<Workload> { return std::make_unique<CopyFloorWorkload>(s); };
      case_registry().push_back(std::move(floor));
      BenchCase c;
      c.op = "pack";
      c.label = s.str() + " pack";
      c.quick = quick;
      c.make = [s](uint64_t seed) -> std::unique_ptr<Workload> {
        PackShape t = s;
        t.seed = seed ^ 0x6006;
        return std::make_unique<PackWorkload>(t);
      };
      case_registry().push_back(std::move(c));
    }
}

}  // namespace selkv::bench
