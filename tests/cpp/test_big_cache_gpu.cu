// Caches larger than 4 GiB: records at byte offsets around 2^31 and 2^32 and at the very end of
// the cache, through C1 write_kv_cache, C3 gather_kv_bf16, C4 dequant_selected_kv and C5 decode
// (ds_mla_fp8 and nope_fp8 where the op takes it). Every other byte of the cache is 0xFF (E4M3
// NaN, NaN scales), so a read at a wrong (e.g. 32-bit wrapped) offset shows as NaN or as a
// mismatch. The oracle runs on a small host cache holding copies of just the touched pages, with
// indices / block tables remapped to it. Needs ~5 GiB of device memory per case; skipped with
// SELKV_TEST_BIG=0 (gpu_suite.sh sets it for memcheck). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"
#include "selkv/dequant.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
#include "selkv/decode.h"
#endif

namespace {

using namespace selkv;
using selkv::test::DevBuf;
using selkv::test::down;
using selkv::test::test_seed;
using selkv::test::up;

// A run of consecutive physical slots.
struct Cluster {
  int64_t first = 0;
  int count = 0;
};

struct BigCache {
  KvFormat format;
  int page;
  int64_t num_blocks, stride;
  std::unique_ptr<DevBuf> dev;
  PagedKvCache view() const { return PagedKvCache{dev->ptr, num_blocks, page, stride, format}; }
  int64_t bytes() const { return num_blocks * stride; }
  int64_t num_slots() const { return num_blocks * page; }
};

// The slot whose record holds byte `x` (or the next record when x falls in block padding).
int64_t slot_at_byte(const BigCache& c, int64_t x) {
  const int64_t block = x / c.stride;
  const int64_t in_page = std::min<int64_t>((x % c.stride) / fmt::record_bytes(c.format), c.page - 1);
  return block * c.page + in_page;
}

// Clusters of 5 slots centred on the records holding bytes 2^31 and 2^32, the last 3 slots,
// and slots 0..1 (the first page).
std::vector<Cluster> make_clusters(const BigCache& c) {
  std::vector<Cluster> v;
  v.push_back({0, 2});
  for (int64_t x : {int64_t(1) << 31, int64_t(1) << 32}) {
    const int64_t s = slot_at_byte(c, x);
    v.push_back({s - 2, 5});
  }
  v.push_back({c.num_slots() - 3, 3});
  return v;
}

bool alloc_big(BigCache* c, KvFormat f, int page, int64_t stride_pad) {
  c->format = f;
  c->page = page;
  c->stride = int64_t(page) * fmt::record_bytes(f) + stride_pad;
  const int64_t target = int64_t(9) << 29;  // 4.5 GiB
  c->num_blocks = (target + c->stride - 1) / c->stride;
  c->dev = std::make_unique<DevBuf>(size_t(c->bytes()));
  if (!c->dev->ptr) return false;
  return cudaMemset(c->dev->ptr, 0xFF, size_t(c->bytes())) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

// Host copies of the pages that hold the clusters' slots (mini block i = big block big_block[i],
// the blocks of cluster 0, then of cluster 1, ...), and the map big slot -> mini slot.
struct MiniCache {
  std::vector<uint8_t> bytes;
  int64_t num_blocks = 0;
  std::vector<int64_t> big_block;           // per mini block
  std::vector<std::vector<int32_t>> table;  // per cluster: its mini blocks
  int64_t mini_slot(const BigCache& c, int64_t big_slot) const {
    const int64_t b = big_slot / c.page;
    for (size_t i = 0; i < big_block.size(); ++i)
      if (big_block[i] == b) return int64_t(i) * c.page + big_slot % c.page;
    return -1;
  }
};

// The layout, every byte 0xFF.
MiniCache mini_layout(const BigCache& c, const std::vector<Cluster>& cl) {
  MiniCache m;
  for (const Cluster& k : cl) {
    m.table.emplace_back();
    for (int64_t b = k.first / c.page; b <= (k.first + k.count - 1) / c.page; ++b) {
      m.table.back().push_back(int32_t(m.big_block.size()));
      m.big_block.push_back(b);
    }
  }
  m.num_blocks = int64_t(m.big_block.size());
  m.bytes.assign(size_t(m.num_blocks * c.stride), 0xFF);
  return m;
}

MiniCache copy_pages(const BigCache& c, const std::vector<Cluster>& cl) {
  MiniCache m = mini_layout(c, cl);
  for (size_t i = 0; i < m.big_block.size(); ++i)
    EXPECT_EQ(cudaMemcpy(m.bytes.data() + i * c.stride, c.dev->as<uint8_t>(size_t(m.big_block[i] * c.stride)),
                         size_t(c.stride), cudaMemcpyDeviceToHost),
              cudaSuccess);
  return m;
}

// C1: writes every cluster slot; the bytes of each cluster's pages must equal the oracle's
// encoding with 0xFF around it.
void write_clusters(BigCache& c, const std::vector<Cluster>& cl, std::mt19937_64& rng) {
  std::vector<int64_t> slots;
  for (const Cluster& k : cl)
    for (int i = 0; i < k.count; ++i) slots.push_back(k.first + i);
  slots.push_back(-1);                   // skipped
  slots.push_back(c.num_slots());        // out of range: skipped
  slots.push_back(int64_t(1) << 40);     // far out of range: skipped
  const int64_t T = int64_t(slots.size());
  const auto kv = test::randn_bf16(size_t(T) * 576, 0.3f, rng);
  DevBuf dkv(kv.size() * 2), dslots(slots.size() * 8);
  up(dkv, kv);
  up(dslots, slots);
  WriteKvCacheParams w;
  w.latent = dkv.ptr; w.latent_row_stride = 576;
  w.rope = fmt::has_rope(c.format) ? dkv.as<void>(1024) : nullptr; w.rope_row_stride = 576;
  w.slot_mapping = dslots.as<int64_t>(); w.num_tokens = T;
  w.cache = c.dev->ptr; w.num_blocks = c.num_blocks; w.page_size = c.page; w.block_stride_bytes = c.stride;
  w.format = c.format; w.scale_mode = ScaleMode::kAmax;
  ST_OK(write_kv_cache(w, nullptr));
  ASSERT_TRUE(test::sync_or_abort(nullptr, "C1 big cache"));
  // Oracle on the mini cache (same pages, remapped slots).
  MiniCache want = mini_layout(c, cl);
  std::vector<int64_t> mini_slots(slots.size(), -1);
  for (size_t t = 0; t + 3 < slots.size(); ++t) mini_slots[t] = want.mini_slot(c, slots[t]);
  WriteKvCacheParams h = w;
  h.latent = kv.data(); h.rope = fmt::has_rope(c.format) ? kv.data() + 512 : nullptr;
  h.slot_mapping = mini_slots.data(); h.cache = want.bytes.data(); h.num_blocks = want.num_blocks;
  ST_OK(ref::write_kv_cache(h));
  const MiniCache got = copy_pages(c, cl);
  EXPECT_TRUE(test::bits_equal(want.bytes, got.bytes)) << "C1: pages around 2^31 / 2^32 / the end";
}

// C3: one request per cluster (block table row {b, b + 1}, start inside the page), gathered from
// the big cache vs the oracle's gather from the mini cache.
void gather_clusters(const BigCache& c, const std::vector<Cluster>& cl, const MiniCache& m) {
  const int reqs = int(cl.size()), D = fmt::dequant_dim(c.format);
  int max_blocks = 1;
  for (const auto& t : m.table) max_blocks = std::max(max_blocks, int(t.size()));
  std::vector<int32_t> bt(size_t(reqs) * max_blocks, -1), mbt(size_t(reqs) * max_blocks, -1), starts, lens, ws;
  int32_t row = 0;
  for (int r = 0; r < reqs; ++r) {
    const std::vector<int32_t>& t = m.table[size_t(r)];
    for (size_t j = 0; j < t.size(); ++j) {
      mbt[size_t(r) * max_blocks + j] = t[j];
      bt[size_t(r) * max_blocks + j] = int32_t(m.big_block[size_t(t[j])]);
    }
    starts.push_back(int32_t(cl[size_t(r)].first % c.page));
    lens.push_back(cl[size_t(r)].count);
    ws.push_back(row);
    row += cl[size_t(r)].count + 1;  // a gap row: never written
  }
  const int64_t out_rows = row;
  std::vector<uint16_t> out(size_t(out_rows) * D, 0xFFBF);
  DevBuf dbt(bt.size() * 4), dst(starts.size() * 4), dln(lens.size() * 4), dws(ws.size() * 4), dout(out.size() * 2);
  up(dbt, bt); up(dst, starts); up(dln, lens); up(dws, ws); up(dout, out);
  GatherKvParams g;
  g.cache = c.dev->ptr; g.num_blocks = c.num_blocks; g.page_size = c.page; g.block_stride_bytes = c.stride;
  g.format = c.format; g.block_table = dbt.as<int32_t>(); g.block_table_row_stride = max_blocks; g.max_blocks_per_req = max_blocks;
  g.seq_starts = dst.as<int32_t>(); g.seq_lens = dln.as<int32_t>(); g.ws_starts = dws.as<int32_t>();
  g.num_reqs = reqs; g.out = dout.ptr; g.out_row_stride = D; g.out_rows = out_rows;
  ST_OK(gather_kv_bf16(g, nullptr));
  ASSERT_TRUE(test::sync_or_abort(nullptr, "C3 big cache"));
  GatherKvParams h = g;
  h.cache = m.bytes.data(); h.num_blocks = m.num_blocks; h.block_table = mbt.data();
  h.seq_starts = starts.data(); h.seq_lens = lens.data(); h.ws_starts = ws.data(); h.out = out.data();
  ST_OK(ref::gather_kv_bf16(h));
  EXPECT_TRUE(test::bits_equal(out, dout.download<uint16_t>())) << "C3 gather around 2^31 / 2^32 / the end";
  for (uint16_t v : out) ASSERT_FALSE(v != 0xFFBF && (v & 0x7FFF) > 0x7F80) << "C3: a NaN: a record was read at a wrong offset";
}

// Indices [T, K]: the clusters' slots, then garbage (-1, INT_MAX, INT_MIN, num_slots, ...).
std::vector<int32_t> cluster_indices(const BigCache& c, const std::vector<Cluster>& cl, int T, int K, std::mt19937_64& rng) {
  std::vector<int32_t> all;
  for (const Cluster& k : cl)
    for (int i = 0; i < k.count; ++i) all.push_back(int32_t(k.first + i));
  const int32_t garbage[] = {-1, INT_MAX, INT_MIN, int32_t(c.num_slots()), int32_t(c.num_slots() + 1), -3};
  std::vector<int32_t> idx(size_t(T) * K);
  for (int t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < K; ++k) idx[size_t(t) * K + k] = k < int(all.size()) ? all[size_t(k)] : garbage[rng() % 6];
    std::shuffle(idx.begin() + size_t(t) * K, idx.begin() + size_t(t + 1) * K, rng);
  }
  return idx;
}

std::vector<int32_t> remap(const BigCache& c, const MiniCache& m, const std::vector<int32_t>& idx) {
  std::vector<int32_t> r(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    const int32_t v = idx[i];
    r[i] = v >= 0 && v < c.num_slots() ? int32_t(m.mini_slot(c, v)) : -1;
  }
  return r;
}

// C4 (selected mode: N = T * K is far below P).
void dequant_clusters(const BigCache& c, const std::vector<Cluster>& cl, const MiniCache& m, std::mt19937_64& rng) {
  const int T = 3, K = 64, D = fmt::dequant_dim(c.format);
  const std::vector<int32_t> idx = cluster_indices(c, cl, T, K, rng), midx = remap(c, m, idx);
  std::vector<int32_t> len = {K, 5, 0};
  const int64_t rows = dequant_selected_workspace_rows(T, K, c.num_slots());
  ASSERT_EQ(rows, int64_t(T) * K);
  for (bool dyn : {false, true}) {
    std::vector<uint16_t> wsb(size_t(rows) * D, 0xFFC1);
    std::vector<int32_t> oi(idx.size(), 0x55555555);
    DevBuf didx(idx.size() * 4), dlen(len.size() * 4), dwsb(wsb.size() * 2), doi(oi.size() * 4);
    up(didx, idx); up(dlen, len); up(dwsb, wsb); up(doi, oi);
    DequantSelectedParams p;
    p.cache = c.view();
    p.indices = didx.as<int32_t>(); p.indices_row_stride = K; p.topk_length = dyn ? dlen.as<int32_t>() : nullptr;
    p.num_tokens = T; p.topk = K;
    p.workspace = dwsb.ptr; p.workspace_rows = rows; p.workspace_row_stride = D;
    p.out_indices = doi.as<int32_t>(); p.out_indices_row_stride = K;
    ST_OK(dequant_selected_kv(p, nullptr));
    ASSERT_TRUE(test::sync_or_abort(nullptr, "C4 big cache"));
    // The oracle's cache must also be larger than N, so that it takes the same (selected) mode:
    // the mini cache plus blank (0xFF) blocks.
    const int64_t blocks = std::max(m.num_blocks, rows / c.page + 2);
    std::vector<uint8_t> host(size_t(blocks * c.stride), 0xFF);
    std::copy(m.bytes.begin(), m.bytes.end(), host.begin());
    ASSERT_EQ(dequant_selected_mode(T, K, blocks * c.page), DequantMode::kSelected);
    DequantSelectedParams h = p;
    h.cache = PagedKvCache{host.data(), blocks, c.page, c.stride, c.format};
    h.indices = midx.data(); h.topk_length = dyn ? len.data() : nullptr;
    h.workspace = wsb.data(); h.out_indices = oi.data();
    ST_OK(ref::dequant_selected(h));
    EXPECT_TRUE(test::bits_equal(wsb, dwsb.download<uint16_t>())) << "C4 workspace, dyn " << dyn;
    EXPECT_TRUE(test::bits_equal(oi, doi.download<int32_t>())) << "C4 remapped indices, dyn " << dyn;
  }
}

#ifdef SELKV_HAVE_CUTLASS
// C5: B = 2, S_q = 2 rows selecting the clusters' slots among garbage, fixed and dynamic top-k.
void decode_clusters(const BigCache& c, const std::vector<Cluster>& cl, const MiniCache& m, std::mt19937_64& rng) {
  const int B = 2, S = 2, H = 64, K = 64;
  const std::vector<int32_t> idx = cluster_indices(c, cl, B * S, K, rng), midx = remap(c, m, idx);
  const std::vector<int32_t> len = {K, 9};
  const auto q = test::randn_bf16(size_t(B) * S * H * 576, 1.f, rng);
  const float sm_scale = std::pow(576.f, -0.55f);
  for (bool dyn : {false, true}) {
    DevBuf dq(q.size() * 2), didx(idx.size() * 4), dlen(8), dout(size_t(B) * S * H * 512 * 2), dlse(size_t(B) * S * H * 4);
    up(dq, q); up(didx, idx); up(dlen, len);
    SparseDecodeParams p;
    p.q = dq.ptr; p.batch = B; p.seq_q = S; p.num_heads = H; p.topk = K;
    p.cache = c.view();
    p.indices = didx.as<int32_t>();
    p.topk_length = dyn ? dlen.as<int32_t>() : nullptr;
    p.sm_scale = sm_scale;
    p.out = dout.ptr; p.lse = dlse.as<float>();
    set_contiguous_strides(&p);
    DecodeShape shape{B, S, H, K, p.topk_length, 0};
    DevBuf dmd(decode_metadata_size(B, S));
    DecodeMetadata md;
    ST_OK(make_decode_metadata(shape, dmd.ptr, dmd.bytes, &md, nullptr));
    DevBuf dws(decode_workspace_size(md));
    ST_OK(sparse_mla_decode(p, md, dws.ptr, dws.bytes, nullptr));
    ASSERT_TRUE(test::sync_or_abort(nullptr, "C5 big cache"));
    std::vector<float> ro(size_t(B) * S * H * 512), rl(size_t(B) * S * H);
    ref::SparseDecodeRefArgs a;
    a.q = q.data(); a.B = B; a.S_q = S; a.H = H;
    a.cache = PagedKvCache{m.bytes.data(), m.num_blocks, c.page, c.stride, KvFormat::kDsMlaFp8};
    a.indices = midx.data(); a.K = K; a.topk_length = dyn ? len.data() : nullptr;
    a.sm_scale = sm_scale; a.out = ro.data(); a.lse = rl.data();
    ref::sparse_decode(a);
    for (float v : rl) ASSERT_FALSE(std::isnan(v)) << "oracle NaN: a cluster slot was not written";
    // Dynamic: batch entry 1 attends over at most 9 tokens. FlashMLA's per-element tolerance is
    // calibrated on thousands of tokens, where the bf16 rounding of P averages out; over a handful
    // one element can miss it by a few ulps (seen: 3 ulps at seed 2409753757), so those rows take
    // DESIGN §5's scale-free check (8 ulps of the row max, relative L2, cosine). A misread record
    // (0xFF fill) is NaN and fails either check.
    test::expect_decode_close(down<uint16_t>(dout, ro.size()), down<float>(dlse, rl.size()), ro, rl,
                              std::string("C5 big cache") + (dyn ? " dyn" : ""), /*scale_free=*/dyn);
  }
}
#endif

void run_big_case(KvFormat f, int page, int64_t stride_pad, uint64_t salt) {
  SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " format " + std::to_string(int(f)) + " page " +
               std::to_string(page) + " pad " + std::to_string(stride_pad));
  std::mt19937_64 rng(test_seed() * 0x9E3779B97F4A7C15ull + salt);
  BigCache c;
  ASSERT_TRUE(alloc_big(&c, f, page, stride_pad)) << "could not allocate and fill a " << (c.num_blocks * c.stride >> 20)
                                                  << " MiB cache";
  ASSERT_GT(c.bytes(), int64_t(1) << 32);
  const std::vector<Cluster> cl = make_clusters(c);
  // The clusters do reach past 2^31 and 2^32 and the last slot is in them.
  const PagedKvCache v = c.view();
  ASSERT_LT(v.slot_offset(cl[1].first), int64_t(1) << 31);
  ASSERT_GT(v.slot_offset(cl[1].first + 4), int64_t(1) << 31);
  ASSERT_LT(v.slot_offset(cl[2].first), int64_t(1) << 32);
  ASSERT_GT(v.slot_offset(cl[2].first + 4), int64_t(1) << 32);
  ASSERT_EQ(cl.back().first + cl.back().count, c.num_slots());
  write_clusters(c, cl, rng);
  if (::testing::Test::HasFatalFailure()) return;
  const MiniCache m = copy_pages(c, cl);
  gather_clusters(c, cl, m);
  dequant_clusters(c, cl, m, rng);
#ifdef SELKV_HAVE_CUTLASS
  if (f == KvFormat::kDsMlaFp8) decode_clusters(c, cl, m, rng);
#endif
}

TEST(BigCacheGpu, DsMlaFp8SlotsPast2And4GiB) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  run_big_case(KvFormat::kDsMlaFp8, 64, 0, 1);
}

TEST(BigCacheGpu, DsMlaFp8OddPagePaddedStride) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  run_big_case(KvFormat::kDsMlaFp8, 61, 48, 2);
}

TEST(BigCacheGpu, NopeFp8SlotsPast2And4GiB) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  run_big_case(KvFormat::kNopeFp8, 64, 0, 3);
}

TEST(BigCacheGpu, PageSizeOne) {
  SELKV_REQUIRE_GPU();
  SELKV_REQUIRE_BIG_TESTS();
  run_big_case(KvFormat::kDsMlaFp8, 1, 0, 4);
}

}  // namespace
