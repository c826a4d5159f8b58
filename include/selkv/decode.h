// selkv/decode.h — C5: FP8 sparse MLA decode on SM90 (DESIGN §3 C5, docs/decode-design.md).
//
//   q [B, S_q, H, D] bf16, paged FP8 cache, indices [B, S_q, K] int32 physical slots
//   -> out [B, S_q, H, 512] bf16, lse [B, S_q, H] fp32 (natural log).
//   ds_mla_fp8: D = 576 (V = the first 512 dims of K); model1_fp8: D = 512 (V = all of K).
//   model1_fp8 only: an optional extra KV cache (FlashMLA's extra_k_cache) with its own page
//   size, indices [B, S_q, K2] and extra_topk_length; one softmax over the valid entries of both
//   selections (one out, one lse).
//
// Usage (all asynchronous on `stream`, no host sync, no allocation, CUDA-graph capturable):
//   size_t mbytes = decode_metadata_size(B, S_q);            // caller allocates (device)
//   DecodeMetadata md;
//   make_decode_metadata({B, S_q, H, K, topk_length, num_sms}, mbuf, mbytes, &md, stream);
//   size_t wbytes = decode_workspace_size(md);               // caller allocates (device)
//   sparse_mla_decode(params, md, workspace, wbytes, stream);
// The metadata describes exactly the rows passed; a call whose shape (B, S_q, H, K, topk_length
// pointer) differs from the one the metadata was made for is rejected. With topk_length, the
// metadata depends on its contents: remake it whenever they change (e.g. inside the same graph,
// once per engine step, as FlashMLA's get_mla_metadata). The plan keeps a snapshot of the lengths
// (the scheduler reads topk_length once), so a decode after the values changed without a new plan
// computes the result for the planned lengths, consistently. The device buffer starts with a
// header (magic, rows, K, granularity, part count) that the kernels check against the call: a
// stale or unwritten buffer never sizes a loop; with fixed top-k the result is still exact (the
// schedule is closed form), with dynamic top-k every row's out and lse are NaN.
//
// Streams: sparse_mla_decode only reads the metadata, so one plan serves calls on several streams
// once each is ordered after the stream that made it (cudaStreamWaitEvent). The workspace is
// written by every call: calls that can run at the same time need distinct workspaces.
//
// Zero rows (B = 0 or S_q = 0, e.g. a mixed batch without decode rows) are a no-op: the plan needs
// no buffer and launches nothing, its workspace size is 0, and the call launches nothing and
// touches no memory (q, indices, out, lse and the workspace may be null; the cache view and the
// scalars are still checked). out and lse must not share memory with each other, with any input (q, the
// cache, indices, topk_length, attn_sink), the metadata buffer or the workspace, and no two of
// their (b, s, h) rows may alias (checked by extent from pointers, sizes and strides).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "selkv/formats.h"
#include "selkv/status.h"

namespace selkv {

// Format of the split rows' partial outputs in the workspace (the combine merges them). Both
// keep DESIGN §5's tolerances; the choice is a speed trade, made per plan from its shape only.
enum class DecodePartials : int32_t {
  kAuto = 0,  // fp32 at H = 64 for calls of at most 4096 block-heads (B*S_q*K/64*H), else fp16
  kFp32 = 1,  // normalized fp32 partials (FlashMLA's format)
  kFp16 = 2,  // fp16 with a power-of-two scale per (part, head, d_v half): half the bytes
};

// Shape a metadata plan is made for.
struct DecodeShape {
  int32_t batch = 0;       // B (0 allowed: an empty plan)
  int32_t seq_q = 0;       // S_q (query tokens per batch row; 0 allowed)
  int32_t num_heads = 0;   // H in {64, 128}
  int32_t topk = 0;        // K, a multiple of 64, <= 2^30; B * S_q * K / 64 <= 2^29
  const int32_t* topk_length = nullptr;  // device [B] or null (fixed top-k)
  int32_t num_sms = 0;     // 0: read from the current device
  // Split-KV granularity: no part gets fewer 64-token blocks than this (fewer, longer parts cost
  // fewer partial writes and combine reads; more, shorter parts spread a small batch over more
  // SMs). 0: the measured default for H and the call's block count (docs/decode-design.md §3;
  // with fixed top-k, parts that lie inside rows when the balanced cut allows it);
  // a dynamic plan at the default may then cut parts of one block, when every block of the call
  // gets its own part and some row is longer than the default. At most 2^29.
  int32_t min_blocks_per_part = 0;
  // Partial format of split rows (kAuto: the measured rule of src/decode/decode_params.h
  // f16_partials_by_default: fp16 everywhere but the smallest H = 64 calls, where its epilogue's
  // extra code, fetched cold, costs more than the bytes it saves). The torch ops always use kAuto.
  DecodePartials partials = DecodePartials::kAuto;
  // Extra KV cache (model1_fp8 decodes only): K2 indices per row, 0 = none; a multiple of 64,
  // <= 2^30. A row's blocks are ceil(len / 64) + ceil(len2 / 64) (fixed: K / 64 + K2 / 64), at
  // least 1; B * S_q * (K + K2) / 64 <= 2^29.
  int32_t extra_topk = 0;
  const int32_t* extra_topk_length = nullptr;  // device [B] or null (needs extra_topk > 0)
};

// Host-side description of a metadata buffer (the buffer itself lives on the device).
struct DecodeMetadata {
  int32_t* data = nullptr;           // device buffer written by make_decode_metadata
  size_t bytes = 0;
  DecodeShape shape;                 // what it was made for
  int32_t num_sm_parts = 0;          // CTAs (per 64-head group) of the decode grid
  int32_t min_blocks_per_part = 0;   // the granularity the plan was made with (resolved, >= 1)
  // (shape.partials is what the caller asked for; sparse_mla_decode resolves kAuto from the shape)
  bool valid = false;                // set by a successful make_decode_metadata
};

// Whether calls of this shape write fp16 partials (shape.partials, kAuto resolved by the shape).
bool decode_uses_f16_partials(const DecodeShape& shape);

// Bytes of device memory make_decode_metadata needs for B * S_q rows.
size_t decode_metadata_size(int64_t batch, int64_t seq_q);

// Plan step: computes the split-KV partition on the device (one tiny kernel on `stream`).
// `buffer` is device memory of at least decode_metadata_size(shape.batch, shape.seq_q) bytes.
Status make_decode_metadata(const DecodeShape& shape, void* buffer, size_t buffer_bytes,
                            DecodeMetadata* metadata, cudaStream_t stream);

// Bytes of device workspace (split accumulators) sparse_mla_decode needs with this metadata.
size_t decode_workspace_size(const DecodeMetadata& metadata);

struct SparseDecodeParams {
  // q: bf16 [B, S_q, H, D] (D = 576 for ds_mla_fp8, 512 for model1_fp8); last dim contiguous;
  // pointer and strides 16-byte aligned.
  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_seq_stride = 0, q_head_stride = 0;  // in elements
  int32_t batch = 0, seq_q = 0, num_heads = 0;

  PagedKvCache cache;  // ds_mla_fp8 or model1_fp8

  // indices: int32 [B, S_q, K], last dim contiguous.
  const int32_t* indices = nullptr;
  int64_t indices_batch_stride = 0, indices_seq_stride = 0;  // in elements
  int32_t topk = 0;  // K, multiple of 64

  const int32_t* topk_length = nullptr;  // optional [B]: entries k >= topk_length[b] are invalid

  // Optional extra KV cache (model1_fp8 only; FlashMLA's extra_k_cache): its valid entries join
  // the main selection's in the same softmax. extra_topk == 0: none (extra_cache.data,
  // extra_indices and extra_topk_length must then be null). DESIGN §2 applies to each cache with
  // its own num_slots.
  PagedKvCache extra_cache;  // same format as cache; its own page size, blocks and block stride
  const int32_t* extra_indices = nullptr;  // int32 [B, S_q, K2], last dim contiguous
  int64_t extra_indices_batch_stride = 0, extra_indices_seq_stride = 0;  // in elements
  int32_t extra_topk = 0;                   // K2: 0 or a multiple of 64
  const int32_t* extra_topk_length = nullptr;  // optional [B]: extra entries k >= len are invalid

  const float* attn_sink = nullptr;      // optional [H]: out *= 1 / (1 + exp(sink[h] - lse))
  float sm_scale = 0.f;  // finite, > 0, and sm_scale * log2(e) finite in fp32 (DESIGN §2)

  // out: bf16 [B, S_q, H, 512]; last dim contiguous; pointer and strides 16-byte aligned.
  void* out = nullptr;
  int64_t out_batch_stride = 0, out_seq_stride = 0, out_head_stride = 0;  // in elements
  // lse: fp32 [B, S_q, H]; head dim contiguous.
  float* lse = nullptr;
  int64_t lse_batch_stride = 0, lse_seq_stride = 0;  // in elements
  // The lse of a row with no valid entry (out 0): -inf, or +inf when set (FlashMLA's convention).
  bool empty_lse_pos_inf = false;
};

// Fills the strides of a contiguous [B, S_q, H, *] layout (helper for callers and tests): q's
// from cache.format, the extra indices' from extra_topk.
void set_contiguous_strides(SparseDecodeParams* p);

// Argument validation only (no launch); sparse_mla_decode runs the same checks.
Status check_sparse_mla_decode(const SparseDecodeParams& p, const DecodeMetadata& metadata,
                               size_t workspace_bytes);

Status sparse_mla_decode(const SparseDecodeParams& p, const DecodeMetadata& metadata,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace selkv
