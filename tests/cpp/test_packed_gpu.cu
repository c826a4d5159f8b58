// C6 pack / patch on the GPU vs the CPU oracle: every byte of the packed buffer (records and
// validity words) equal, a canary after the buffer untouched, NaN-poisoned records (slots no
// valid entry selects, entries past topk_length) never copied, graph replay and a pack on a
// second stream equal to eager, patch, zero-row calls. Skips without a GPU; failures print the seed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "packed/packed_layout.h"
#include "reference/oracle.h"
#include "selkv/packed.h"
#include "test_util.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::down;
using selkv::test::test_seed;

constexpr int kRec = 656;
constexpr size_t kCanary = 4096;
constexpr uint8_t kPoison = 0xAB;  // the packed buffer and its canary before a call

struct Case {
  int page;
  int64_t blocks;
  int64_t pad;  // bytes after each page (block stride = page * 656 + pad)
  int B, S, K;
  bool dynamic;
  int64_t idx_pad = 0;  // extra elements per index row (strided rows)
  size_t out_offset = 0;  // packed_kv = allocation + this (16-byte aligned, not 256)
};

std::string describe(const Case& c) {
  return "page=" + std::to_string(c.page) + " blocks=" + std::to_string(c.blocks) + " pad=" + std::to_string(c.pad) +
         " B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " K=" + std::to_string(c.K) +
         " dyn=" + std::to_string(c.dynamic);
}

// Host inputs of one case: a cache whose unselected slots are NaN poison (0xFF: E4M3 NaN codes,
// NaN scales and RoPE), indices with garbage, lengths with every clamp class.
struct Inputs {
  int64_t stride, slots;
  std::vector<uint8_t> cache;
  std::vector<int32_t> idx, len;
  int64_t idx_seq_stride, idx_batch_stride;
};

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  in.stride = int64_t(c.page) * kRec + c.pad;
  in.slots = c.blocks * c.page;
  in.cache.resize(size_t(c.blocks * in.stride));
  for (auto& b : in.cache) b = uint8_t(rng());  // padding: garbage
  std::vector<int32_t> selected, poisoned;
  std::vector<uint16_t> lat(512), rope(64);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t s = 0; s < in.slots; ++s) {
    uint8_t* rec = in.cache.data() + (s / c.page) * in.stride + (s % c.page) * kRec;
    if (rng() % 2) {
      for (auto& x : lat) x = test::bf16(nd(rng));
      for (auto& x : rope) x = test::bf16(nd(rng));
      ref::encode_record(lat.data(), rope.data(), KvFormat::kDsMlaFp8, (s & 1) ? ScaleMode::kAmax : ScaleMode::kPow2,
                         rec);
      selected.push_back(int32_t(s));
    } else {
      std::memset(rec, 0xFF, kRec);
      poisoned.push_back(int32_t(s));
    }
  }
  if (selected.empty()) selected.push_back(-1);
  if (poisoned.empty()) poisoned.push_back(-1);
  const int32_t garbage[] = {-1, -2, INT_MIN, int32_t(in.slots), int32_t(in.slots + 1), INT_MAX, -1000};
  in.len.resize(size_t(c.B));
  for (auto& l : in.len) {
    const int r = int(rng() % 6);
    l = r == 0 ? -3 : r == 1 ? c.K + 5 : r == 2 ? INT_MIN : r == 3 ? INT_MAX : int32_t(rng() % uint64_t(c.K + 1));
  }
  in.idx_seq_stride = c.K + c.idx_pad;
  in.idx_batch_stride = c.S * in.idx_seq_stride + c.idx_pad;
  in.idx.assign(size_t(c.B * in.idx_batch_stride), 0x5a5a5a5a);
  for (int b = 0; b < c.B; ++b) {
    const int64_t limit = c.dynamic ? std::min<int64_t>(std::max(in.len[size_t(b)], 0), c.K) : c.K;
    for (int s = 0; s < c.S; ++s)
      for (int k = 0; k < c.K; ++k) {
        int32_t v;
        if (rng() % 8 == 0) {
          v = garbage[rng() % 7];
        } else if (k < limit) {
          v = selected[rng() % selected.size()];
        } else {
          v = poisoned[rng() % poisoned.size()];  // past the length: a real slot, never copied
        }
        in.idx[size_t(b * in.idx_batch_stride + s * in.idx_seq_stride + k)] = v;
      }
  }
  return in;
}

// Device copies of the inputs and a poisoned packed buffer followed by a canary.
struct Device {
  DevBuf cache, idx, len, out;
  size_t bytes;
  Device(const Inputs& in, size_t bytes_, size_t out_offset)
      : cache(in.cache.size()), idx(in.idx.size() * 4), len(in.len.size() * 4),
        out(bytes_ + kCanary + out_offset), bytes(bytes_) {
    EXPECT_EQ(cudaMemcpy(cache.ptr, in.cache.data(), in.cache.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(idx.ptr, in.idx.data(), in.idx.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(len.ptr, in.len.data(), in.len.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(out.ptr, kPoison, out.bytes), cudaSuccess);
  }
};

PackSelectedKvParams params(const Case& c, const Inputs& in, const void* cache, const int32_t* idx,
                            const int32_t* len, void* out, size_t bytes) {
  PackSelectedKvParams p;
  p.cache = PagedKvCache{cache, c.blocks, c.page, in.stride, KvFormat::kDsMlaFp8};
  p.indices = idx;
  p.indices_batch_stride = in.idx_batch_stride;
  p.indices_seq_stride = in.idx_seq_stride;
  p.batch = c.B;
  p.seq_q = c.S;
  p.topk = c.K;
  p.topk_length = c.dynamic ? len : nullptr;
  p.packed_kv = out;
  p.packed_kv_bytes = bytes;
  return p;
}

// The oracle's buffer (poison, then the oracle's pack) with the canary.
std::vector<uint8_t> oracle(const Case& c, const Inputs& in, size_t bytes) {
  std::vector<uint8_t> want(bytes + kCanary, kPoison);
  const Status st = ref::pack_selected_kv(params(c, in, in.cache.data(), in.idx.data(), in.len.data(), want.data(), bytes));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return want;
}

// Byte for byte (records, validity words, canary); also names the first poisoned record copied.
// `bytes` = packed_kv_workspace_size: entries * 656 record bytes, entries / 8 of words, 16 of shape.
void expect_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t bytes, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  const size_t records = (bytes - 16) / (8 * kRec + 1) * 8 * kRec;  // bytes = (entries / 8) * (8 * 656 + 1) + 16
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " bytes differ, first at " << first
                     << (first < records        ? " (record of entry " + std::to_string(first / kRec) + ")"
                         : first < bytes - 16 ? " (validity words)"
                         : first < bytes      ? " (shape words)"
                                              : " (canary after the buffer)")
                     << ": gpu " << int(got[first]) << " ref " << int(want[first]);
  const std::vector<uint8_t> nan_record(kRec, 0xFF);
  for (size_t e = 0; e * kRec < records; ++e)
    if (std::memcmp(got.data() + e * kRec, nan_record.data(), kRec) == 0) {
      ADD_FAILURE() << what << ": entry " << e << " holds a NaN-poisoned record";
      break;
    }
}

void run_case(const Case& c, uint64_t salt) {
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + describe(c));
  std::mt19937_64 rng(test_seed() * 1000003ull + salt);
  const Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  ASSERT_GT(bytes, 0u);
  Device d(in, bytes, c.out_offset);
  uint8_t* out = d.out.as<uint8_t>(c.out_offset);
  const Status st = pack_selected_kv(params(c, in, d.cache.ptr, d.idx.as<int32_t>(), d.len.as<int32_t>(), out, bytes),
                                     nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(bytes + kCanary);
  CUDA_OK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
  expect_equal(got, oracle(c, in, bytes), bytes, "eager");
}

TEST(PackedGpu, PagesStridesAndLengths) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 1;
  for (int page : {2, 61, 64, 69})
    for (bool dyn : {false, true}) {
      const int64_t blocks = 3000 / page + 1;
      run_case({page, blocks, 0, 3, 2, 256, dyn}, salt++);
      run_case({page, blocks, 16 * int64_t(salt % 5) + 4096, 2, 3, 128, dyn, /*idx_pad=*/3, /*out_offset=*/16}, salt++);
    }
}

TEST(PackedGpu, ShapesAcrossSplitCounts) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 100;
  // From two groups (64 entries, each split 11 ways) to more groups than resident warps
  // (one unit per group, several CTA waves).
  run_case({64, 40, 0, 1, 1, 64, false}, salt++);
  run_case({64, 40, 0, 1, 1, 2048, true}, salt++);
  run_case({61, 100, 32, 2, 1, 2048, true}, salt++);
  run_case({64, 200, 0, 7, 3, 2048, true, 5}, salt++);
  run_case({64, 400, 0, 8, 16, 2048, false}, salt++);
  run_case({69, 400, 48, 16, 16, 1024, true}, salt++);
}

TEST(PackedGpu, EmptyCacheAndAllInvalid) {
  SELKV_REQUIRE_GPU();
  // num_blocks = 0: every entry is a zero record, the cache is never read.
  Case c{64, 0, 0, 2, 2, 128, true};
  std::mt19937_64 rng(test_seed() + 7);
  Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  Device d(in, bytes, 0);
  ASSERT_TRUE(pack_selected_kv(params(c, in, nullptr, d.idx.as<int32_t>(), d.len.as<int32_t>(), d.out.ptr, bytes),
                               nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = down<uint8_t>(d.out, bytes + kCanary);
  // Records and validity words all zero; the shape words name (B, S_q, K).
  const size_t shape_at = size_t(packed::packed_shape_offset(int64_t(c.B) * c.S, c.K));
  ASSERT_EQ(shape_at + packed::kShapeBytes, bytes);
  for (size_t i = 0; i < shape_at; ++i) ASSERT_EQ(got[i], 0) << "byte " << i;
  uint64_t lo = 0, hi = 0;
  std::memcpy(&lo, got.data() + shape_at, 8);
  std::memcpy(&hi, got.data() + shape_at + 8, 8);
  EXPECT_TRUE(packed::packed_shape_matches(lo, hi, c.B, c.S, c.K)) << "shape words " << std::hex << lo << " " << hi;
  for (size_t i = bytes; i < got.size(); ++i) ASSERT_EQ(got[i], kPoison) << "canary byte " << i - bytes;
}

TEST(PackedGpu, GraphReplayEqualsEager) {
  SELKV_REQUIRE_GPU();
  const Case c{61, 300, 16, 4, 2, 2048, true, 1};
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + describe(c));
  std::mt19937_64 rng(test_seed() + 300);
  const Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  Device d(in, bytes, 0);
  DevBuf eager(bytes + kCanary);
  CUDA_OK(cudaMemset(eager.ptr, kPoison, eager.bytes));
  ASSERT_TRUE(pack_selected_kv(params(c, in, d.cache.ptr, d.idx.as<int32_t>(), d.len.as<int32_t>(), eager.ptr, bytes),
                               nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const Status st =
      pack_selected_kv(params(c, in, d.cache.ptr, d.idx.as<int32_t>(), d.len.as<int32_t>(), d.out.ptr, bytes), s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_OK(cudaGraphLaunch(ge, s));
  CUDA_OK(cudaStreamSynchronize(s));
  const auto first = down<uint8_t>(d.out, bytes + kCanary);
  CUDA_OK(cudaMemsetAsync(d.out.ptr, kPoison, bytes, s));  // a replay rewrites every byte
  CUDA_OK(cudaGraphLaunch(ge, s));
  CUDA_OK(cudaStreamSynchronize(s));
  const auto second = down<uint8_t>(d.out, bytes + kCanary);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  const auto want = down<uint8_t>(eager, bytes + kCanary);
  expect_equal(first, want, bytes, "graph replay vs eager");
  expect_equal(second, want, bytes, "second replay vs eager");
  expect_equal(want, oracle(c, in, bytes), bytes, "eager vs oracle");
}

// The intended use: pack on a side stream (e.g. overlapped with other work), the consumer's
// stream waits on an event.
TEST(PackedGpu, SecondStreamThenEventWait) {
  SELKV_REQUIRE_GPU();
  const Case c{64, 500, 0, 4, 4, 2048, true};
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + describe(c));
  std::mt19937_64 rng(test_seed() + 400);
  const Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  DevBuf cache(in.cache.size()), idx(in.idx.size() * 4), len(in.len.size() * 4), out(bytes + kCanary);
  cudaStream_t main_s, side;
  CUDA_OK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t inputs_ready, packed;
  CUDA_OK(cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&packed, cudaEventDisableTiming));
  std::vector<uint8_t> got(bytes + kCanary);
  CUDA_OK(cudaMemsetAsync(out.ptr, kPoison, out.bytes, main_s));
  CUDA_OK(cudaMemcpyAsync(cache.ptr, in.cache.data(), in.cache.size(), cudaMemcpyHostToDevice, main_s));
  CUDA_OK(cudaMemcpyAsync(idx.ptr, in.idx.data(), in.idx.size() * 4, cudaMemcpyHostToDevice, main_s));
  CUDA_OK(cudaMemcpyAsync(len.ptr, in.len.data(), in.len.size() * 4, cudaMemcpyHostToDevice, main_s));
  CUDA_OK(cudaEventRecord(inputs_ready, main_s));
  CUDA_OK(cudaStreamWaitEvent(side, inputs_ready, 0));
  const Status st = pack_selected_kv(params(c, in, cache.ptr, idx.as<int32_t>(), len.as<int32_t>(), out.ptr, bytes), side);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaEventRecord(packed, side));
  CUDA_OK(cudaStreamWaitEvent(main_s, packed, 0));
  CUDA_OK(cudaMemcpyAsync(got.data(), out.ptr, got.size(), cudaMemcpyDeviceToHost, main_s));
  CUDA_OK(cudaStreamSynchronize(main_s));
  expect_equal(got, oracle(c, in, bytes), bytes, "side stream");
  cudaEventDestroy(inputs_ready);
  cudaEventDestroy(packed);
  cudaStreamDestroy(side);
  cudaStreamDestroy(main_s);
}

TEST(PackedGpu, PatchMatchesOracle) {
  SELKV_REQUIRE_GPU();
  const Case c{69, 100, 0, 3, 2, 128, true};
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + describe(c));
  std::mt19937_64 rng(test_seed() + 500);
  const Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  Device d(in, bytes, 0);
  ASSERT_TRUE(pack_selected_kv(params(c, in, d.cache.ptr, d.idx.as<int32_t>(), d.len.as<int32_t>(), d.out.ptr, bytes),
                               nullptr).ok());
  std::vector<uint8_t> want = oracle(c, in, bytes);

  // 300 records at a 688-byte stride: distinct positions, many in the same validity word (the
  // atomicOr path), mixed with padding and out-of-range positions that must not be written.
  const int64_t entries = int64_t(c.B) * c.S * c.K, stride = 688;
  std::vector<int64_t> pos;
  std::vector<int64_t> perm(static_cast<size_t>(entries));
  for (int64_t e = 0; e < entries; ++e) perm[size_t(e)] = e;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < 300; ++i) {
    const int r = int(rng() % 8);
    pos.push_back(r == 0 ? -1 : r == 1 ? entries + int64_t(rng() % 5) : r == 2 ? (rng() % 2 ? INT64_MIN : INT64_MAX)
                                                                       : perm[size_t(i)]);
  }
  // Then one whole word, entries 64..95 (dropped from the first part: positions stay distinct).
  for (auto& e : pos)
    if (e >= 64 && e < 96) e = -1;
  for (int i = 0; i < 32; ++i) pos.push_back(64 + i);
  std::vector<uint8_t> recs(pos.size() * stride);
  for (auto& b : recs) b = uint8_t(rng());
  DevBuf dpos(pos.size() * 8), drecs(recs.size());
  CUDA_OK(cudaMemcpy(dpos.ptr, pos.data(), pos.size() * 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(drecs.ptr, recs.data(), recs.size(), cudaMemcpyHostToDevice));
  PatchPackedKvParams q;
  q.packed_kv = d.out.ptr;
  q.packed_kv_bytes = bytes;
  q.batch = c.B;
  q.seq_q = c.S;
  q.topk = c.K;
  q.positions = dpos.as<int64_t>();
  q.records = drecs.as<uint8_t>();
  q.record_stride_bytes = stride;
  q.num_records = int64_t(pos.size());
  ASSERT_TRUE(patch_packed_kv(q, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  PatchPackedKvParams h = q;
  h.packed_kv = want.data();
  h.positions = pos.data();
  h.records = recs.data();
  ASSERT_TRUE(ref::patch_packed_kv(h).ok());
  expect_equal(down<uint8_t>(d.out, bytes + kCanary), want, bytes, "patch");
}

TEST(PackedGpu, ZeroRowsAndNoRecordsAreNoOps) {
  SELKV_REQUIRE_GPU();
  DevBuf out(4096);
  CUDA_OK(cudaMemset(out.ptr, kPoison, out.bytes));
  PackSelectedKvParams p;
  p.cache = PagedKvCache{nullptr, 0, 64, 64 * 656, KvFormat::kDsMlaFp8};
  p.topk = 2048;
  for (auto [b, s] : {std::pair{0, 4}, std::pair{4, 0}}) {
    p.batch = b;
    p.seq_q = s;
    EXPECT_TRUE(pack_selected_kv(p, nullptr).ok()) << pack_selected_kv(p, nullptr).to_string();  // null pointers
    p.packed_kv = out.ptr;
    p.packed_kv_bytes = 16;
    EXPECT_TRUE(pack_selected_kv(p, nullptr).ok());
    p.packed_kv = nullptr;
  }
  PatchPackedKvParams q;
  q.batch = 2;
  q.seq_q = 1;
  q.topk = 64;
  q.num_records = 0;
  EXPECT_TRUE(patch_packed_kv(q, nullptr).ok());
  q.packed_kv = out.ptr;
  q.packed_kv_bytes = out.bytes;
  q.batch = 0;
  q.num_records = 5;
  EXPECT_TRUE(patch_packed_kv(q, nullptr).ok());  // no rows: positions and records never read
  CUDA_OK(cudaDeviceSynchronize());
  for (uint8_t b : down<uint8_t>(out, out.bytes)) ASSERT_EQ(b, kPoison);
}

// A rejected call launches nothing and writes nothing.
TEST(PackedGpu, RejectedCallWritesNothing) {
  SELKV_REQUIRE_GPU();
  const Case c{64, 10, 0, 1, 2, 64, false};
  std::mt19937_64 rng(test_seed() + 600);
  const Inputs in = make_inputs(c, rng);
  const size_t bytes = packed_kv_workspace_size(c.B, c.S, c.K);
  Device d(in, bytes, 0);
  const Status st = pack_selected_kv(
      params(c, in, d.cache.ptr, d.idx.as<int32_t>(), nullptr, d.out.ptr, bytes - 16), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  for (uint8_t b : down<uint8_t>(d.out, bytes + kCanary)) ASSERT_EQ(b, kPoison);
}

}  // namespace
