// C5 decode: CPU-runnable checks (argument validation, scheduler arithmetic, smem layouts).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "decode/decode_params.h"
#include "decode/partial_scale.h"
#include "test_util.h"
#include "selkv/decode.h"

#ifdef SELKV_HAVE_CUTLASS
#include "decode/sm90/layout_check.h"
#endif

namespace {

using namespace selkv;

#ifdef SELKV_HAVE_CUTLASS

// Fake (never dereferenced) addresses: validation must not touch memory. Each 0x10000 step of
// `a` is its own 64 GiB region (no two arguments overlap); the low 16 bits are kept as given.
template <typename T>
T* fake(uintptr_t a) { return reinterpret_cast<T*>((a >> 16) << 36 | (a & 0xffff)); }

struct Base {
  SparseDecodeParams p;
  DecodeMetadata md;
  size_t ws = 0;
  Base(int B = 2, int S = 2, int H = 64, int K = 128) {
    p.q = fake<void>(0x10000);
    p.batch = B; p.seq_q = S; p.num_heads = H; p.topk = K;
    p.cache.data = fake<void>(0x20000);
    p.cache.num_blocks = 9; p.cache.page_size = 61;
    p.cache.block_stride_bytes = 61 * 656;
    p.indices = fake<int32_t>(0x30000);
    p.sm_scale = 0.03f;
    p.out = fake<void>(0x40000);
    p.lse = fake<float>(0x50000);
    set_contiguous_strides(&p);
    md.data = fake<int32_t>(0x60000);
    md.bytes = decode_metadata_size(B, S);
    md.shape = DecodeShape{B, S, H, K, nullptr, 132};
    md.num_sm_parts = 132 / (H / 64);
    md.min_blocks_per_part = selkv::decode::min_blocks_per_part(H, int64_t(B) * S * (K / 64));
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

TEST(DecodeChecks, ValidArgumentsPass) {
  Base b;
  EXPECT_TRUE(b.check().ok()) << b.check().to_string();
  Base b128(74, 1, 128, 2048);
  EXPECT_TRUE(b128.check().ok()) << b128.check().to_string();
}

TEST(DecodeChecks, RejectsUnsupportedShapes) {
  { Base b; b.p.num_heads = 96; b.md.shape.num_heads = 96; expect_arg_error(b.check(), "num_heads"); }
  { Base b; b.p.num_heads = 32; expect_arg_error(b.check(), "num_heads"); }
  { Base b; b.p.topk = 100; b.md.shape.topk = 100; expect_arg_error(b.check(), "topk"); }
  { Base b; b.p.topk = 0; expect_arg_error(b.check(), "topk"); }
  { Base b; b.p.batch = -1; expect_arg_error(b.check(), "batch"); }
  { Base b; b.p.seq_q = -1; expect_arg_error(b.check(), "seq_q"); }
  // Zero rows are a valid shape: a plan made for another shape is still a mismatch.
  { Base b; b.p.batch = 0; expect_arg_error(b.check(), "metadata"); }
}

TEST(DecodeChecks, RejectsBadPointersAndStrides) {
  { Base b; b.p.q = nullptr; expect_arg_error(b.check(), "q"); }
  { Base b; b.p.q = fake<void>(0x10008); expect_arg_error(b.check(), "q"); }
  { Base b; b.p.q_head_stride = 580; expect_arg_error(b.check(), "q"); }
  { Base b; b.p.q_seq_stride = -8; expect_arg_error(b.check(), "q"); }
  { Base b; b.p.out = nullptr; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out = fake<void>(0x40004); expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out_head_stride = 504; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out_seq_stride = 1028 + 2; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.lse = nullptr; expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.indices = nullptr; expect_arg_error(b.check(), "indices"); }
  { Base b; b.p.sm_scale = NAN; expect_arg_error(b.check(), "sm_scale"); }
}

TEST(DecodeChecks, RejectsBadCache) {
  { Base b; b.p.cache.format = KvFormat::kNopeFp8; expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.data = nullptr; expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.data = fake<void>(0x20004); expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.block_stride_bytes = 61 * 656 - 16; expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.block_stride_bytes = 61 * 656 + 8; expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.page_size = 0; expect_arg_error(b.check(), "cache"); }
  { Base b; b.p.cache.num_blocks = 0; expect_arg_error(b.check(), "cache"); }
  // Larger block stride (padding between pages) is fine.
  { Base b; b.p.cache.block_stride_bytes = 61 * 656 + 64; EXPECT_TRUE(b.check().ok()); }
}

TEST(DecodeChecks, RejectsMetadataMismatch) {
  { Base b; b.md.valid = false; expect_arg_error(b.check(), "metadata"); }
  // the kernels read the plan with 16-byte loads: a copy of it at a 4-byte offset is an error
  {
    Base b;
    b.md.data = fake<int32_t>(0x60004);
    const Status st = b.check();
    expect_arg_error(st, "metadata");
    EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.to_string();
  }
  { Base b; b.p.batch = 3; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.p.seq_q = 1; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.p.topk = 192; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.p.num_heads = 128; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.p.topk_length = fake<int32_t>(0x70000); expect_arg_error(b.check(), "metadata"); }
  { Base b; b.md.min_blocks_per_part = 0; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.md.num_sm_parts = selkv::decode::kMaxDecodeParts + 1; expect_arg_error(b.check(), "metadata"); }
  { Base b; b.md.shape.partials = static_cast<DecodePartials>(3); expect_arg_error(b.check(), "metadata"); }
  for (DecodePartials f : {DecodePartials::kAuto, DecodePartials::kFp32, DecodePartials::kFp16}) {
    Base b;
    b.md.shape.partials = f;
    EXPECT_TRUE(b.check().ok()) << int(f);
  }
  {
    Base b;
    b.md.shape.topk_length = fake<int32_t>(0x70000);
    b.p.topk_length = fake<int32_t>(0x70000);
    EXPECT_TRUE(b.check().ok());
    b.p.topk_length = fake<int32_t>(0x70010);
    expect_arg_error(b.check(), "metadata");
  }
}

TEST(DecodeChecks, WorkspaceTooSmallSaysHowMuch) {
  Base b;
  ASSERT_GT(b.ws, 0u);
  // Two slots per part: fp32 partials (this shape) are [64, 512] floats 4160 floats apart beyond
  // that, then the partial lse [2 * parts, H]; fp16 partials (H = 128) take [H, 512] floats per
  // slot (values in its first half, the inverse scales after) and the lse.
  ASSERT_FALSE(decode_uses_f16_partials(b.md.shape));
  EXPECT_EQ(b.ws, size_t(2) * 132 * ((64 * 512 + 4160) * 4 + 64 * 4));
  const Base b128(74, 1, 128, 2048);
  ASSERT_TRUE(decode_uses_f16_partials(b128.md.shape));
  EXPECT_EQ(b128.ws, size_t(2) * 66 * (128 * 512 * 4 + 128 * 4));
  const Status st = check_sparse_mla_decode(b.p, b.md, b.ws - 1);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_NE(st.message().find(std::to_string(b.ws)), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("workspace"), std::string::npos);
  // sparse_mla_decode itself fails closed before touching the device.
  const Status st2 = sparse_mla_decode(b.p, b.md, fake<void>(0x80000), b.ws - 1, nullptr);
  EXPECT_EQ(st2.code(), StatusCode::kWorkspaceTooSmall);
}

TEST(DecodeChecks, MakeMetadataValidates) {
  DecodeMetadata md;
  alignas(16) static int32_t buf[64];
  Status st = make_decode_metadata(DecodeShape{2, 2, 96, 128, nullptr, 132}, buf, sizeof(buf), &md, nullptr);
  EXPECT_FALSE(md.valid);
  expect_arg_error(st, "num_heads");
  st = make_decode_metadata(DecodeShape{2, 2, 64, 130, nullptr, 132}, buf, sizeof(buf), &md, nullptr);
  expect_arg_error(st, "topk");
  st = make_decode_metadata(DecodeShape{2, 2, 64, 128, nullptr, 132}, nullptr, sizeof(buf), &md, nullptr);
  expect_arg_error(st, "buffer");
  DecodeShape neg{2, 2, 64, 128, nullptr, 132};
  neg.min_blocks_per_part = -1;
  st = make_decode_metadata(neg, buf, sizeof(buf), &md, nullptr);
  expect_arg_error(st, "min_blocks_per_part");
  DecodeShape bad_fmt{2, 2, 64, 128, nullptr, 132};
  bad_fmt.partials = static_cast<DecodePartials>(7);
  st = make_decode_metadata(bad_fmt, buf, sizeof(buf), &md, nullptr);
  expect_arg_error(st, "partials");
  st = make_decode_metadata(DecodeShape{100, 2, 64, 128, nullptr, 132}, buf, sizeof(buf), &md, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_NE(st.message().find(std::to_string(decode_metadata_size(100, 2))), std::string::npos);
  st = make_decode_metadata(DecodeShape{2, 2, 64, 128, nullptr, -1}, buf, sizeof(buf), &md, nullptr);
  expect_arg_error(st, "num_sms");
}

// The hand-written tile offsets against CuTe's layouts, the epilogue staging, and the producer's
// store offsets (native / MODEL1 and packed lane mappings: every chunk of a K tile written once, at
// the element of the token and dims the lane converts).
TEST(DecodeChecks, SmemLayoutsAgreeWithCute) {
  const std::string err = decode::sm90::check_tile_layouts();
  EXPECT_TRUE(err.empty()) << err;
}

// ---- issue 15: sm_scale rule, overlaps, host bounds, zero rows -------------------------------

TEST(DecodeChecks, SmScaleRule) {
  for (float s : test::bad_sm_scales()) {
    Base b;
    b.p.sm_scale = s;
    SCOPED_TRACE(s);
    expect_arg_error(b.check(), "sm_scale");
    // sparse_mla_decode fails closed before touching the device.
    expect_arg_error(sparse_mla_decode(b.p, b.md, fake<void>(0x80000), b.ws, nullptr), "sm_scale");
  }
  for (float s : test::good_sm_scales()) {
    Base b;
    b.p.sm_scale = s;
    EXPECT_TRUE(b.check().ok()) << s << ": " << b.check().to_string();
  }
}

TEST(DecodeChecks, RejectsAliasingOutputs) {
  // Expanded (stride-0) and too-small strides: distinct (b, s, h) rows would share memory.
  { Base b; b.p.out_seq_stride = 0; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out_batch_stride = 0; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out_seq_stride = 8 * 512; expect_arg_error(b.check(), "out"); }  // < H * 512
  { Base b; b.p.out_batch_stride = b.p.out_seq_stride; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.lse_seq_stride = 0; expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.lse_batch_stride = 0; expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.lse_seq_stride = 63; expect_arg_error(b.check(), "lse"); }  // < H
  { Base b; b.p.lse = fake<float>(0x50002); expect_arg_error(b.check(), "lse"); }  // 4-byte aligned
  { Base b; b.p.indices = fake<int32_t>(0x30002); expect_arg_error(b.check(), "indices"); }
  { Base b; b.p.topk_length = b.md.shape.topk_length = fake<int32_t>(0x70001); expect_arg_error(b.check(), "topk_length"); }
  { Base b; b.p.attn_sink = fake<float>(0x90003); expect_arg_error(b.check(), "attn_sink"); }
  // Stride-0 dims of size 1 carry no information: fine.
  { Base b(1, 1, 64, 128); b.p.out_batch_stride = b.p.out_seq_stride = 0; b.p.lse_batch_stride = b.p.lse_seq_stride = 0;
    EXPECT_TRUE(b.check().ok()) << b.check().to_string(); }
  // Padded (non-dense) layouts that do not alias: fine.
  { Base b; b.p.out_head_stride = 520; b.p.out_seq_stride = 64 * 520 + 8; b.p.out_batch_stride = 4 * 64 * 520;
    b.p.lse_seq_stride = 80; b.p.lse_batch_stride = 200; EXPECT_TRUE(b.check().ok()) << b.check().to_string(); }
}

TEST(DecodeChecks, RejectsOverlapWithAnotherTensor) {
  // out / lse against each other and every input (pointers placed inside another tensor).
  auto inside = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) + bytes; };
  { Base b; b.p.lse = reinterpret_cast<float*>(inside(b.p.out, 4096)); expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out = b.p.lse; expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out = const_cast<void*>(b.p.q); expect_arg_error(b.check(), "out"); }
  { Base b; b.p.out = reinterpret_cast<void*>(inside(b.p.cache.data, 656 * 16)); expect_arg_error(b.check(), "out"); }
  { Base b; b.p.lse = reinterpret_cast<float*>(inside(b.p.q, 1024)); expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.lse = reinterpret_cast<float*>(inside(b.p.indices, 64)); expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.lse = reinterpret_cast<float*>(inside(b.p.cache.data, 0)); expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.topk_length = b.md.shape.topk_length = reinterpret_cast<int32_t*>(inside(b.p.lse, 16));
    expect_arg_error(b.check(), "lse"); }
  { Base b; b.p.attn_sink = reinterpret_cast<float*>(inside(b.p.out, 512)); expect_arg_error(b.check(), "out"); }
  { Base b; b.md.data = reinterpret_cast<int32_t*>(inside(b.p.out, 0)); expect_arg_error(b.check(), "out"); }
  { Base b; b.md.data = reinterpret_cast<int32_t*>(inside(b.p.lse, 0)); expect_arg_error(b.check(), "lse"); }
  // The workspace (split accumulators): sparse_mla_decode checks it before any device call.
  {
    const Base b;
    for (const void* ws : {b.p.q, b.p.cache.data, static_cast<const void*>(b.p.indices),
                           static_cast<const void*>(b.p.out), static_cast<const void*>(b.p.lse),
                           static_cast<const void*>(b.md.data)}) {
      // 16 bytes before the tensor: the workspace's tail runs into it.
      void* w = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ws) - 16);
      expect_arg_error(sparse_mla_decode(b.p, b.md, w, b.ws, nullptr), "workspace");
    }
  }
  // Adjacent but disjoint tensors are fine.
  {
    Base b;
    const uintptr_t out_bytes = uintptr_t(2) * 2 * 64 * 512 * 2;
    b.p.lse = reinterpret_cast<float*>(inside(b.p.out, out_bytes));
    EXPECT_TRUE(b.check().ok()) << b.check().to_string();
  }
}

TEST(DecodeChecks, MakeMetadataRejectsBufferOverTopkLength) {
  alignas(16) static int32_t big[1 << 16];
  ASSERT_LE(decode_metadata_size(2, 2), sizeof(big));
  DecodeMetadata md;
  // The scheduler reads topk_length while it writes the plan (and its lengths snapshot).
  const Status st = make_decode_metadata(DecodeShape{2, 2, 64, 128, big + 40, 132}, big, sizeof(big), &md, nullptr);
  expect_arg_error(st, "buffer");
  EXPECT_NE(st.message().find("topk_length"), std::string::npos) << st.message();
  EXPECT_FALSE(md.valid);
}

TEST(DecodeChecks, BoundsSizesThatReachInt32Arithmetic) {
  alignas(16) static int32_t buf[64];
  DecodeMetadata md;
  for (int32_t mb : {(1 << 29) + 1, INT32_MAX}) {
    DecodeShape s{2, 2, 64, 128, nullptr, 132};
    s.min_blocks_per_part = mb;
    expect_arg_error(make_decode_metadata(s, buf, sizeof(buf), &md, nullptr), "min_blocks_per_part");
    EXPECT_FALSE(md.valid);
  }
  // B * S_q * K / 64 blocks: a part's int32 round counters walk up to all of them.
  expect_arg_error(make_decode_metadata(DecodeShape{1 << 16, 1, 64, 64 * (1 << 13) + 64, nullptr, 132}, buf,
                                        sizeof(buf), &md, nullptr),
                   "batch");
  expect_arg_error(make_decode_metadata(DecodeShape{1, 1, 64, (1 << 30) + 64, nullptr, 132}, buf, sizeof(buf), &md,
                                        nullptr),
                   "topk");
  {
    Base b;
    b.md.min_blocks_per_part = (1 << 29) + 1;  // a plan with a granularity no call accepts
    expect_arg_error(b.check(), "metadata");
  }
}

TEST(DecodeChecks, ZeroRowsAreNoOps) {
  for (auto [B, S] : {std::pair{0, 2}, std::pair{3, 0}, std::pair{0, 0}}) {
    SCOPED_TRACE(std::to_string(B) + "x" + std::to_string(S));
    // The plan: no buffer needed, nothing launched (this binary may have no GPU).
    DecodeMetadata md;
    ASSERT_TRUE(make_decode_metadata(DecodeShape{B, S, 128, 2048, nullptr, 0}, nullptr, 0, &md, nullptr).ok());
    EXPECT_TRUE(md.valid);
    EXPECT_EQ(decode_workspace_size(md), 0u);
    // The call: no pointer is needed, nothing is launched.
    SparseDecodeParams p;
    p.batch = B; p.seq_q = S; p.num_heads = 128; p.topk = 2048;
    p.cache.data = fake<void>(0x20000);
    p.cache.num_blocks = 4; p.cache.page_size = 64; p.cache.block_stride_bytes = 64 * 656;
    p.sm_scale = 0.04f;
    EXPECT_TRUE(check_sparse_mla_decode(p, md, 0).ok()) << check_sparse_mla_decode(p, md, 0).to_string();
    EXPECT_TRUE(sparse_mla_decode(p, md, nullptr, 0, nullptr).ok());
    // Still checked: the shape against the plan, the scale, the configuration.
    SparseDecodeParams bad = p;
    bad.sm_scale = 0.f;
    expect_arg_error(check_sparse_mla_decode(bad, md, 0), "sm_scale");
    bad = p;
    bad.topk = 1024;
    expect_arg_error(check_sparse_mla_decode(bad, md, 0), "metadata");
    bad = p;
    bad.num_heads = 96;
    expect_arg_error(check_sparse_mla_decode(bad, md, 0), "num_heads");
    // With a buffer and dynamic top-k too.
    alignas(16) static int32_t buf[4];
    DecodeMetadata md2;
    ASSERT_TRUE(make_decode_metadata(DecodeShape{B, S, 64, 128, fake<int32_t>(0x70000), 0}, buf, sizeof(buf), &md2,
                                     nullptr)
                    .ok());
    p.num_heads = 64; p.topk = 128; p.topk_length = fake<int32_t>(0x70000);
    EXPECT_TRUE(sparse_mla_decode(p, md2, nullptr, 0, nullptr).ok());
  }
}

#endif  // SELKV_HAVE_CUTLASS

// The default split granularity (decode_params.h, measured): at H = 128 2 blocks under 256 blocks
// in the call, else 4; at H = 64 the call's block count / 128 clamped to [2, 4].
TEST(DecodeChecks, DefaultMinBlocksPerPart) {
  using selkv::decode::min_blocks_per_part;
  EXPECT_EQ(min_blocks_per_part(128, 4 * 32), 2);   // B = 2 S_q = 2, K = 2048
  EXPECT_EQ(min_blocks_per_part(128, 1), 2);
  EXPECT_EQ(min_blocks_per_part(128, 255), 2);
  EXPECT_EQ(min_blocks_per_part(128, 256), 4);
  EXPECT_EQ(min_blocks_per_part(128, 128 * 32), 4);  // B = 64 S_q = 2
  EXPECT_EQ(min_blocks_per_part(64, 1), 1);
  EXPECT_EQ(min_blocks_per_part(64, 32), 1);   // B = 1 S_q = 1, K = 2048
  EXPECT_EQ(min_blocks_per_part(64, 40), 1);   // MODEL1 B = 2 S_q = 2, K 128 + K2 512
  EXPECT_EQ(min_blocks_per_part(64, 79), 1);
  EXPECT_EQ(min_blocks_per_part(64, 80), 2);
  EXPECT_EQ(min_blocks_per_part(64, 96), 2);   // B = 1 S_q = 3, K = 2048
  EXPECT_EQ(min_blocks_per_part(64, 128), 2);
  EXPECT_EQ(min_blocks_per_part(64, 256), 2);
  EXPECT_EQ(min_blocks_per_part(64, 384), 3);
  EXPECT_EQ(min_blocks_per_part(64, 512), 4);
  EXPECT_EQ(min_blocks_per_part(64, int64_t(1) << 40), 4);
}

// Fixed top-k plans at the default granularity (decode_params.h, measured): H = 64 takes 2
// blocks where the call-size rule says 3, and whole-row pieces of the balanced cut's longest part
// L when L divides the row (T / L parts, fewer than the cut's). Arguments: heads, T blocks,
// blocks per row, the plan's part count (132 SMs: 132 at H = 64, 66 clusters at H = 128).
TEST(DecodeChecks, FixedTopkMinBlocksPerPart) {
  using selkv::decode::effective_parts;
  using selkv::decode::fixed_min_blocks_per_part;
  EXPECT_EQ(fixed_min_blocks_per_part(64, 32, 32, 132), 1);     // B = 1 S_q = 1, K = 2048
  EXPECT_EQ(fixed_min_blocks_per_part(64, 256, 32, 132), 2);    // 8 rows: 128 parts of 2
  EXPECT_EQ(fixed_min_blocks_per_part(64, 384, 32, 132), 2);    // 12 rows: 3 -> 2
  EXPECT_EQ(fixed_min_blocks_per_part(64, 448, 32, 132), 4);    // 14 rows: 112 parts of 4
  EXPECT_EQ(fixed_min_blocks_per_part(64, 512, 32, 132), 4);    // 16 rows: 128 parts of 4 already
  EXPECT_EQ(fixed_min_blocks_per_part(64, 768, 32, 132), 4);    // 24 rows: L = 6 does not divide 32
  EXPECT_EQ(fixed_min_blocks_per_part(64, 1024, 32, 132), 8);   // 32 rows: 128 parts of 8
  EXPECT_EQ(fixed_min_blocks_per_part(64, 3584, 32, 132), 4);   // 112 rows: L = 28
  EXPECT_EQ(fixed_min_blocks_per_part(64, 40, 10, 132), 1);     // MODEL1 B = 2 S_q = 2, K 128 + K2 512
  EXPECT_EQ(fixed_min_blocks_per_part(64, 1280, 10, 132), 10);  // MODEL1 B = 64: one row a part
  EXPECT_EQ(fixed_min_blocks_per_part(128, 192, 32, 66), 2);    // 6 rows: L = 3
  EXPECT_EQ(fixed_min_blocks_per_part(128, 224, 32, 66), 4);    // 7 rows: 56 parts of 4
  EXPECT_EQ(fixed_min_blocks_per_part(128, 256, 32, 66), 4);    // 8 rows: 64 parts of 4 already
  EXPECT_EQ(fixed_min_blocks_per_part(128, 512, 32, 66), 8);    // 16 rows: 64 parts of 8
  EXPECT_EQ(fixed_min_blocks_per_part(128, 72, 18, 66), 2);     // MODEL1 B = 2, K 128 + K2 1024
  // The property: never a longer part than the call-size rule's cut, never more parts.
  for (int heads : {64, 128})
    for (int32_t bpr : {1, 2, 3, 10, 18, 32, 256})
      for (int32_t rows = 1; rows <= 160; ++rows) {
        const int32_t T = rows * bpr, P = heads == 64 ? 132 : 66;
        int32_t m0 = int32_t(selkv::decode::min_blocks_per_part(heads, T));
        if (heads == 64 && m0 == 3) m0 = 2;
        const int32_t m = fixed_min_blocks_per_part(heads, T, bpr, P);
        const int32_t np0 = effective_parts(T, m0, P), np = effective_parts(T, m, P);
        ASSERT_LE(np, np0) << heads << " " << bpr << " " << rows;
        ASSERT_EQ((T - 1) / np + 1, (T - 1) / np0 + 1) << heads << " " << bpr << " " << rows;
        if (m != m0) ASSERT_EQ(bpr % m, 0) << heads << " " << bpr << " " << rows;
      }
}

// The partial format a plan uses (DecodeShape::partials; kAuto: fp32 only at H = 64 up to 4096
// block-heads, the smallest calls, where the fp16 epilogue's cold code costs more; else fp16).
TEST(DecodeChecks, PartialFormatByShape) {
  auto uses_f16 = [](int B, int S, int H, int K, DecodePartials f = DecodePartials::kAuto) {
    DecodeShape s{B, S, H, K, nullptr, 132};
    s.partials = f;
    return decode_uses_f16_partials(s);
  };
  EXPECT_FALSE(uses_f16(1, 1, 64, 2048));   // 32 blocks x 64 heads
  EXPECT_FALSE(uses_f16(1, 2, 64, 2048));   // 4096: the last fp32 one
  EXPECT_FALSE(uses_f16(2, 1, 64, 2048));
  EXPECT_TRUE(uses_f16(1, 3, 64, 2048));
  EXPECT_TRUE(uses_f16(1, 4, 64, 2048));
  EXPECT_TRUE(uses_f16(8, 1, 64, 2048));
  EXPECT_TRUE(uses_f16(1, 1, 128, 1024));   // H = 128: always fp16
  EXPECT_TRUE(uses_f16(1, 2, 128, 2048));
  EXPECT_TRUE(uses_f16(64, 2, 128, 2048));
  EXPECT_TRUE(uses_f16(1, 1, 64, 2048, DecodePartials::kFp16));
  EXPECT_FALSE(uses_f16(64, 2, 128, 2048, DecodePartials::kFp32));
}

// The fp16 partials' scale (DecodePartials::kFp16): exact powers of two, inverse exact, the
// scaled max in [2^13, 2^14) over the whole float range it can reach, 1 for 0 / inf / nan.
TEST(DecodeChecks, F16PartialScale) {
  using selkv::decode::f16_partial_scale;
  auto is_pow2 = [](float x) {
    int e = 0;
    return x > 0.f && std::frexp(x, &e) == 0.5f;
  };
  for (float m : {1e-30f, 6e-8f, 1e-6f, 0.37f, 1.f, 8191.f, 8192.f, 16383.f, 65504.f, 3e4f, 1e9f, 3e38f}) {
    const auto s = f16_partial_scale(m);
    EXPECT_TRUE(is_pow2(s.scale) && is_pow2(s.inv)) << m;
    EXPECT_EQ(s.scale * s.inv, 1.f) << m;
    const float v = m * s.scale;  // exact: a power-of-two scale
    EXPECT_GE(v, 8192.f) << m;
    EXPECT_LT(v, 16384.f) << m;
  }
  // Clamped at the ends of the normal range: still a finite, exact pair, never above fp16's max.
  for (float m : {1e-40f, 1.2e-38f}) {
    const auto s = f16_partial_scale(m);
    EXPECT_TRUE(is_pow2(s.scale) && is_pow2(s.inv)) << m;
    EXPECT_LT(m * s.scale, 16384.f) << m;
  }
  for (float m : {0.f, INFINITY, NAN}) {
    const auto s = f16_partial_scale(m);
    EXPECT_EQ(s.scale, 1.f);
    EXPECT_EQ(s.inv, 1.f);
  }
}

// The scheduler's closed-form partition, as the decode and combine kernels read it: every block
// belongs to exactly one part, each part writes at most two partial slots (2p, 2p+1), and the
// combine's slot choice matches the kernel's.
// Whole rows per part (no split, no combine) only where the longest part grows by at most
// min(kSplitCostBlocks, balanced / 8) blocks over the balanced cut (rows = B * S_q, K / 64 blocks).
TEST(DecodeChecks, FixedScheduleWholeRows) {
  using namespace selkv::decode;
  EXPECT_EQ(fixed_part_unit(128, 32, 66), 32);   // H128 B=64 S_q=2: 64 vs 63 blocks
  EXPECT_EQ(fixed_part_unit(256, 32, 66), 32);   // H128 B=128 S_q=2 and B=256 S_q=1: 128 vs 125
  EXPECT_EQ(fixed_part_unit(256, 16, 66), 16);   // K=1024 B=256: 64 vs 63
  EXPECT_EQ(fixed_part_unit(256, 32, 132), 32);  // H64 B=64 S_q=4: 64 vs 63
  EXPECT_EQ(fixed_part_unit(148, 32, 66), 1);    // H128 B=74 S_q=2: 96 vs 72
  EXPECT_EQ(fixed_part_unit(256, 256, 66), 1);   // K=16384 B=128 S_q=2: 1024 vs 993
  EXPECT_EQ(fixed_part_unit(64, 32, 132), 1);    // H64 B=64 S_q=1: 32 vs 16
  EXPECT_EQ(fixed_part_unit(4, 32, 32), 1);      // H128 B=2 S_q=2
  EXPECT_EQ(fixed_part_unit(1, 32, 1), 32);      // one part: nothing to split
  EXPECT_EQ(fixed_part_unit(4, 10, 20), 1);      // MODEL1 K 128 + K2 512, B=2 S_q=2: 10 vs 2 blocks
  EXPECT_EQ(fixed_part_unit(4, 10, 4), 10);      // one row per part either way
  EXPECT_EQ(fixed_part_unit(148, 10, 132), 1);   // MODEL1 H64 B=74: 20 vs 12 blocks
  EXPECT_EQ(fixed_part_unit(296, 10, 132), 1);   // MODEL1 H64 B=148: 30 vs 23
  EXPECT_EQ(fixed_part_unit(512, 10, 132), 10);  // MODEL1 H64 B=256: 40 vs 39
  EXPECT_EQ(fixed_part_unit(256, 18, 66), 18);   // MODEL1 H128 K2 1K B=128: 72 vs 70
  const FixedSchedule s(128, 2048, 4, 66);
  EXPECT_FALSE(s.has_split_rows());
  EXPECT_EQ(s.begin(1), 32);  // floor(1 * 128 / 66) = 1 row
  EXPECT_EQ(s.begin(66), 128 * 32);
}

// The kernels' fixed schedule comes from the host's FixedPartition (no division in a CTA): the same
// part starts (part_begin) and rows as the schedule computed from the shape, up to int32 totals.
TEST(DecodeChecks, FixedPartitionMatchesTheShapeSchedule) {
  using namespace selkv::decode;
  auto check = [](int32_t rows, int32_t bpr, int32_t min_blocks, int32_t num_sm_parts) {
    const FixedSchedule a(rows, bpr * kBlockTokens, min_blocks, num_sm_parts);
    const FixedPartSchedule b(rows, FixedPartition(a));
    ASSERT_EQ(b.np, a.np);
    ASSERT_EQ(b.total, a.total);
    ASSERT_EQ(b.unit, a.unit);
    ASSERT_EQ(b.blocks_per_row, a.blocks_per_row);
    for (int32_t q = 0; q <= a.np; ++q) {
      const int32_t ref = part_begin(q, a.total, a.np, a.unit);
      ASSERT_EQ(b.begin(q), ref) << rows << " rows, " << bpr << " blocks, part " << q;
      if (q < a.np) ASSERT_EQ(b.row_of_part(q), ref / bpr);
    }
  };
  for (int32_t rows = 1; rows <= 300; rows += rows < 40 ? 1 : 7)
    for (int32_t bpr : {1, 2, 3, 17, 18, 32, 34, 256})
      for (int32_t min_blocks : {1, 2, 4, 9})
        for (int32_t parts : {1, 7, 66, 132, 1024}) check(rows, bpr, min_blocks, parts);
  for (int32_t parts : {66, 132, 1024}) {  // totals near 2^31
    check((1 << 21) - 1, 1024, 4, parts);
    check((1 << 23) + 3, 255, 4, parts);
  }
}

TEST(DecodeChecks, SchedulerPartitionArithmetic) {
  using namespace selkv::decode;
  for (int min_blocks : {1, 2, 3, 4, 7})
  for (int np : {1, 2, 3, 7, 66, 132}) {
    for (const std::vector<int>& blocks :
         {std::vector<int>{1}, std::vector<int>{32}, std::vector<int>(74, 1), std::vector<int>(4, 32),
          std::vector<int>{1, 1, 2, 3, 32, 1, 16, 2}, std::vector<int>(256, 32), std::vector<int>(300, 3)}) {
      const int rows = int(blocks.size());
      std::vector<int> P(rows + 1, 0);
      for (int r = 0; r < rows; ++r) P[r + 1] = P[r] + blocks[r];
      const int T = P[rows];
      const int np_balanced = std::min(np, std::max(1, (T + min_blocks - 1) / min_blocks));
      ASSERT_EQ(effective_parts(T, min_blocks, np), np_balanced);
      const bool uniform = std::all_of(blocks.begin(), blocks.end(), [&](int n) { return n == blocks[0]; });
      // Four cuts: balanced (dynamic default), fixed top-k's granule (whole rows when cheap), the
      // dynamic row-start cut and the dynamic row-piece cut. Each as the list of part begins, checked by brute force.
      const int fixed_unit = uniform ? fixed_part_unit(rows, blocks[0], np_balanced) : 1;
      std::vector<int> balanced(np_balanced + 1), fixed_cut(np_balanced + 1), row_start(np_balanced + 1), pieces;
      for (int q = 0; q <= np_balanced; ++q) {
        balanced[q] = part_begin(q, T, np_balanced);
        fixed_cut[q] = part_begin(q, T, np_balanced, fixed_unit);
        row_start[q] = row_start_part_begin(P.data(), rows, T, np_balanced, q);
      }
      // The row-piece cut (as the scheduler writes it): each row in pieces of min_blocks blocks.
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < row_pieces(blocks[r], min_blocks); ++j) pieces.push_back(P[r] + j * min_blocks);
      const int num_pieces = int(pieces.size());
      pieces.push_back(T);
      enum Cut { kBalanced, kFixed, kRowStart, kRowPieces };
      for (Cut cut : {kBalanced, kFixed, kRowStart, kRowPieces}) {
      if (cut == kFixed && !uniform) continue;
      if (cut == kRowPieces && num_pieces > np) continue;  // the scheduler takes it only when it fits
      const int npe = cut == kRowPieces ? num_pieces : np_balanced;
      const std::vector<int>& begins =
          cut == kBalanced ? balanced : cut == kFixed ? fixed_cut : cut == kRowStart ? row_start : pieces;
      ASSERT_EQ(begins[0], 0);
      ASSERT_EQ(begins[npe], T);
      std::vector<int> owner(T, -1);
      std::set<std::pair<int, int>> kernel_slots;  // (row, slot) written by the kernel
      for (int p = 0; p < npe; ++p) {
        const int g0 = begins[p], g1 = begins[p + 1];
        ASSERT_LE(g0, g1);
        if (cut == kFixed) ASSERT_EQ(g0 % fixed_unit, 0);
        if (cut == kRowStart) ASSERT_TRUE(std::binary_search(P.begin(), P.end(), g0)) << "part " << p;
        if (cut == kRowPieces) {  // within one row, at most min_blocks blocks: never straddles
          ASSERT_LE(g1 - g0, min_blocks);
          ASSERT_EQ(row_containing(P.data(), rows, g0), row_containing(P.data(), rows, g1 - 1)) << "part " << p;
        }
        for (int g = g0; g < g1; ++g) {
          ASSERT_EQ(owner[g], -1);
          owner[g] = p;
          if (cut == kBalanced || cut == kFixed)
            ASSERT_EQ(part_of(g, T, npe, cut == kFixed ? fixed_unit : 1), p) << "g=" << g;
        }
        if (g0 >= g1) continue;
        int r = 0;
        while (r + 1 < rows && P[r + 1] <= g0) ++r;
        for (int g = g0; g < g1; ++r) {
          const int rb = P[r], re = P[r + 1];
          const bool split = !(rb >= g0 && re <= g1);
          const int slot = 2 * p + (rb <= g0 ? 0 : 1);  // as PartIter::next
          if (split) {
            ASSERT_TRUE(slot == 2 * p || slot == 2 * p + 1);
            ASSERT_TRUE(kernel_slots.insert({r, slot}).second);
          }
          g = std::min(g1, re);
        }
      }
      for (int g = 0; g < T; ++g) ASSERT_NE(owner[g], -1);
      // Cuts at row starts split no row (fixed: the launcher then skips the combine).
      if ((cut == kFixed && fixed_unit == blocks[0]) || cut == kRowStart) ASSERT_TRUE(kernel_slots.empty());
      // The schedule views the kernels read: the scheduler's tables (dynamic) and, when every row
      // has the same block count, the closed form (fixed); both must give the same rows and the
      // same split rows as the brute force above.
      std::vector<int32_t> md(size_t(md_ints(rows, rows)), 0);
      const int topk = 64 * *std::max_element(blocks.begin(), blocks.end());
      md_write_header(md.data(), T, npe, rows, min_blocks,
                      cut == kRowStart ? DecodeCut::kRowStarts
                                       : cut == kRowPieces ? DecodeCut::kRowPieces : DecodeCut::kBalanced,
                      0, topk);
      for (int r = 0; r <= rows; ++r) md[size_t(kMdPrefix + r)] = P[r];
      for (int q = 0; q < npe; ++q) {
        const int r = row_containing(md.data() + kMdPrefix, rows, std::min(begins[q], T - 1));
        // The scheduler's entry (lengths: any value; the kernels only pass them through).
        const int32_t e[kMdPartEntryInts] = {begins[q], begins[q + 1], r, P[r], P[r + 1],
                                             P[std::min(r + 2, rows)], 64 * r + 1, 64 * r + 65};
        std::copy(e, e + kMdPartEntryInts, md.begin() + kMdPartEntry + kMdPartEntryInts * q);
      }
      const DynamicSchedule dyn(md.data(), rows, topk, min_blocks, np);
      ASSERT_TRUE(dyn.valid());
      // A header that does not describe the call leaves no part with work (never a garbage walk).
      for (int field : {0, 1, 2, 3, 4, 7}) {
        std::vector<int32_t> bad(md);
        bad[size_t(field)] = field == 0 ? rows * (topk / 64) + 1 : field == 1 ? np + 1 : bad[size_t(field)] ^ 0x40;
        const DynamicSchedule d(bad.data(), rows, topk, min_blocks, np);
        ASSERT_FALSE(d.valid()) << "header field " << field;
        ASSERT_EQ(d.np, 0);
        ASSERT_EQ(d.total, 0);
      }
      auto check_schedule = [&](const auto& sched) {
        ASSERT_EQ(sched.total, T);
        ASSERT_EQ(sched.np, npe);
        for (int r = 0; r <= rows; ++r) ASSERT_EQ(sched.prefix(r), P[r]);
        for (int q = 0; q <= npe; ++q) ASSERT_EQ(sched.begin(q), begins[q]);
        for (int g = 0; g < T; ++g) ASSERT_EQ(sched.part_of_block(g), owner[g]) << "g=" << g;
        for (int q = 0; q < npe; ++q) {
          const int g0 = begins[q];
          if (g0 >= begins[q + 1]) continue;
          const int r = sched.row_of_part(q);
          ASSERT_TRUE(r >= 0 && r < rows && P[r] <= g0 && g0 < P[r + 1]) << "part " << q;
          // Dynamic: the part's start entry (what a decode CTA reads first), decoded by start().
          if constexpr (std::is_same_v<std::decay_t<decltype(sched)>, DynamicSchedule>) {
            const PartStart ps = sched.start(q);
            ASSERT_EQ(ps.g0, g0);
            ASSERT_EQ(ps.g1, begins[q + 1]);
            ASSERT_EQ(ps.r, r);
            ASSERT_EQ(ps.rb, P[r]);
            ASSERT_EQ(ps.re, P[r + 1]);
            ASSERT_EQ(ps.re2, P[std::min(r + 2, rows)]) << "part " << q;
            ASSERT_EQ(ps.len, 64 * r + 1);
            ASSERT_EQ(ps.len2, 64 * r + 65);
          }
        }
        // Every split row is merged by exactly one combine CTA (the one of its first part), with
        // the kernel's slots.
        std::set<int> merged;
        for (int q = 0; q < npe; ++q) {
          const SplitRow sr = split_row_of_part(sched, q);
          if (sr.num_parts == 0) continue;
          const int r = sr.row;
          const int first = owner[P[r]], last = owner[P[r + 1] - 1];
          ASSERT_NE(first, last) << "row " << r << " is not split";
          ASSERT_EQ(sr.first_part, first);
          ASSERT_EQ(sr.num_parts, last - first + 1);
          ASSERT_TRUE(kernel_slots.count({r, sr.first_slot})) << "row " << r;
          for (int i = 1; i < sr.num_parts; ++i) ASSERT_TRUE(kernel_slots.count({r, 2 * (first + i)}));
          ASSERT_TRUE(merged.insert(r).second) << "row " << r << " merged twice";
        }
        size_t split_rows = 0;
        for (int r = 0; r < rows; ++r) split_rows += owner[P[r]] != owner[P[r + 1] - 1];
        ASSERT_EQ(merged.size(), split_rows);
      };
      if (cut != kFixed) check_schedule(dyn);
      if (cut == kFixed) {
        const FixedSchedule fixed(rows, 64 * blocks[0], min_blocks, np);
        ASSERT_EQ(fixed.unit, fixed_unit);
        ASSERT_EQ(fixed.has_split_rows(), fixed_unit != blocks[0]);
        check_schedule(fixed);
      }
      // The combine's view of each split row.
      size_t combine_slots = 0;
      std::set<int> used_slots;
      for (int r = 0; r < rows; ++r) {
        const int first = owner[P[r]], last = owner[P[r + 1] - 1];
        if (first == last) continue;
        for (int q = first; q <= last; ++q) {
          if (begins[q] >= begins[q + 1]) continue;  // an empty part holds nothing of the row
          const int slot = 2 * q + (begins[q] >= P[r] ? 0 : 1);
          ASSERT_TRUE(kernel_slots.count({r, slot})) << "row " << r << " part " << q;
          ASSERT_TRUE(used_slots.insert(slot).second);
          ++combine_slots;
        }
      }
      EXPECT_EQ(combine_slots, kernel_slots.size());
      }
    }
  }
}

}  // namespace
