// C5 decode with model1_fp8 and the extra KV cache: every argument rule of the C++ API, checked
// on the CPU with fake (never dereferenced) pointers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "decode/decode_params.h"
#include "selkv/decode.h"

namespace {

using namespace selkv;

#ifdef SELKV_HAVE_CUTLASS

template <typename T>
T* fake(uintptr_t a) { return reinterpret_cast<T*>((a >> 16) << 36 | (a & 0xffff)); }

using M1 = KvFormatTraits<KvFormat::kModel1Fp8>;

// A valid MODEL1 call: main cache of 61-token pages, extra cache of 2-token pages (K2 = 128).
struct M1Base {
  SparseDecodeParams p;
  DecodeMetadata md;
  size_t ws = 0;
  explicit M1Base(int K2 = 128, int H = 64, int B = 2, int S = 2, int K = 128) {
    p.q = fake<void>(0x10000);
    p.batch = B; p.seq_q = S; p.num_heads = H; p.topk = K;
    p.cache = PagedKvCache{fake<void>(0x20000), 9, 61, M1::page_bytes(61), KvFormat::kModel1Fp8};
    p.indices = fake<int32_t>(0x30000);
    p.sm_scale = 0.03f;
    p.out = fake<void>(0x40000);
    p.lse = fake<float>(0x50000);
    if (K2 > 0) {
      p.extra_cache = PagedKvCache{fake<void>(0xa0000), 300, 2, M1::page_bytes(2), KvFormat::kModel1Fp8};
      p.extra_indices = fake<int32_t>(0xb0000);
      p.extra_topk = K2;
    }
    set_contiguous_strides(&p);
    md.data = fake<int32_t>(0x60000);
    md.bytes = decode_metadata_size(B, S);
    md.shape = DecodeShape{B, S, H, K, nullptr, 132};
    md.shape.extra_topk = K2;
    md.num_sm_parts = 132 / (H / 64);
    md.min_blocks_per_part = 2;
    md.valid = true;
    ws = decode_workspace_size(md);
  }
  Status check() const { return check_sparse_mla_decode(p, md, ws); }
};

void expect_arg_error(const Status& st, const std::string& arg) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(std::string(": ") + arg + ":"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("selkv::"), std::string::npos) << st.to_string();
}

TEST(Model1DecodeChecks, ValidCallsPass) {
  for (int K2 : {0, 64, 1024}) {
    for (int H : {64, 128}) {
      M1Base b(K2, H);
      EXPECT_TRUE(b.check().ok()) << K2 << " " << H << ": " << b.check().to_string();
    }
  }
  // q of MODEL1 is [.., 512]: contiguous strides follow the format.
  M1Base b;
  EXPECT_EQ(b.p.q_head_stride, 512);
  EXPECT_EQ(b.p.q_seq_stride, 64 * 512);
  EXPECT_EQ(b.p.extra_indices_seq_stride, 128);
  EXPECT_EQ(b.p.extra_indices_batch_stride, 2 * 128);
  // Dynamic top-k on either cache or both.
  {
    M1Base d;
    d.p.extra_topk_length = d.md.shape.extra_topk_length = fake<int32_t>(0xc0000);
    EXPECT_TRUE(d.check().ok()) << d.check().to_string();
    d.p.topk_length = d.md.shape.topk_length = fake<int32_t>(0x70000);
    EXPECT_TRUE(d.check().ok()) << d.check().to_string();
  }
  // Padded block strides on both caches.
  {
    M1Base d;
    d.p.cache.block_stride_bytes += 64;
    d.p.extra_cache.block_stride_bytes += 16;
    EXPECT_TRUE(d.check().ok()) << d.check().to_string();
  }
}

TEST(Model1DecodeChecks, RejectsBadCaches) {
  // The main cache: the padded MODEL1 page is the least block stride.
  { M1Base b; b.p.cache.block_stride_bytes = 61 * 584; expect_arg_error(b.check(), "cache"); }
  { M1Base b; b.p.cache.block_stride_bytes = M1::page_bytes(61) + 8; expect_arg_error(b.check(), "cache"); }
  { M1Base b; b.p.cache.format = KvFormat::kNopeFp8; expect_arg_error(b.check(), "cache"); }
  // The extra cache.
  { M1Base b; b.p.extra_cache.data = nullptr; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.data = fake<void>(0xa0008); expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.num_blocks = 0; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.page_size = 0; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.block_stride_bytes = 2 * 584; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.block_stride_bytes = M1::page_bytes(2) + 4; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.format = KvFormat::kDsMlaFp8; expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b; b.p.extra_cache.page_size = 1 << 30; b.p.extra_cache.block_stride_bytes = int64_t(1) << 40;
    expect_arg_error(b.check(), "extra_cache"); }
  // An extra cache with ds_mla_fp8 records: not supported (its kernels are built without one).
  {
    M1Base b;
    b.p.cache = PagedKvCache{fake<void>(0x20000), 9, 61, 61 * 656, KvFormat::kDsMlaFp8};
    b.p.extra_cache.format = KvFormat::kDsMlaFp8;
    b.p.extra_cache.block_stride_bytes = 2 * 656;
    expect_arg_error(b.check(), "extra_cache");
  }
}

TEST(Model1DecodeChecks, RejectsBadExtraArguments) {
  { M1Base b; b.p.extra_indices = nullptr; expect_arg_error(b.check(), "extra_indices"); }
  { M1Base b; b.p.extra_indices = fake<int32_t>(0xb0002); expect_arg_error(b.check(), "extra_indices"); }
  { M1Base b; b.p.extra_indices_seq_stride = -1; expect_arg_error(b.check(), "extra_indices"); }
  { M1Base b; b.p.extra_topk_length = b.md.shape.extra_topk_length = fake<int32_t>(0xc0002);
    expect_arg_error(b.check(), "extra_topk_length"); }
  // K2 a multiple of 64 (also the plan's), topk + K2 bounded.
  { M1Base b; b.p.extra_topk = b.md.shape.extra_topk = 96; expect_arg_error(b.check(), "extra_topk"); }
  { M1Base b; b.p.extra_topk = b.md.shape.extra_topk = -64; expect_arg_error(b.check(), "extra_topk"); }
  { M1Base b(0); b.p.topk = b.md.shape.topk = 1 << 30; b.p.extra_topk = b.md.shape.extra_topk = 64;
    b.p.extra_cache = M1Base().p.extra_cache; b.p.extra_indices = fake<int32_t>(0xb0000); b.p.batch = b.md.shape.batch = 1;
    b.p.seq_q = b.md.shape.seq_q = 1; expect_arg_error(b.check(), "extra_topk"); }
  // Without an extra cache (K2 = 0) none of its arguments may be given.
  { M1Base b(0); b.p.extra_cache.data = fake<void>(0xa0000); expect_arg_error(b.check(), "extra_cache"); }
  { M1Base b(0); b.p.extra_indices = fake<int32_t>(0xb0000); expect_arg_error(b.check(), "extra_indices"); }
  { M1Base b(0); b.p.extra_topk_length = b.md.shape.extra_topk_length = fake<int32_t>(0xc0000);
    expect_arg_error(b.check(), "extra_topk_length"); }
}

TEST(Model1DecodeChecks, RejectsPlanMismatch) {
  { M1Base b; b.md.shape.extra_topk = 64; expect_arg_error(b.check(), "metadata"); }
  { M1Base b; b.md.shape.extra_topk = 0; expect_arg_error(b.check(), "metadata"); }
  { M1Base b; b.p.extra_topk_length = fake<int32_t>(0xc0000); expect_arg_error(b.check(), "metadata"); }
  { M1Base b; b.md.shape.extra_topk_length = fake<int32_t>(0xc0000); expect_arg_error(b.check(), "metadata"); }
  {
    M1Base b;
    b.p.extra_topk_length = fake<int32_t>(0xc0000);
    b.md.shape.extra_topk_length = fake<int32_t>(0xc0010);
    expect_arg_error(b.check(), "metadata");
  }
}

TEST(Model1DecodeChecks, RejectsOverlapWithTheExtraTensors) {
  auto inside = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) + bytes; };
  { M1Base b; b.p.out = reinterpret_cast<void*>(inside(b.p.extra_cache.data, 576)); expect_arg_error(b.check(), "out"); }
  { M1Base b; b.p.lse = reinterpret_cast<float*>(inside(b.p.extra_indices, 64)); expect_arg_error(b.check(), "lse"); }
  { M1Base b; b.p.extra_topk_length = b.md.shape.extra_topk_length = reinterpret_cast<int32_t*>(inside(b.p.lse, 16));
    expect_arg_error(b.check(), "lse"); }
  // The workspace against the extra tensors.
  {
    const M1Base b;
    for (const void* x : {b.p.extra_cache.data, static_cast<const void*>(b.p.extra_indices)}) {
      void* w = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(x) - 16);
      expect_arg_error(sparse_mla_decode(b.p, b.md, w, b.ws, nullptr), "workspace");
    }
  }
  // The plan buffer is written while the scheduler reads extra_topk_length.
  {
    alignas(16) static int32_t big[1 << 16];
    DecodeShape s{2, 2, 64, 128, nullptr, 132};
    s.extra_topk = 64;
    s.extra_topk_length = big + 40;
    DecodeMetadata md;
    const Status st = make_decode_metadata(s, big, sizeof(big), &md, nullptr);
    expect_arg_error(st, "buffer");
    EXPECT_NE(st.message().find("extra_topk_length"), std::string::npos) << st.message();
  }
}

TEST(Model1DecodeChecks, MakeMetadataValidatesTheExtraShape) {
  alignas(16) static int32_t buf[64];
  DecodeMetadata md;
  DecodeShape s{2, 2, 64, 128, nullptr, 132};
  s.extra_topk = 100;
  expect_arg_error(make_decode_metadata(s, buf, sizeof(buf), &md, nullptr), "extra_topk");
  s.extra_topk = 0;
  s.extra_topk_length = fake<int32_t>(0xc0000);
  expect_arg_error(make_decode_metadata(s, buf, sizeof(buf), &md, nullptr), "extra_topk_length");
  // The block bound counts both caches: B * S_q * (K + K2) / 64 <= 2^29.
  DecodeShape big{1 << 16, 1, 64, 64 * (1 << 12), nullptr, 132};
  big.extra_topk = 64 * (1 << 12) + 64;
  expect_arg_error(make_decode_metadata(big, buf, sizeof(buf), &md, nullptr), "batch");
  EXPECT_FALSE(md.valid);
}

// Zero rows with an extra cache: a no-op plan and call.
TEST(Model1DecodeChecks, ZeroRowsAreNoOps) {
  DecodeShape s{0, 2, 64, 128, nullptr, 0};
  s.extra_topk = 64;
  DecodeMetadata md;
  ASSERT_TRUE(make_decode_metadata(s, nullptr, 0, &md, nullptr).ok());
  M1Base b(64, 64, 0, 2);
  b.md = md;
  EXPECT_TRUE(sparse_mla_decode(b.p, md, nullptr, 0, nullptr).ok());
}

#endif  // SELKV_HAVE_CUTLASS

// The metadata buffer holds K2 and the extra lengths snapshot after the main one.
TEST(Model1DecodeChecks, MetadataSizeCoversTheExtraSnapshot) {
  for (auto [B, S] : {std::pair{1, 1}, std::pair{3, 2}, std::pair{321, 3}}) {
    const int32_t rows = B * S;
    EXPECT_EQ(decode::md_extra_offset(rows, B), decode::md_lengths_offset(rows) + B);
    EXPECT_EQ(decode::md_ints(rows, B), decode::md_extra_lengths_offset(rows, B) + B);
    EXPECT_GE(decode_metadata_size(B, S), size_t(decode::md_ints(rows, B)) * 4);
    EXPECT_EQ(decode_metadata_size(B, S) % 16, 0u);
  }
}

}  // namespace
