// selkv/composed.h — sparse MLA prefill straight from the paged FP8 cache, one call each.
//
// Two routes, both "FP8 cache -> bf16 workspace -> C7" (selkv/prefill.h), both asynchronous on
// `stream` (no host sync, no allocation, CUDA-graph capturable, deterministic):
//
//  (a) dequant_sparse_mla_prefill — top-k over the whole pool (seed 003):
//        physical indices [T, K] --C4 (selkv/dequant.h)--> bf16 rows + remapped indices in the
//        workspace --C7--> out, max_logits, lse.
//      The C4 mode follows from the shapes alone: N = T*K < P dequantizes only the selected
//      entries (workspace row t*K+k), else the whole pool (indices kept). Index semantics are
//      the physical ones of DESIGN §2 (valid iff 0 <= slot < P and k < topk_length[t]).
//
//  (b) gather_sparse_mla_prefill — the dense-prefill route of seed 004:
//        C3 (gather_kv_bf16) of each request's chunk into bf16 workspace rows
//        [ws_starts[r], ws_starts[r] + seq_lens[r]) --C7--> out, max_logits, lse,
//      with `attn.indices` already relative to the gathered rows (valid iff
//      0 <= idx < num_kv_rows and k < topk_length[t]). Rows no request covers are not written:
//      an index pointing at one reads whatever the workspace held (the caller's contract: point
//      only at gathered rows, as the engine's chunk-relative indices do).
//
// Both take the C7 parameters in `attn` (q, out, max_logits, lse, indices, topk, topk_length,
// sm_scale and their strides) and fill its kv fields themselves: attn.kv must be null and
// attn.kv_row_stride / attn.num_kv 0. attn.d_qk must equal dequant_dim(format): 576 for
// ds_mla_fp8, 512 for nope_fp8. The workspace is one caller buffer (16-byte aligned) of at least
// *_workspace_size(...) bytes; a smaller one gives kWorkspaceTooSmall naming the bytes needed.
// Every check (composed, C4/C3 and C7) runs before anything is launched: a failing call launches
// nothing and returns a Status naming the op and the argument. The workspace bytes used must not
// share memory with the cache or any attn tensor (and, for (b), the gather's inputs); T = 0 is a
// no-op.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "selkv/cache_ops.h"
#include "selkv/formats.h"
#include "selkv/prefill.h"
#include "selkv/status.h"

namespace selkv {

// The cache formats both routes take (model1_fp8 has no composed route: its decode is C5).
constexpr bool composed_prefill_format(KvFormat f) { return f == KvFormat::kDsMlaFp8 || f == KvFormat::kNopeFp8; }

// ---- (a) FP8 paged cache + physical indices -> C4 -> C7 --------------------------------------
struct DequantPrefillParams {
  // C7 part. attn.indices / indices_token_stride / topk / topk_length are the PHYSICAL slots
  // [T, K] (K a multiple of 64); attn.kv, kv_row_stride and num_kv must be left null / 0.
  SparsePrefillParams attn;
  PagedKvCache cache;       // nope_fp8 (d_qk 512) or ds_mla_fp8 (d_qk 576), device view
  void* workspace = nullptr;  // 16-byte aligned
  size_t workspace_bytes = 0;
};

// Workspace layout (bytes from the start, each part 256-byte aligned):
//   [0, A)      bf16 rows [min(T*K, P), D] at row stride D (C4 output, C7 kv)
//   [A, A + B)  int32 remapped indices [T, K]                  (C4 output, C7 indices)
// with A = align256(min(T*K, P) * D * 2), B = align256(T * K * 4). SIZE_MAX for a shape or a
// format no call accepts.
size_t dequant_prefill_workspace_size(int64_t num_tokens, int32_t topk, int64_t num_slots,
                                      KvFormat format);

// Validation only (no launch); dequant_sparse_mla_prefill runs the same checks.
Status check_dequant_sparse_mla_prefill(const DequantPrefillParams& p);
Status dequant_sparse_mla_prefill(const DequantPrefillParams& p, cudaStream_t stream);

// ---- (b) C3 gather of each request's chunk -> C7 (seed 004 dense-prefill route) ---------------
struct GatherPrefillParams {
  // C7 part. attn.indices are relative to the gathered workspace rows; attn.kv, kv_row_stride
  // and num_kv must be left null / 0 (the call sets kv = workspace, num_kv = num_kv_rows).
  SparsePrefillParams attn;
  // C3 part (cache, block table, seq_starts, seq_lens, ws_starts, num_reqs, format). gather.out,
  // out_row_stride and out_rows must be left null / 0 (the call sets them to the workspace).
  GatherKvParams gather;
  int64_t num_kv_rows = 0;  // workspace rows: max over requests of ws_starts + seq_lens
  void* workspace = nullptr;  // 16-byte aligned
  size_t workspace_bytes = 0;
};

// bf16 [num_kv_rows, D] at row stride D = dequant_dim(format), rounded up to 256 bytes; SIZE_MAX
// for a row count or a format no call accepts.
size_t gather_prefill_workspace_size(int64_t num_kv_rows, KvFormat format);

// Validation only (no launch); gather_sparse_mla_prefill runs the same checks.
Status check_gather_sparse_mla_prefill(const GatherPrefillParams& p);
Status gather_sparse_mla_prefill(const GatherPrefillParams& p, cudaStream_t stream);

}  // namespace selkv
