// C6 on the GPU: sparse_mla_decode_packed over a buffer made by pack_selected_kv (and
// patch_packed_kv) against the native decode with the same plan (bitwise: the same kernel reads the
// same records in the same order) and against the oracle (DESIGN §5). Seed 000's five cases, every
// invalid-index class, NaN-poisoned records that no valid entry selects and tails past
// topk_length, odd page sizes, a pack on a second stream, graph replay, patch then attend, and the
// argument rules. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "selkv/packed.h"
#include "test_util.h"

#ifdef SELKV_HAVE_CUTLASS
#include "attn_gpu_runner.h"

namespace selkv::test {
namespace {

struct PackedRun {
  DecodeOut native, packed;
  std::vector<uint8_t> buffer;  // the packed KV buffer as the decode read it
};

// The pack of a native decode's cache and indices, and the packed decode of the same call
// (q, outputs, lengths, sink and scale as in `sp`), over the buffer `pk`.
PackSelectedKvParams pack_params_of(const SparseDecodeParams& sp, void* pk, size_t bytes) {
  PackSelectedKvParams p;
  p.cache = sp.cache;
  p.indices = sp.indices;
  p.indices_batch_stride = sp.indices_batch_stride;
  p.indices_seq_stride = sp.indices_seq_stride;
  p.batch = sp.batch;
  p.seq_q = sp.seq_q;
  p.topk = sp.topk;
  p.topk_length = sp.topk_length;
  p.packed_kv = pk;
  p.packed_kv_bytes = bytes;
  return p;
}
PackedDecodeParams packed_params_of(const SparseDecodeParams& sp, const void* pk, size_t bytes) {
  PackedDecodeParams p;
  p.q = sp.q;
  p.q_batch_stride = sp.q_batch_stride;
  p.q_seq_stride = sp.q_seq_stride;
  p.q_head_stride = sp.q_head_stride;
  p.batch = sp.batch;
  p.seq_q = sp.seq_q;
  p.num_heads = sp.num_heads;
  p.packed_kv = pk;
  p.packed_kv_bytes = bytes;
  p.topk = sp.topk;
  p.topk_length = sp.topk_length;
  p.attn_sink = sp.attn_sink;
  p.sm_scale = sp.sm_scale;
  p.out = sp.out;
  p.out_batch_stride = sp.out_batch_stride;
  p.out_seq_stride = sp.out_seq_stride;
  p.out_head_stride = sp.out_head_stride;
  p.lse = sp.lse;
  p.lse_batch_stride = sp.lse_batch_stride;
  p.lse_seq_stride = sp.lse_seq_stride;
  return p;
}

// One plan; the native decode on `stream`; the pack on a second stream (an event orders the
// decode after it); the packed decode with the same plan and workspace. False on any failure.
bool run_native_and_packed(const DecodeProblem& p, const DecodeRunOpts& o, PackedRun* r, const std::string& what) {
  DecodeDevice d(p, o.layout);
  cudaStream_t stream, side;
  cudaEvent_t packed_ev;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaEventCreateWithFlags(&packed_ev, cudaEventDisableTiming), cudaSuccess);
  bool ok = true;
  auto check = [&](const Status& s, const char* step) {
    if (!s.ok()) {
      ADD_FAILURE() << what << ": " << step << ": " << s.to_string();
      ok = false;
    }
  };
  DevBuf dmd(decode_metadata_size(p.B, p.S));
  DecodeMetadata md;
  check(make_decode_metadata(d.shape(o.num_sms, o.min_blocks, o.partials), dmd.ptr, dmd.bytes, &md, stream), "plan");
  const size_t pbytes = packed_kv_workspace_size(p.B, p.S, p.K);
  EXPECT_GT(pbytes, 0u) << what;
  DevBuf dpk(pbytes);
  // Whatever the buffer held before, the pack rewrites all of it.
  EXPECT_EQ(cudaMemset(dpk.ptr, 0xA5, pbytes), cudaSuccess);
  if (ok) {
    DevBuf dws(decode_workspace_size(md));
    d.poison_outputs(stream);
    check(sparse_mla_decode(d.sp, md, dws.ptr, dws.bytes, stream), "native decode");
    ok = sync_or_abort(stream, what + " native") && ok;
    if (ok) r->native = d.read(what + " native");

    const PackSelectedKvParams pk = pack_params_of(d.sp, dpk.ptr, pbytes);
    check(pack_selected_kv(pk, side), "pack");
    EXPECT_EQ(cudaEventRecord(packed_ev, side), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(stream, packed_ev, 0), cudaSuccess);

    const PackedDecodeParams pd = packed_params_of(d.sp, dpk.ptr, pbytes);
    d.poison_outputs(stream);
    check(sparse_mla_decode_packed(pd, md, dws.ptr, dws.bytes, stream), "packed decode");
    ok = sync_or_abort(stream, what + " packed") && ok;
    if (ok) {
      r->packed = d.read(what + " packed");
      r->buffer.resize(pbytes);
      EXPECT_EQ(cudaMemcpy(r->buffer.data(), dpk.ptr, pbytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }
  cudaEventDestroy(packed_ev);
  cudaStreamDestroy(side);
  cudaStreamDestroy(stream);
  return ok;
}

bool bitwise_equal(const DecodeOut& a, const DecodeOut& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 2) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

// The packed oracle over the GPU's buffer equals the native oracle exactly (the same records in
// the same order), and the GPU result is within DESIGN §5 of it.
void check_packed_case(const DecodeProblem& p, const DecodeRunOpts& o = {}) {
  const std::string what = decode_name(p, o);
  PackedRun r;
  if (!run_native_and_packed(p, o, &r, what)) return;
  EXPECT_TRUE(bitwise_equal(r.native, r.packed)) << what << ": packed decode differs from native decode";
  std::vector<float> ref_out, ref_lse;
  decode_oracle(p, &ref_out, &ref_lse);
  std::vector<float> pk_out(ref_out.size()), pk_lse(ref_lse.size());
  ref::SparseDecodePackedRefArgs a;
  a.q = p.q.data(); a.B = p.B; a.S_q = p.S; a.H = p.H;
  a.packed_kv = r.buffer.data(); a.packed_kv_bytes = r.buffer.size(); a.K = p.K;
  a.topk_length = p.topk_length.empty() ? nullptr : p.topk_length.data();
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.sink.empty() ? nullptr : p.sink.data();
  a.out = pk_out.data(); a.lse = pk_lse.data();
  ref::sparse_decode_packed(a);
  EXPECT_EQ(std::memcmp(pk_out.data(), ref_out.data(), ref_out.size() * 4), 0) << what << ": packed oracle";
  EXPECT_EQ(std::memcmp(pk_lse.data(), ref_lse.data(), ref_lse.size() * 4), 0) << what << ": packed oracle lse";
  expect_decode_close(r.packed.out, r.packed.lse, ref_out, ref_lse, what);
}

DecodeGenOpts gen(int B, int S, int H, int K, bool dynamic, std::vector<int32_t> lens = {}) {
  DecodeGenOpts g;
  g.B = B; g.S = S; g.H = H; g.K = K; g.dynamic = dynamic; g.lens = std::move(lens);
  g.s_kv = std::max<int64_t>(K + 64, 512);
  g.garbage_rate = 0.f;
  g.dup_rate = 0.f;
  return g;
}

// Seed 000's five cases (valid prefixes, as the seed's test builds them).
TEST(PackedDecodeGpu, SeedCases) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(1000);
  const DecodeGenOpts cases[] = {
      gen(1, 1, 64, 64, false),                                    // a single full boundary tile
      gen(4, 2, 64, 256, true, {1, 63, 65, 200}),                  // H = 64 partial tails, heterogeneous
      gen(2, 8, 64, 2048, false),                                  // H = 64, B * S_q = 16, full top-k
      gen(2, 2, 128, 2048, false),                                 // full top-k, H = 128
      gen(3, 2, 128, 512, true, {64, 130, 511}),                   // H = 128 heterogeneous tails
  };
  for (const DecodeGenOpts& g : cases) check_packed_case(make_decode_problem(g, rng));
}

// Every invalid-index class inside rows, duplicates, an all-garbage row, NaN-poisoned tails past
// topk_length and NaN records no valid entry selects; odd page sizes and padded block strides; the
// split schedules (few SMs, fine granularity) and the NaN rules (a NaN byte / scale / q value
// reaches exactly the rows it reaches natively).
TEST(PackedDecodeGpu, GarbageIndicesNaNAndPages) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(1001);
  struct C { int B, S, H, K, page; bool dyn; int64_t pad; int sms, minblk; };
  const C cases[] = {
      {3, 2, 64, 256, 2, true, 16, 0, 0},     {2, 3, 128, 192, 61, true, 0, 0, 1},
      {4, 1, 64, 128, 69, false, 32, 7, 1},   {2, 2, 128, 320, 64, false, 0, 5, 0},
      {5, 1, 128, 128, 61, true, 16, 3, 1},   {1, 4, 64, 512, 2, true, 0, 0, 2},
  };
  for (const C& c : cases) {
    DecodeGenOpts g;
    g.B = c.B; g.S = c.S; g.H = c.H; g.K = c.K; g.page = c.page; g.dynamic = c.dyn; g.stride_pad = c.pad;
    g.s_kv = 3 * c.K;
    g.empty_row = c.B * c.S > 1 ? 1 : -1;
    DecodeProblem p = make_decode_problem(g, rng);
    poison_decode(p, kNanE4m3 | kNanScale | kNanQ, g.empty_row, rng);
    if (c.H == 128) {
      p.sink.resize(size_t(c.H));
      for (int h = 0; h < c.H; ++h) p.sink[size_t(h)] = h % 5 == 0 ? -INFINITY : 0.25f * float(h % 7) - 0.5f;
    }
    DecodeRunOpts o;
    o.num_sms = c.sms;
    o.min_blocks = c.minblk;
    check_packed_case(p, o);
  }
}

// Strided q / out / lse / indices as the native decode takes them.
TEST(PackedDecodeGpu, StridedTensors) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(1002);
  DecodeGenOpts g = gen(2, 3, 64, 192, true, {100, 192});
  g.garbage_rate = 0.05f;
  DecodeProblem p = make_decode_problem(g, rng);
  DecodeRunOpts o;
  o.layout.q_head = 8; o.layout.q_seq = 16; o.layout.q_batch = 8;
  o.layout.out_head = 8; o.layout.out_seq = 8; o.layout.out_batch = 24;
  o.layout.lse_seq = 4; o.layout.lse_batch = 4;
  o.layout.idx_seq = 4; o.layout.idx_batch = 8;
  check_packed_case(p, o);
}

// Pack + packed decode captured in a CUDA graph: replays bitwise equal to the eager run.
TEST(PackedDecodeGpu, GraphReplayIsBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(1003);
  for (int H : {64, 128}) {
    DecodeGenOpts g = gen(3, 2, H, 256, true, {256, 77, 0});
    g.garbage_rate = 0.05f;
    DecodeProblem p = make_decode_problem(g, rng);
    DecodeDevice d(p);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    DevBuf dmd(decode_metadata_size(p.B, p.S));
    const size_t pbytes = packed_kv_workspace_size(p.B, p.S, p.K);
    DevBuf dpk(pbytes);
    DecodeMetadata md;
    ASSERT_TRUE(make_decode_metadata(d.shape(), dmd.ptr, dmd.bytes, &md, stream).ok());
    DevBuf dws(decode_workspace_size(md));
    const PackSelectedKvParams pk = pack_params_of(d.sp, dpk.ptr, pbytes);
    const PackedDecodeParams pd = packed_params_of(d.sp, dpk.ptr, pbytes);
    auto step = [&] {
      EXPECT_TRUE(make_decode_metadata(d.shape(), dmd.ptr, dmd.bytes, &md, stream).ok());
      EXPECT_TRUE(pack_selected_kv(pk, stream).ok());
      EXPECT_TRUE(sparse_mla_decode_packed(pd, md, dws.ptr, dws.bytes, stream).ok());
    };
    step();
    ASSERT_TRUE(sync_or_abort(stream, "eager"));
    const DecodeOut eager = d.read("eager");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    step();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int rep = 0; rep < 3; ++rep) {
      d.poison_outputs(stream);
      EXPECT_EQ(cudaMemsetAsync(dpk.ptr, rep * 0x37, pbytes, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_TRUE(sync_or_abort(stream, "replay"));
      EXPECT_TRUE(bitwise_equal(eager, d.read("replay"))) << "H" << H << " replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// The runtime pattern of seed 000: pack the history while the current token's slot still holds
// stale bytes, write the token's KV, patch its entries, attend: equal to the native decode over the
// updated cache (bitwise, same plan). The current token is selected by every row of its request.
TEST(PackedDecodeGpu, PatchThenAttendEqualsNativeOverUpdatedCache) {
  SELKV_REQUIRE_GPU();
  std::mt19937_64 rng(1004);
  for (int H : {64, 128}) {
    DecodeGenOpts g = gen(3, 2, H, 192, true, {192, 100, 1});
    DecodeProblem p = make_decode_problem(g, rng);
    // Each request's current token: a slot of the spare block no row selected so far (its bytes
    // are NaN until written), placed at a random position below the row's length.
    const PagedKvCache v = p.view();
    std::vector<int64_t> positions;
    std::vector<int32_t> cur_slot(size_t(p.B));
    for (int b = 0; b < p.B; ++b) {
      cur_slot[size_t(b)] = int32_t(p.num_slots() - 2 - b);
      for (int s = 0; s < p.S; ++s) {
        const int r = b * p.S + s, k = int(rng() % uint64_t(std::max(p.limit(r), 1)));
        if (p.limit(r) == 0) continue;
        p.indices[size_t(r) * p.K + k] = cur_slot[size_t(b)];
        positions.push_back(int64_t(r) * p.K + k);
      }
    }
    DecodeProblem stale = p;  // the current slots hold NaN bytes (make_decode_problem's fill)
    for (int b = 0; b < p.B; ++b) {
      const auto latent = randn_bf16(fmt::kNopeDim, g.data_std, rng);
      const auto rope = randn_bf16(fmt::kRopeDim, g.data_std, rng);
      ref::encode_record(latent.data(), rope.data(), KvFormat::kDsMlaFp8, ScaleMode::kPow2,
                         p.cache.data() + v.slot_offset(cur_slot[size_t(b)]));
    }
    std::vector<uint8_t> records;
    for (int64_t e : positions) {
      const int b = int(e / p.K) / p.S;
      const uint8_t* rec = p.cache.data() + v.slot_offset(cur_slot[size_t(b)]);
      records.insert(records.end(), rec, rec + fmt::kDsMlaRecordBytes);
    }
    positions.push_back(-1);  // graph padding: skipped
    records.resize(records.size() + fmt::kDsMlaRecordBytes, 0xFF);

    DecodeDevice ds(stale), dn(p);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    DevBuf dmd(decode_metadata_size(p.B, p.S));
    DecodeMetadata md;
    ASSERT_TRUE(make_decode_metadata(dn.shape(), dmd.ptr, dmd.bytes, &md, stream).ok());
    DevBuf dws(decode_workspace_size(md));
    const size_t pbytes = packed_kv_workspace_size(p.B, p.S, p.K);
    DevBuf dpk(pbytes), dpos(positions.size() * 8), drec(records.size());
    up(dpos, positions);
    up(drec, records);
    const PackSelectedKvParams pk = pack_params_of(ds.sp, dpk.ptr, pbytes);
    ASSERT_TRUE(pack_selected_kv(pk, stream).ok());
    PatchPackedKvParams pt;
    pt.packed_kv = dpk.ptr; pt.packed_kv_bytes = pbytes;
    pt.batch = p.B; pt.seq_q = p.S; pt.topk = p.K;
    pt.positions = dpos.as<int64_t>(); pt.num_records = int64_t(positions.size());
    pt.records = static_cast<const uint8_t*>(drec.ptr); pt.record_stride_bytes = fmt::kDsMlaRecordBytes;
    ASSERT_TRUE(patch_packed_kv(pt, stream).ok());
    // q from the updated-cache problem (the same q), outputs in the stale device's buffers
    PackedDecodeParams pd = packed_params_of(dn.sp, dpk.ptr, pbytes);
    pd.out = ds.sp.out;
    pd.lse = ds.sp.lse;
    ds.poison_outputs(stream);
    ASSERT_TRUE(sparse_mla_decode_packed(pd, md, dws.ptr, dws.bytes, stream).ok());
    dn.poison_outputs(stream);
    ASSERT_TRUE(sparse_mla_decode(dn.sp, md, dws.ptr, dws.bytes, stream).ok());
    ASSERT_TRUE(sync_or_abort(stream, "patch"));
    const DecodeOut packed = ds.read("patched"), native = dn.read("native");
    EXPECT_TRUE(bitwise_equal(native, packed)) << "H" << H << ": patch then attend differs from native";
    for (float l : packed.lse) EXPECT_FALSE(std::isnan(l)) << "H" << H << ": a stale NaN record was attended";
    cudaStreamDestroy(stream);
  }
}

TEST(PackedDecodeGpu, ArgumentRules) {
  SELKV_REQUIRE_GPU();
  DevBuf dmd(decode_metadata_size(2, 1)), dq(2 * 64 * 576 * 2), dout(2 * 64 * 512 * 2), dlse(2 * 64 * 4);
  const size_t pbytes = packed_kv_workspace_size(2, 1, 128);
  ASSERT_EQ(pbytes, size_t(2 * 128 * 656 + 2 * 128 / 8 + 16));  // records, validity words, shape words
  DevBuf dpk(pbytes);
  DecodeMetadata md;
  ASSERT_TRUE(make_decode_metadata({2, 1, 64, 128, nullptr, 0}, dmd.ptr, dmd.bytes, &md, nullptr).ok());
  DevBuf dws(decode_workspace_size(md));
  PackedDecodeParams pd;
  pd.batch = 2; pd.seq_q = 1; pd.num_heads = 64; pd.topk = 128;
  set_contiguous_strides(&pd);
  pd.q = dq.ptr; pd.packed_kv = dpk.ptr; pd.packed_kv_bytes = pbytes;
  pd.sm_scale = 0.1f; pd.out = dout.ptr; pd.lse = dlse.as<float>();
  EXPECT_TRUE(sparse_mla_decode_packed(pd, md, dws.ptr, dws.bytes, nullptr).ok());
  auto expect_error = [&](PackedDecodeParams x, const std::string& needle) {
    const Status s = sparse_mla_decode_packed(x, md, dws.ptr, dws.bytes, nullptr);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.to_string().find(needle), std::string::npos) << s.to_string();
  };
  PackedDecodeParams x = pd;
  x.packed_kv_bytes = pbytes - 1;
  expect_error(x, "needs " + std::to_string(pbytes) + " bytes");
  x = pd; x.packed_kv = nullptr; expect_error(x, "packed_kv");
  x = pd; x.packed_kv = static_cast<uint8_t*>(dpk.ptr) + 8; expect_error(x, "packed_kv");
  x = pd; x.num_heads = 96; expect_error(x, "num_heads");
  x = pd; x.topk = 100; expect_error(x, "topk");
  x = pd; x.sm_scale = -1.f; expect_error(x, "sm_scale");
  x = pd; x.out = dpk.ptr; expect_error(x, "packed_kv");  // out inside the packed buffer
  x = pd; x.topk = 192; expect_error(x, "metadata");      // not the plan's shape
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace selkv::test
#endif  // SELKV_HAVE_CUTLASS
