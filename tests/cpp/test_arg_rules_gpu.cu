// Issue 15 on the GPU: calls with zero rows are no-ops for every op, eagerly and captured in a
// CUDA graph (they launch nothing, touch no buffer, and need no pointer), and an output that
// overlaps an input is rejected before anything is enqueued. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "selkv/selkv.h"
#include "test_util.h"

namespace {

using namespace selkv;
using selkv::test::DevBuf;

constexpr uint8_t kSentinel = 0x5A;
constexpr size_t kArena = size_t(1) << 20;

// One device arena standing in for every tensor of a zero-row call (each at its own offset, all
// 16-byte aligned), filled with a sentinel that must survive the call.
struct Arena {
  DevBuf buf{kArena};
  Arena() { EXPECT_EQ(cudaMemset(buf.ptr, kSentinel, kArena), cudaSuccess); }
  template <typename T = void>
  T* at(int slot) const { return buf.as<T>(size_t(slot) * 64 * 1024); }
  void expect_untouched(const std::string& what) const {
    const std::vector<uint8_t> h = buf.download<uint8_t>();
    size_t changed = 0;
    for (uint8_t b : h) changed += b != kSentinel;
    EXPECT_EQ(changed, 0u) << what << ": a zero-row call wrote " << changed << " bytes";
  }
};

// Runs `call` (which enqueues on the stream it is given) eagerly, then captured into a graph
// between two marker memsets (so the graph is not empty) and replayed twice.
void run_eager_and_graph(const std::string& what, const std::function<void(cudaStream_t)>& call) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call(stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  DevBuf marker(16);
  // On `stream` (non-blocking: it does not wait for the legacy stream), so the clearing cannot land
  // after the graph's marker writes.
  CUDA_OK(cudaMemsetAsync(marker.ptr, 0, 16, stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(cudaMemsetAsync(marker.ptr, 1, 8, stream));
  call(stream);
  CUDA_OK(cudaMemsetAsync(marker.as<uint8_t>(8), 2, 8, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  const std::vector<uint8_t> m = marker.download<uint8_t>();
  EXPECT_EQ(m[0], 1) << what << ": the graph did not run";
  EXPECT_EQ(m[15], 2) << what << ": the graph did not run";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(ArgRulesGpu, ZeroRowCacheOpsAreNoOps) {
  SELKV_REQUIRE_GPU();
  const Arena a;
  for (bool null_ptrs : {false, true}) {
    const std::string tag = null_ptrs ? " (null pointers)" : " (real pointers)";
    auto ptr = [&](int slot) { return null_ptrs ? nullptr : a.at(slot); };
    // C1: T = 0.
    WriteKvCacheParams w;
    w.latent = ptr(1); w.latent_row_stride = 512; w.rope = ptr(2); w.rope_row_stride = 64;
    w.slot_mapping = static_cast<const int64_t*>(ptr(3));
    w.cache = a.at(4); w.num_blocks = 1; w.page_size = 64; w.block_stride_bytes = 64 * 656;
    run_eager_and_graph("write_kv_cache" + tag, [&](cudaStream_t s) { ST_OK(write_kv_cache(w, s)); });
    // C2: 0 rows, with and without valid counts.
    ConvertIndicesParams c;
    c.req_local_indices = static_cast<const int32_t*>(ptr(1)); c.indices_row_stride = 64;
    c.req_id_per_token = static_cast<const int32_t*>(ptr(2));
    c.block_table = static_cast<const int32_t*>(ptr(3)); c.block_table_row_stride = 8;
    c.num_reqs = 1; c.max_blocks_per_req = 8; c.topk = 64; c.page_size = 64; c.num_blocks = 8;
    c.out_slots = static_cast<int32_t*>(ptr(4)); c.out_row_stride = 64;
    c.valid_counts = static_cast<int32_t*>(ptr(5)); c.compact = true;
    run_eager_and_graph("convert (counts)" + tag, [&](cudaStream_t s) { ST_OK(convert_req_indices_to_slots(c, s)); });
    c.valid_counts = nullptr;
    run_eager_and_graph("convert" + tag, [&](cudaStream_t s) { ST_OK(convert_req_indices_to_slots(c, s)); });
    // C3: 0 requests.
    GatherKvParams g;
    g.cache = a.at(1); g.num_blocks = 1; g.page_size = 64; g.block_stride_bytes = 64 * 656;
    g.block_table = static_cast<const int32_t*>(ptr(2)); g.block_table_row_stride = 1; g.max_blocks_per_req = 1;
    g.seq_starts = static_cast<const int32_t*>(ptr(3)); g.seq_lens = static_cast<const int32_t*>(ptr(3));
    g.ws_starts = static_cast<const int32_t*>(ptr(3));
    g.out = ptr(4); g.out_row_stride = 576; g.out_rows = 8;
    run_eager_and_graph("gather_kv_bf16" + tag, [&](cudaStream_t s) { ST_OK(gather_kv_bf16(g, s)); });
    // C4: 0 rows (and 0 entries per row).
    for (auto [T, K] : {std::pair<int64_t, int32_t>{0, 64}, std::pair<int64_t, int32_t>{5, 0}}) {
      DequantSelectedParams d;
      d.cache = PagedKvCache{a.at(1), 1, 64, 64 * 528, KvFormat::kNopeFp8};
      d.indices = static_cast<const int32_t*>(ptr(2)); d.indices_row_stride = 64;
      d.num_tokens = T; d.topk = K;
      d.workspace = ptr(3); d.workspace_row_stride = 512;
      d.out_indices = static_cast<int32_t*>(ptr(4)); d.out_indices_row_stride = 64;
      run_eager_and_graph("dequant_selected_kv" + tag, [&](cudaStream_t s) { ST_OK(dequant_selected_kv(d, s)); });
    }
  }
  a.expect_untouched("cache ops");
}

#ifdef SELKV_HAVE_CUTLASS  // decode and prefill kernels need the CUTLASS headers

// A mixed batch without decode rows: B = 0 (or S_q = 0) plans and decodes, fixed and dynamic
// top-k, with and without pointers; the metadata buffer and every tensor stay untouched.
TEST(ArgRulesGpu, ZeroRowDecodeIsANoOp) {
  SELKV_REQUIRE_GPU();
  const Arena a;
  for (auto [B, S] : {std::pair{0, 2}, std::pair{4, 0}}) {
    for (bool dyn : {false, true}) {
      for (bool null_ptrs : {false, true}) {
        const std::string what = "B" + std::to_string(B) + " S" + std::to_string(S) + (dyn ? " dyn" : "") +
                                 (null_ptrs ? " null" : "");
        auto ptr = [&](int slot) { return null_ptrs ? nullptr : a.at(slot); };
        DecodeShape shape{B, S, 128, 2048, dyn ? a.at<int32_t>(6) : nullptr, 0};
        SparseDecodeParams p;
        p.q = ptr(1);
        p.batch = B; p.seq_q = S; p.num_heads = 128; p.topk = 2048;
        p.cache.data = a.at(2); p.cache.num_blocks = 1; p.cache.page_size = 64; p.cache.block_stride_bytes = 64 * 656;
        p.indices = static_cast<const int32_t*>(ptr(3));
        p.topk_length = shape.topk_length;
        p.sm_scale = 0.04f;
        p.out = ptr(4);
        p.lse = static_cast<float*>(ptr(5));
        set_contiguous_strides(&p);
        void* mbuf = null_ptrs ? nullptr : a.at(7);
        const size_t mbytes = null_ptrs ? 0 : decode_metadata_size(B, S);
        run_eager_and_graph("decode " + what, [&](cudaStream_t s) {
          DecodeMetadata md;
          ST_OK(make_decode_metadata(shape, mbuf, mbytes, &md, s));
          ASSERT_TRUE(md.valid);
          ASSERT_EQ(decode_workspace_size(md), 0u);
          ST_OK(sparse_mla_decode(p, md, null_ptrs ? nullptr : a.at(8), 0, s));
        });
      }
    }
  }
  a.expect_untouched("decode");
}

TEST(ArgRulesGpu, ZeroTokenPrefillAndComposedAreNoOps) {
  SELKV_REQUIRE_GPU();
  const Arena a;
  for (bool null_ptrs : {false, true}) {
    const std::string tag = null_ptrs ? " (null pointers)" : " (real pointers)";
    auto ptr = [&](int slot) { return null_ptrs ? nullptr : a.at(slot); };
    SparsePrefillParams c7;
    c7.q = ptr(1); c7.num_tokens = 0; c7.num_heads = 64; c7.d_qk = 512;
    c7.kv = ptr(2); c7.num_kv = 16;
    c7.indices = static_cast<const int32_t*>(ptr(3)); c7.topk = 128;
    c7.sm_scale = 0.04f;
    c7.out = ptr(4); c7.max_logits = static_cast<float*>(ptr(5)); c7.lse = static_cast<float*>(ptr(6));
    set_contiguous_strides(&c7);
    run_eager_and_graph("sparse_mla_prefill" + tag, [&](cudaStream_t s) { ST_OK(sparse_mla_prefill(c7, s)); });

    DequantPrefillParams dq;
    dq.attn = c7;
    dq.attn.kv = nullptr; dq.attn.kv_row_stride = 0; dq.attn.num_kv = 0;
    dq.cache = PagedKvCache{a.at(9), 1, 64, 64 * 528, KvFormat::kNopeFp8};
    dq.workspace = ptr(10);
    dq.workspace_bytes = dequant_prefill_workspace_size(0, 128, 64, KvFormat::kNopeFp8);
    run_eager_and_graph("dequant_sparse_mla_prefill" + tag,
                        [&](cudaStream_t s) { ST_OK(dequant_sparse_mla_prefill(dq, s)); });

    GatherPrefillParams gp;
    gp.attn = dq.attn;
    gp.gather.cache = a.at(9); gp.gather.num_blocks = 1; gp.gather.page_size = 64;
    gp.gather.block_stride_bytes = 64 * 528; gp.gather.format = KvFormat::kNopeFp8;
    gp.gather.block_table = static_cast<const int32_t*>(ptr(11)); gp.gather.block_table_row_stride = 1;
    gp.gather.max_blocks_per_req = 1;
    gp.gather.seq_starts = gp.gather.seq_lens = gp.gather.ws_starts = static_cast<const int32_t*>(ptr(12));
    gp.gather.num_reqs = null_ptrs ? 0 : 1;
    gp.num_kv_rows = null_ptrs ? 0 : 8;
    gp.workspace = null_ptrs ? nullptr : a.at(13);
    gp.workspace_bytes = gather_prefill_workspace_size(gp.num_kv_rows, KvFormat::kNopeFp8);
    run_eager_and_graph("gather_sparse_mla_prefill" + tag,
                        [&](cudaStream_t s) { ST_OK(gather_sparse_mla_prefill(gp, s)); });
  }
  a.expect_untouched("prefill");
}

// Outputs overlapping inputs are rejected before anything is enqueued, also during capture (the
// capture stays valid and the graph records nothing of the failed call).
TEST(ArgRulesGpu, OverlapRejectedBeforeLaunch) {
  SELKV_REQUIRE_GPU();
  const Arena a;
  SparsePrefillParams c7;
  c7.q = a.at(1); c7.num_tokens = 2; c7.num_heads = 64; c7.d_qk = 512;
  c7.kv = a.at(2); c7.num_kv = 16;
  c7.indices = a.at<const int32_t>(3); c7.topk = 64;
  c7.sm_scale = 0.04f;
  c7.out = a.at(1);  // out == q
  set_contiguous_strides(&c7);
  run_eager_and_graph("prefill out == q", [&](cudaStream_t s) {
    const Status st = sparse_mla_prefill(c7, s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("out:"), std::string::npos) << st.message();
  });
  ConvertIndicesParams c;
  c.req_local_indices = a.at<const int32_t>(1); c.indices_row_stride = 64;
  c.req_id_per_token = a.at<const int32_t>(2);
  c.num_tokens = 4; c.topk = 64; c.page_size = 64; c.num_blocks = 8;
  c.out_slots = a.at<int32_t>(3); c.out_row_stride = 64;
  c.valid_counts = a.at<int32_t>(2);  // aliases req_id_per_token
  run_eager_and_graph("convert valid_counts == req_id_per_token", [&](cudaStream_t s) {
    const Status st = convert_req_indices_to_slots(c, s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("valid_counts:"), std::string::npos) << st.message();
  });
  a.expect_untouched("rejected calls");
}

#endif  // SELKV_HAVE_CUTLASS

}  // namespace
