// C1 cache write: bf16 latent (+ RoPE) -> paged FP8 records at random distinct slots.
// Bytes per token (ds_mla_fp8): 1024 latent + 128 RoPE + 8 slot + 656 record = 1816
// (model1_fp8: 896 + 128 + 8 + 584 = 1616).
#include <algorithm>
#include <cstring>

#include "cache_common.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"

namespace selkv::bench {
namespace {

constexpr uint8_t kPoison = 0xff;

struct WriteShape {
  int64_t tokens = 16384;
  int32_t page = 64;
  KvFormat format = KvFormat::kDsMlaFp8;
  ScaleMode mode = ScaleMode::kPow2;
  uint64_t seed = 1;
  int64_t sample = 4096;
};

// Host inputs: the cache has twice as many slots as tokens; tokens go to random distinct slots.
struct WriteInputs {
  WriteShape s;
  int64_t num_blocks = 0, block_stride = 0;
  std::vector<uint16_t> latent, rope;
  std::vector<int64_t> slots;

  explicit WriteInputs(const WriteShape& shape) : s(shape) {
    Rng rng(s.seed);
    num_blocks = std::max<int64_t>(1, (2 * s.tokens + s.page - 1) / s.page);
    block_stride = fmt::page_bytes(s.format, s.page);
    slots = sample_distinct(num_blocks * s.page, s.tokens, rng);
    latent = random_bf16(size_t(s.tokens) * fmt::kNopeDim, 1.0f, rng);  // rows of 512 (model1_fp8 reads 448)
    if (fmt::has_rope(s.format)) rope = random_bf16(size_t(s.tokens) * fmt::kRopeDim, 1.0f, rng);
  }
  size_t cache_bytes() const { return size_t(num_blocks * block_stride); }
  int64_t num_slots() const { return num_blocks * s.page; }
  PagedKvCache view(const void* cache) const { return PagedKvCache{cache, num_blocks, s.page, block_stride, s.format}; }
  // The byte offsets of a slot's token: its record (rec_bytes from slot_offset) and, for
  // model1_fp8, its 8 scale bytes in the page tail (from scale_offset).
  int64_t slot_offset(int64_t slot) const { return view(nullptr).slot_offset(slot); }
  int64_t scale_offset(int64_t slot) const { return view(nullptr).scale_offset(slot); }
  int rec_bytes() const {
    return s.format == KvFormat::kModel1Fp8 ? KvFormatTraits<KvFormat::kModel1Fp8>::kRecordStride
                                            : fmt::record_bytes(s.format);
  }
  int scale_bytes() const { return s.format == KvFormat::kModel1Fp8 ? 8 : 0; }
  // Token bytes of `slot` in a cache buffer: record, then (model1_fp8) scales.
  bool same_token(const std::vector<uint8_t>& a, const uint8_t* b_rec, const uint8_t* b_sc, int64_t slot) const {
    return std::memcmp(&a[size_t(slot_offset(slot))], b_rec, size_t(rec_bytes())) == 0 &&
           (scale_bytes() == 0 || std::memcmp(&a[size_t(scale_offset(slot))], b_sc, size_t(scale_bytes())) == 0);
  }
  WriteKvCacheParams params(const void* lat, const void* rp, const int64_t* sl, int64_t n, void* cache) const {
    WriteKvCacheParams p;
    p.latent = lat;
    p.latent_row_stride = fmt::kNopeDim;  // 512 (model1_fp8 reads the first 448 of each row)
    p.rope = fmt::has_rope(s.format) ? rp : nullptr;
    p.rope_row_stride = fmt::has_rope(s.format) ? fmt::kRopeDim : 0;
    p.slot_mapping = sl;
    p.num_tokens = n;
    p.cache = cache;
    p.num_blocks = num_blocks;
    p.page_size = s.page;
    p.block_stride_bytes = block_stride;
    p.format = s.format;
    p.scale_mode = s.mode;
    return p;
  }
  std::string shape_str() const {
    return "T=" + std::to_string(s.tokens) + " page=" + std::to_string(s.page) + " " + format_name(s.format);
  }
  double bytes() const {
    return double(s.tokens) * (2.0 * fmt::nope_dim(s.format) + (fmt::has_rope(s.format) ? 2.0 * fmt::kRopeDim : 0.0) +
                               8.0 + fmt::record_bytes(s.format));
  }
};

// Compares `got` with the oracle's records for the tokens in `which`, and checks that a sample of
// slots no token maps to still holds the poison.
CheckResult compare_records(const WriteInputs& in, const std::vector<uint8_t>& got,
                            const std::vector<int64_t>& which, Rng& rng) {
  const size_t n = which.size();
  std::vector<uint16_t> lat(n * fmt::kNopeDim), rp(fmt::has_rope(in.s.format) ? n * fmt::kRopeDim : 0);
  std::vector<int64_t> sl(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = which[i];
    std::memcpy(&lat[i * fmt::kNopeDim], &in.latent[size_t(t) * fmt::kNopeDim], 2 * fmt::kNopeDim);
    if (!rp.empty()) std::memcpy(&rp[i * fmt::kRopeDim], &in.rope[size_t(t) * fmt::kRopeDim], 2 * fmt::kRopeDim);
    sl[i] = in.slots[size_t(t)];
  }
  std::vector<uint8_t> want(in.cache_bytes(), kPoison);
  const Status st = ref::write_kv_cache(in.params(lat.data(), rp.data(), sl.data(), int64_t(n), want.data()));
  if (!st.ok()) return CheckResult::fail("oracle: " + st.to_string());
  for (size_t i = 0; i < n; ++i) {
    for (int part = 0; part < 2; ++part) {  // the record, then (model1_fp8) the scale bytes
      const int64_t off = part == 0 ? in.slot_offset(sl[i]) : in.scale_offset(sl[i]);
      const int len = part == 0 ? in.rec_bytes() : in.scale_bytes();
      for (int b = 0; b < len; ++b) {
        if (got[size_t(off + b)] != want[size_t(off + b)])
          return CheckResult::fail("token " + std::to_string(which[i]) + " slot " + std::to_string(sl[i]) +
                                   (part ? " scale byte " : " byte ") + std::to_string(b) + ": got " +
                                   hex_byte(got[size_t(off + b)]) + " want " + hex_byte(want[size_t(off + b)]));
      }
    }
  }
  // Slots nobody writes must be untouched.
  std::vector<uint8_t> written(size_t(in.num_slots()), 0);
  for (int64_t s : in.slots) written[size_t(s)] = 1;
  int64_t untouched_checked = 0;
  for (int tries = 0; tries < 4096 && untouched_checked < 1024; ++tries) {
    const int64_t slot = rng.range(0, in.num_slots() - 1);
    if (written[size_t(slot)]) continue;
    const int64_t off = in.slot_offset(slot);
    for (int b = 0; b < in.rec_bytes(); ++b)
      if (got[size_t(off + b)] != kPoison)
        return CheckResult::fail("unwritten slot " + std::to_string(slot) + " was modified (byte " +
                                 std::to_string(b) + ")");
    ++untouched_checked;
  }
  return CheckResult::pass("bit-exact, " + std::to_string(n) + " records; " +
                           std::to_string(untouched_checked) + " unused slots untouched");
}

class WriteWorkload final : public Workload {
 public:
  explicit WriteWorkload(const WriteShape& s)
      : in_(s),
        latent_(DeviceBuffer::from(in_.latent)),
        rope_(DeviceBuffer::from(in_.rope)),
        slots_(DeviceBuffer::from(in_.slots)),
        cache_(in_.cache_bytes()) {}

  std::string shape() const override { return in_.shape_str(); }
  std::string variant() const override { return scale_mode_name(in_.s.mode); }
  double bytes() const override { return in_.bytes(); }
  void run(cudaStream_t stream) override {
    throw_if_error(write_kv_cache(in_.params(latent_.get(), rope_.get(), slots_.as<int64_t>(),
                                             in_.s.tokens, cache_.get()), stream));
  }
  CheckResult check(cudaStream_t stream) override {
    cache_.fill_async(kPoison, stream);
    run(stream);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream));
    const std::vector<uint8_t> got = cache_.download<uint8_t>();
    Rng rng(in_.s.seed ^ 0xc4ec);
    const int64_t n = std::min(in_.s.tokens, in_.s.sample);
    std::vector<int64_t> which = sample_distinct(in_.s.tokens, n, rng);
    return compare_records(in_, got, which, rng);
  }

 private:
  WriteInputs in_;
  DeviceBuffer latent_, rope_, slots_, cache_;
};

WriteShape shape_from(const Params& p, int64_t default_tokens) {
  WriteShape s;
  s.tokens = checked_positive("tokens", p.get_int("tokens", default_tokens));
  s.page = checked_page_size(p.get_int("page-size", 64));
  s.format = parse_format(p.get_str("format", "ds_mla_fp8"));
  s.mode = parse_scale_mode(p.get_str("scale-mode", "pow2"));
  s.seed = p.seed() ^ 0x1001;
  s.sample = p.sample();
  return s;
}

// No GPU: the oracle writes the whole batch; each record is re-encoded on its own and compared,
// and unused slots must keep the poison.
CpuReport cpu_demo(const Params& p) {
  const WriteInputs in(shape_from(p, 256));
  std::vector<uint8_t> cache(in.cache_bytes(), kPoison);
  Stopwatch sw;
  const Status st = ref::write_kv_cache(in.params(in.latent.data(), in.rope.data(), in.slots.data(),
                                                  in.s.tokens, cache.data()));
  CpuReport r;
  r.seconds = sw.seconds();
  r.shape = in.shape_str();
  r.bytes = in.bytes();
  if (!st.ok()) {
    r.check = CheckResult::fail(st.to_string());
    return r;
  }
  const int rec = fmt::record_bytes(in.s.format);
  std::vector<uint8_t> one(static_cast<size_t>(rec));
  for (int64_t t = 0; t < in.s.tokens; ++t) {
    ref::encode_record(&in.latent[size_t(t) * fmt::kNopeDim],
                       in.rope.empty() ? nullptr : &in.rope[size_t(t) * fmt::kRopeDim], in.s.format,
                       in.s.mode, one.data());
    // encode_record lays a token out alone: record bytes, then (model1_fp8) its 8 scale bytes.
    if (!in.same_token(cache, one.data(), one.data() + in.rec_bytes(), in.slots[size_t(t)])) {
      r.check = CheckResult::fail("token " + std::to_string(t) + ": record differs from encode_record");
      return r;
    }
  }
  std::vector<uint8_t> written(size_t(in.num_slots()), 0);
  for (int64_t s : in.slots) written[size_t(s)] = 1;
  for (int64_t s = 0; s < in.num_slots(); ++s)
    if (!written[size_t(s)] && cache[size_t(in.slot_offset(s))] != kPoison) {
      r.check = CheckResult::fail("unused slot " + std::to_string(s) + " modified");
      return r;
    }
  r.check = CheckResult::pass("self-consistent, " + std::to_string(in.s.tokens) + " records");
  return r;
}

}  // namespace

SELKV_BENCH_REGISTER(register_write) {
  OpSpec op;
  op.key = "write";
  op.api = "selkv::write_kv_cache";
  op.summary = "C1 cache write: bf16 latent+RoPE -> paged FP8 records (default T=16384)";
  op.order = 10;
  op.params = {{"tokens", "tokens to write (write: 16384)"},
               {"page-size", "tokens per cache page (64)"},
               {"format", "ds_mla_fp8 | nope_fp8 | model1_fp8 (ds_mla_fp8)"},
               {"scale-mode", "pow2 | amax (pow2; model1_fp8: pow2 only)"}};
  op.make = [](const Params& p) -> std::unique_ptr<Workload> {
    return std::make_unique<WriteWorkload>(shape_from(p, 16384));
  };
  op.cpu = cpu_demo;
  op_registry().push_back(std::move(op));

  auto add = [](int64_t tokens, KvFormat f, ScaleMode m, bool quick, bool graph) {
    BenchCase c;
    c.op = "write";
    c.label = "T=" + std::to_string(tokens) + " " + format_name(f) + " " + scale_mode_name(m);
    c.quick = quick;
    c.graph = graph;
    c.make = [=](uint64_t seed) -> std::unique_ptr<Workload> {
      WriteShape s;
      s.tokens = tokens;
      s.format = f;
      s.mode = m;
      s.seed = seed ^ 0x1001;
      return std::make_unique<WriteWorkload>(s);
    };
    case_registry().push_back(std::move(c));
  };
  add(16384, KvFormat::kDsMlaFp8, ScaleMode::kPow2, true, false);
  add(16384, KvFormat::kDsMlaFp8, ScaleMode::kAmax, false, false);
  add(16384, KvFormat::kNopeFp8, ScaleMode::kPow2, false, false);
  add(16384, KvFormat::kModel1Fp8, ScaleMode::kPow2, false, false);
  add(128, KvFormat::kDsMlaFp8, ScaleMode::kPow2, true, true);  // one decode step, graph replay
}

}  // namespace selkv::bench
