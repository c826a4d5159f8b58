// CPU tests of the C1-C3 argument checks (src/cache/cache_checks.cpp): every bad argument is
// rejected before any CUDA call, with a message naming the argument. Also FastDivmod.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "cache/cache_checks.h"
#include "common/fast_divmod.h"
#include "common/overlap.h"
#include "selkv/cache_ops.h"
#include "test_util.h"

namespace selkv {
namespace {

using cache::Work;

// Fake, never dereferenced device pointers: each 16-byte step of `byte_offset` is its own 4 GiB
// region (so no two arguments overlap), and byte_offset % 16 is kept (misalignment tests).
template <typename T = void>
T* fake(size_t byte_offset = 0) {
  return reinterpret_cast<T*>(uintptr_t(1) << 44 | (byte_offset & ~size_t(15)) << 28 | (byte_offset & 15));
}

WriteKvCacheParams good_write() {
  WriteKvCacheParams p;
  p.latent = fake(0);
  p.latent_row_stride = 576;
  p.rope = fake(1024);
  p.rope_row_stride = 576;
  p.slot_mapping = fake<const int64_t>(64);
  p.num_tokens = 10;
  p.cache = fake(256);
  p.num_blocks = 4;
  p.page_size = 64;
  p.block_stride_bytes = 64 * 656;
  p.format = KvFormat::kDsMlaFp8;
  return p;
}

ConvertIndicesParams good_convert() {
  ConvertIndicesParams p;
  p.req_local_indices = fake<const int32_t>(0);
  p.indices_row_stride = 2048;
  p.req_id_per_token = fake<const int32_t>(16);
  p.block_table = fake<const int32_t>(32);
  p.block_table_row_stride = 16;
  p.num_reqs = 2;
  p.max_blocks_per_req = 16;
  p.num_tokens = 4;
  p.topk = 2048;
  p.page_size = 64;
  p.num_blocks = 100;
  p.out_slots = fake<int32_t>(512);
  p.out_row_stride = 2048;
  p.valid_counts = fake<int32_t>(1024);
  return p;
}

GatherKvParams good_gather() {
  GatherKvParams p;
  p.cache = fake(0);
  p.num_blocks = 8;
  p.page_size = 64;
  p.block_stride_bytes = 64 * 656;
  p.format = KvFormat::kDsMlaFp8;
  p.block_table = fake<const int32_t>(16);
  p.block_table_row_stride = 8;
  p.max_blocks_per_req = 8;
  p.seq_starts = fake<const int32_t>(32);
  p.seq_lens = fake<const int32_t>(48);
  p.ws_starts = fake<const int32_t>(64);
  p.num_reqs = 3;
  p.out = fake(128);
  p.out_row_stride = 576;
  p.out_rows = 100;
  return p;
}

// The public op must fail with InvalidArgument and a message naming `arg`; it must not reach the
// device (the test binary runs without one).
template <typename P>
void expect_rejected(Status (*op)(const P&, cudaStream_t), const P& p, const std::string& arg,
                     const std::string& what) {
  const Status st = op(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
  EXPECT_NE(st.message().find(arg + ":"), std::string::npos)
      << what << ": message does not name '" << arg << "': " << st.message();
}

template <typename P>
struct Case {
  const char* arg;
  std::function<void(P&)> mutate;
};

TEST(CacheChecks, GoodParamsPass) {
  Work w;
  EXPECT_TRUE(cache::check_write_kv_cache(good_write(), &w).ok());
  EXPECT_EQ(w, Work::kLaunch);
  EXPECT_TRUE(cache::check_convert_indices(good_convert(), &w).ok());
  EXPECT_EQ(w, Work::kLaunch);
  EXPECT_TRUE(cache::check_gather_kv(good_gather(), &w).ok());
  EXPECT_EQ(w, Work::kLaunch);
  auto n = good_write();
  n.format = KvFormat::kNopeFp8;
  n.rope = nullptr;
  n.block_stride_bytes = 64 * 528;
  EXPECT_TRUE(cache::check_write_kv_cache(n, &w).ok());
}

// The public validation-only calls (include/selkv/cache_ops.h) are the launchers' checks.
TEST(CacheChecks, PublicChecksAreTheLaunchersChecks) {
  EXPECT_TRUE(check_write_kv_cache(good_write()).ok());
  EXPECT_TRUE(check_convert_req_indices_to_slots(good_convert()).ok());
  EXPECT_TRUE(check_gather_kv_bf16(good_gather()).ok());
  auto w = good_write();
  w.page_size = 0;
  EXPECT_EQ(check_write_kv_cache(w).message(), write_kv_cache(w, nullptr).message());
  auto c = good_convert();
  c.page_size = 0;
  EXPECT_EQ(check_convert_req_indices_to_slots(c).message(), convert_req_indices_to_slots(c, nullptr).message());
  auto g = good_gather();
  g.out_row_stride = 7;
  EXPECT_EQ(check_gather_kv_bf16(g).message(), gather_kv_bf16(g, nullptr).message());
  EXPECT_FALSE(check_gather_kv_bf16(g).ok());
}

TEST(CacheChecks, WriteRejectsEachBadArgument) {
  struct Case {
    const char* arg;
    std::function<void(WriteKvCacheParams&)> mutate;
  };
  const Case cases[] = {
      {"format", [](auto& p) { p.format = KvFormat(7); }},
      {"scale_mode", [](auto& p) { p.scale_mode = ScaleMode(3); }},
      {"num_tokens", [](auto& p) { p.num_tokens = -1; }},
      {"num_tokens", [](auto& p) { p.num_tokens = int64_t(1) << 32; }},
      {"num_blocks", [](auto& p) { p.num_blocks = -2; }},
      {"num_blocks", [](auto& p) { p.num_blocks = std::numeric_limits<int64_t>::max() / 1000; }},
      {"page_size", [](auto& p) { p.page_size = 0; }},
      {"page_size", [](auto& p) { p.page_size = -64; }},
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 63 * 656; }},
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 64 * 656 + 8; }},
      {"cache", [](auto& p) { p.cache = nullptr; }},
      {"cache", [](auto& p) { p.cache = fake(8); }},
      {"latent", [](auto& p) { p.latent = nullptr; }},
      {"latent", [](auto& p) { p.latent = fake(2); }},
      {"latent_row_stride", [](auto& p) { p.latent_row_stride = 511; }},
      {"latent_row_stride", [](auto& p) { p.latent_row_stride = 516; }},
      {"rope", [](auto& p) { p.rope = nullptr; }},
      {"rope", [](auto& p) { p.rope = fake(1032); }},
      {"rope_row_stride", [](auto& p) { p.rope_row_stride = 63; }},
      {"rope_row_stride", [](auto& p) { p.rope_row_stride = 68; }},
      {"rope", [](auto& p) {  // nope_fp8 has no RoPE: passing one is a caller error
         p.format = KvFormat::kNopeFp8;
         p.block_stride_bytes = 64 * 528;
       }},
      {"slot_mapping", [](auto& p) { p.slot_mapping = nullptr; }},
      {"slot_mapping", [](auto& p) { p.slot_mapping = fake<const int64_t>(4); }},
  };
  for (const auto& c : cases) {
    auto p = good_write();
    c.mutate(p);
    expect_rejected(&write_kv_cache, p, c.arg, c.arg);
  }
}

TEST(CacheChecks, ConvertRejectsEachBadArgument) {
  struct Case {
    const char* arg;
    std::function<void(ConvertIndicesParams&)> mutate;
  };
  const Case cases[] = {
      {"num_tokens", [](auto& p) { p.num_tokens = -1; }},
      {"num_tokens", [](auto& p) { p.num_tokens = int64_t(1) << 31; }},
      {"topk", [](auto& p) { p.topk = -1; }},
      {"num_reqs", [](auto& p) { p.num_reqs = -1; }},
      {"max_blocks_per_req", [](auto& p) { p.max_blocks_per_req = -1; }},
      {"page_size", [](auto& p) { p.page_size = 0; }},
      {"num_blocks", [](auto& p) { p.num_blocks = -1; }},
      {"num_blocks", [](auto& p) { p.num_blocks = (int64_t(1) << 31) / 64 + 1; }},
      {"valid_counts", [](auto& p) { p.valid_counts = fake<int32_t>(2); }},
      {"token_seq_lens", [](auto& p) { p.token_seq_lens = fake<int32_t>(2); }},
      {"req_local_indices", [](auto& p) { p.req_local_indices = nullptr; }},
      {"req_local_indices", [](auto& p) { p.req_local_indices = fake<const int32_t>(1); }},
      {"indices_row_stride", [](auto& p) { p.indices_row_stride = 2047; }},
      {"req_id_per_token", [](auto& p) { p.req_id_per_token = nullptr; }},
      {"req_id_per_token", [](auto& p) { p.req_id_per_token = fake<const int32_t>(3); }},
      {"out_slots", [](auto& p) { p.out_slots = nullptr; }},
      {"out_slots", [](auto& p) { p.out_slots = fake<int32_t>(6); }},
      {"out_row_stride", [](auto& p) { p.out_row_stride = 100; }},
      {"out_row_stride", [](auto& p) {  // in place needs identical strides
         p.out_slots = const_cast<int32_t*>(p.req_local_indices);
         p.out_row_stride = 4096;
       }},
      {"block_table", [](auto& p) { p.block_table = nullptr; }},
      {"block_table", [](auto& p) { p.block_table = fake<const int32_t>(2); }},
      {"block_table_row_stride", [](auto& p) { p.block_table_row_stride = 15; }},
  };
  for (const auto& c : cases) {
    auto p = good_convert();
    c.mutate(p);
    expect_rejected(&convert_req_indices_to_slots, p, c.arg, c.arg);
  }
}

TEST(CacheChecks, GatherRejectsEachBadArgument) {
  struct Case {
    const char* arg;
    std::function<void(GatherKvParams&)> mutate;
  };
  const Case cases[] = {
      {"format", [](auto& p) { p.format = KvFormat(-1); }},
      {"num_blocks", [](auto& p) { p.num_blocks = -1; }},
      {"page_size", [](auto& p) { p.page_size = 0; }},
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 64 * 656 - 16; }},
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 64 * 656 + 4; }},
      {"cache", [](auto& p) { p.cache = nullptr; }},
      {"cache", [](auto& p) { p.cache = fake(4); }},
      {"num_reqs", [](auto& p) { p.num_reqs = -1; }},
      {"num_reqs", [](auto& p) { p.num_reqs = cache::kMaxGatherReqs + 1; }},
      {"max_blocks_per_req", [](auto& p) { p.max_blocks_per_req = -1; }},
      {"out_rows", [](auto& p) { p.out_rows = -1; }},
      {"seq_starts", [](auto& p) { p.seq_starts = nullptr; }},
      {"seq_starts", [](auto& p) { p.seq_starts = fake<const int32_t>(33); }},
      {"seq_lens", [](auto& p) { p.seq_lens = nullptr; }},
      {"ws_starts", [](auto& p) { p.ws_starts = nullptr; }},
      {"out", [](auto& p) { p.out = nullptr; }},
      {"out", [](auto& p) { p.out = fake(130); }},
      {"out_row_stride", [](auto& p) { p.out_row_stride = 575; }},
      {"out_row_stride", [](auto& p) { p.out_row_stride = 580; }},
      {"out_row_stride", [](auto& p) {  // nope_fp8 rows are 512 wide: 511 is too narrow
         p.format = KvFormat::kNopeFp8;
         p.out_row_stride = 511;
       }},
      {"block_table", [](auto& p) { p.block_table = nullptr; }},
      {"block_table_row_stride", [](auto& p) { p.block_table_row_stride = 7; }},
  };
  for (const auto& c : cases) {
    auto p = good_gather();
    c.mutate(p);
    expect_rejected(&gather_kv_bf16, p, c.arg, c.arg);
  }
}

// model1_fp8: page_size 64 -> 64 * 584 = 37376 bytes, padded to 65 * 576 = 37440.
WriteKvCacheParams good_write_model1() {
  auto p = good_write();
  p.format = KvFormat::kModel1Fp8;
  p.latent_row_stride = 448;
  p.block_stride_bytes = 65 * 576;
  return p;
}

GatherKvParams good_gather_model1() {
  auto p = good_gather();
  p.format = KvFormat::kModel1Fp8;
  p.block_stride_bytes = 65 * 576;
  p.out_row_stride = 512;
  return p;
}

TEST(CacheChecks, Model1GoodParamsPass) {
  Work w;
  EXPECT_TRUE(cache::check_write_kv_cache(good_write_model1(), &w).ok());
  EXPECT_EQ(w, Work::kLaunch);
  EXPECT_TRUE(cache::check_gather_kv(good_gather_model1(), &w).ok());
  EXPECT_EQ(w, Work::kLaunch);
}

TEST(CacheChecks, Model1WriteRejectsEachBadArgument) {
  struct Case {
    const char* arg;
    std::function<void(WriteKvCacheParams&)> mutate;
  };
  const Case cases[] = {
      {"scale_mode", [](auto& p) { p.scale_mode = ScaleMode::kAmax; }},  // UE8M0: pow2 only
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 64 * 584; }},  // unpadded page
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 65 * 576 + 8; }},
      {"latent_row_stride", [](auto& p) { p.latent_row_stride = 440; }},  // rows are 448 wide
      {"latent_row_stride", [](auto& p) { p.latent_row_stride = 452; }},
      {"rope", [](auto& p) { p.rope = nullptr; }},  // model1_fp8 carries RoPE
      {"rope_row_stride", [](auto& p) { p.rope_row_stride = 63; }},
  };
  for (const auto& c : cases) {
    auto p = good_write_model1();
    c.mutate(p);
    expect_rejected(&write_kv_cache, p, c.arg, c.arg);
  }
}

TEST(CacheChecks, Model1GatherRejectsEachBadArgument) {
  struct Case {
    const char* arg;
    std::function<void(GatherKvParams&)> mutate;
  };
  const Case cases[] = {
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 64 * 584; }},
      {"block_stride_bytes", [](auto& p) { p.block_stride_bytes = 65 * 576 - 16; }},
      {"out_row_stride", [](auto& p) { p.out_row_stride = 448; }},  // rows are 512 wide
      {"out_row_stride", [](auto& p) { p.out_row_stride = 511; }},
  };
  for (const auto& c : cases) {
    auto p = good_gather_model1();
    c.mutate(p);
    expect_rejected(&gather_kv_bf16, p, c.arg, c.arg);
  }
}

// Zero-size work returns Ok before any CUDA call (this binary may have no GPU).
TEST(CacheChecks, ZeroSizeWorkIsOkWithoutLaunch) {
  auto w = good_write();
  w.num_tokens = 0;
  w.latent = nullptr;
  w.slot_mapping = nullptr;
  EXPECT_TRUE(write_kv_cache(w, nullptr).ok());
  w = good_write();
  w.num_blocks = 0;  // every slot out of range
  w.cache = nullptr;
  EXPECT_TRUE(write_kv_cache(w, nullptr).ok());

  auto c = good_convert();
  c.num_tokens = 0;
  EXPECT_TRUE(convert_req_indices_to_slots(c, nullptr).ok());
  c = good_convert();
  c.topk = 0;
  c.valid_counts = nullptr;  // with valid_counts the op zero-fills it (a memset)
  EXPECT_TRUE(convert_req_indices_to_slots(c, nullptr).ok());

  auto g = good_gather();
  g.num_reqs = 0;
  EXPECT_TRUE(gather_kv_bf16(g, nullptr).ok());
  g = good_gather();
  g.out_rows = 0;
  g.out = nullptr;
  EXPECT_TRUE(gather_kv_bf16(g, nullptr).ok());
}

// ---- issue 15: overlaps and host bounds --------------------------------------------------------

template <typename T = void, typename U>
T* at(U* p, ptrdiff_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

TEST(CacheChecks, WriteRejectsCacheOverlappingAnInput) {
  const Case<WriteKvCacheParams> cases[] = {
      {"cache", [](auto& p) { p.latent = at(p.cache, 656 * 64 * 3); }},
      {"cache", [](auto& p) { p.rope = at(p.cache, 64 * 656 * 4 - 16); }},
      {"cache", [](auto& p) { p.slot_mapping = at<const int64_t>(p.cache, 1024); }},
      {"cache", [](auto& p) { p.cache = at(p.latent, 9 * 576 * 2); }},  // the last latent row
  };
  for (const auto& c : cases) {
    auto p = good_write();
    c.mutate(p);
    expect_rejected(&write_kv_cache, p, c.arg, c.arg);
  }
  auto p = good_write();
  p.rope = at(p.latent, 10 * 576 * 2);  // inputs may share memory with each other
  p.slot_mapping = at<const int64_t>(p.latent, 1024);
  Work w;
  EXPECT_TRUE(cache::check_write_kv_cache(p, &w).ok()) << cache::check_write_kv_cache(p, &w).to_string();
}

TEST(CacheChecks, ConvertRejectsOverlaps) {
  const Case<ConvertIndicesParams> cases[] = {
      // out_slots against its inputs (only the exact in-place alias is allowed)
      {"out_slots", [](auto& p) { p.out_slots = const_cast<int32_t*>(p.req_local_indices) + 4; }},
      {"out_slots", [](auto& p) { p.out_slots = const_cast<int32_t*>(p.req_local_indices) + 3 * 2048; }},
      {"out_slots", [](auto& p) { p.req_id_per_token = p.out_slots + 2; }},
      {"out_slots", [](auto& p) { p.block_table = p.out_slots + 2048; }},
      // valid_counts against out_slots and every input
      {"valid_counts", [](auto& p) { p.valid_counts = const_cast<int32_t*>(p.req_id_per_token); }},
      {"valid_counts", [](auto& p) { p.valid_counts = const_cast<int32_t*>(p.req_id_per_token) + 3; }},
      {"valid_counts", [](auto& p) { p.valid_counts = p.out_slots + 100; }},
      {"valid_counts", [](auto& p) { p.valid_counts = const_cast<int32_t*>(p.req_local_indices) + 5000; }},
      {"valid_counts", [](auto& p) { p.valid_counts = const_cast<int32_t*>(p.block_table) + 20; }},
      // token_seq_lens is an input: neither output may overlap it
      {"out_slots", [](auto& p) { p.token_seq_lens = p.out_slots + 8; }},
      {"valid_counts", [](auto& p) { p.token_seq_lens = p.valid_counts + 1; }},
  };
  for (const auto& c : cases) {
    auto p = good_convert();
    c.mutate(p);
    expect_rejected(&convert_req_indices_to_slots, p, c.arg, c.arg);
  }
  Work w;
  // Exact in place stays allowed; req_id_per_token past num_tokens may overlap anything (never read).
  auto p = good_convert();
  p.out_slots = const_cast<int32_t*>(p.req_local_indices);
  EXPECT_TRUE(cache::check_convert_indices(p, &w).ok()) << cache::check_convert_indices(p, &w).to_string();
  p = good_convert();
  p.valid_counts = const_cast<int32_t*>(p.req_id_per_token) + 4;  // right after the 4 rows read
  EXPECT_TRUE(cache::check_convert_indices(p, &w).ok()) << cache::check_convert_indices(p, &w).to_string();
}

TEST(CacheChecks, ConvertBoundsTopk) {
  // The kernels walk a row in int32 offsets up to a chunk past topk.
  for (int32_t k : {cache::kMaxConvertTopk + 1, INT32_MAX - 2047, INT32_MAX}) {
    auto p = good_convert();
    p.topk = k;
    p.indices_row_stride = p.out_row_stride = k;
    p.valid_counts = nullptr;
    expect_rejected(&convert_req_indices_to_slots, p, "topk", std::to_string(k));
  }
  auto p = good_convert();
  p.num_tokens = 1;  // one 4 GiB row per tensor: the fake regions stay disjoint
  p.topk = cache::kMaxConvertTopk;
  p.indices_row_stride = p.out_row_stride = p.topk;
  Work w;
  EXPECT_TRUE(cache::check_convert_indices(p, &w).ok()) << cache::check_convert_indices(p, &w).to_string();
}

TEST(CacheChecks, GatherRejectsOutOverlappingAnInput) {
  const Case<GatherKvParams> cases[] = {
      {"out", [](auto& p) { p.out = at(p.cache, 7 * 64 * 656); }},
      {"out", [](auto& p) { p.cache = at<const void>(p.out, 99 * 576 * 2); }},
      {"out", [](auto& p) { p.block_table = at<const int32_t>(p.out, 64); }},
      {"out", [](auto& p) { p.seq_starts = at<const int32_t>(p.out, 4); }},
      {"out", [](auto& p) { p.seq_lens = at<const int32_t>(p.out, 100 * 576 * 2 - 4); }},
      {"out", [](auto& p) { p.ws_starts = at<const int32_t>(p.out, 0); }},
  };
  for (const auto& c : cases) {
    auto p = good_gather();
    c.mutate(p);
    expect_rejected(&gather_kv_bf16, p, c.arg, c.arg);
  }
  auto p = good_gather();
  p.seq_lens = at<const int32_t>(p.out, 100 * 576 * 2);  // just past out
  Work w;
  EXPECT_TRUE(cache::check_gather_kv(p, &w).ok()) << cache::check_gather_kv(p, &w).to_string();
}

// The extent / aliasing rules of common/overlap.h every op's overlap check is built from.
TEST(OverlapRules, ExtentsAndAliasing) {
  using detail::Dim;
  using detail::extent_of;
  const void* base = reinterpret_cast<const void*>(uintptr_t(1) << 40);
  auto at = [&](int64_t bytes) { return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + bytes); };
  // [T=3, H=2, 512] bf16 at head stride 520, token stride 1040: last byte at (2*1040 + 520 + 511) * 2.
  const detail::Extent e = extent_of(base, 2, {Dim{3, 1040}, Dim{2, 520}, Dim{512, 1}});
  EXPECT_EQ(int64_t(e.hi - e.lo), (2 * 1040 + 520 + 512) * 2);
  EXPECT_TRUE(detail::overlaps(e, detail::byte_range(at(6223), 1)));   // its last byte
  EXPECT_FALSE(detail::overlaps(e, detail::byte_range(at(6224), 64)));  // right after it
  EXPECT_FALSE(detail::overlaps(e, detail::byte_range(at(-64), 64)));   // right before it
  EXPECT_TRUE(detail::overlaps(e, detail::byte_range(at(-64), 65)));
  // Empty views (a size 0, a null pointer) overlap nothing.
  EXPECT_FALSE(detail::overlaps(e, extent_of(base, 2, {Dim{0, 1040}, Dim{512, 1}})));
  EXPECT_FALSE(detail::overlaps(e, extent_of(nullptr, 2, {Dim{3, 1040}, Dim{512, 1}})));
  // Negative strides reach below the pointer.
  EXPECT_TRUE(detail::overlaps(extent_of(at(4096), 4, {Dim{5, -256}}), detail::byte_range(at(0), 4)));
  // Aliasing: nested strides (in any order) are fine; stride 0 or a stride inside a smaller dim's
  // reach on a dim of size > 1 aliases; dims of size 1 do not count.
  EXPECT_FALSE(detail::self_overlaps({Dim{4, 64 * 512}, Dim{64, 512}, Dim{512, 1}}));
  EXPECT_FALSE(detail::self_overlaps({Dim{64, 512}, Dim{4, 64 * 512}, Dim{512, 1}}));
  EXPECT_FALSE(detail::self_overlaps({Dim{1, 0}, Dim{64, 512}, Dim{512, 1}}));
  EXPECT_TRUE(detail::self_overlaps({Dim{2, 0}, Dim{64, 512}, Dim{512, 1}}));
  EXPECT_TRUE(detail::self_overlaps({Dim{4, 63 * 512}, Dim{64, 512}, Dim{512, 1}}));
  EXPECT_TRUE(detail::self_overlaps({Dim{64, 511}, Dim{512, 1}}));
  EXPECT_TRUE(detail::self_overlaps({Dim{2, 512}, Dim{2, 512}, Dim{512, 1}}));  // two dims, one stride
  EXPECT_FALSE(detail::self_overlaps({Dim{64, -512}, Dim{512, 1}}));
}

TEST(FastDivmod, MatchesIntegerDivision) {
  std::mt19937_64 rng(test::test_seed());
  SCOPED_TRACE("seed=" + std::to_string(test::test_seed()));
  std::vector<uint32_t> divisors = {1, 2, 3, 4, 7, 16, 61, 64, 69, 100, 127, 128, 784, 1000,
                                    65535, 65536, 0x7ffffffeu, 0x7fffffffu, 0x80000000u};
  for (int i = 0; i < 200; ++i) divisors.push_back((uint32_t(rng()) & 0x7fffffffu) | 1u);
  for (int i = 0; i < 50; ++i) divisors.push_back(1u + uint32_t(rng() % 5000));
  for (const uint32_t d : divisors) {
    const selkv::FastDivmod f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 0x7ffffffeu, 0x7fffffffu};
    for (int i = 0; i < 2000; ++i) ns.push_back(uint32_t(rng()) & 0x7fffffffu);
    for (int i = 0; i < 200; ++i) ns.push_back(uint32_t(rng() % 64) * d + uint32_t(rng() % 3));
    for (const uint32_t n0 : ns) {
      const uint32_t n = n0 & 0x7fffffffu;
      uint32_t q, r;
      f.divmod(n, q, r);
      ASSERT_EQ(q, n / d) << "n=" << n << " d=" << d;
      ASSERT_EQ(r, n % d) << "n=" << n << " d=" << d;
    }
  }
}

}  // namespace
}  // namespace selkv
