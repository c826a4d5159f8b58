// selkv/packed.h — C6: packed selected-KV sparse decode (DESIGN §3 C6, seed 000).
//
// Two stages. pack_selected_kv copies the selected ds_mla_fp8 records of a decode step into a
// contiguous "packed KV" buffer (an engine can run it early, e.g. overlapped with MoE
// communication, since DSA models share the selected indices across layers);
// sparse_mla_decode_packed then attends over that buffer with no index load, page translation
// or scattered gather on its critical path. patch_packed_kv overwrites single entries (the
// current token's record, once its KV exists) in an already packed buffer.
//
// Packed KV layout (opaque to callers; fixed here so the oracle and tests can check it byte for
// byte). rows = B * S_q, entry e = (b * S_q + s) * K + k for position k of query row (b, s):
//   records  [0, rows * K * 656): entry e's 656-byte record at byte e * 656, so each row is K / 64
//            tiles of 64 records (41984 bytes, 128-byte aligned);
//   validity [rows * K * 656, + rows * K / 8): uint32 words, bit k % 32 of word e / 32 set iff
//            entry e holds a selected record;
//   shape    [rows * K * 656 + rows * K / 8, + 16): uint32 {fingerprint(B, S_q, K), B, S_q, K}
//            (src/packed/packed_layout.h). The sizes depend on B * S_q * K only; the shape words
//            make a buffer packed for another shape (or never packed) fail closed: the packed
//            decode gives NaN rows, patch_packed_kv writes no record and poisons the words (so the
//            decode of the buffer at any shape gives NaN rows until it is packed again).
// An entry is valid iff k < topk_length[b] (when given) and its index is a slot of the cache
// (0 <= index < num_slots, DESIGN §2); an invalid entry's record is 656 zero bytes and its index
// is never dereferenced.
//
// Usage (asynchronous on `stream`, no host sync, no allocation, CUDA-graph capturable):
//   size_t pbytes = packed_kv_workspace_size(B, S_q, K);     // caller allocates (device)
//   pack_selected_kv({cache, indices, ..., packed_kv, pbytes}, side_stream);
//   ... patch_packed_kv(...) for entries whose KV was written after the pack ...
//   make_decode_metadata(...) and decode_workspace_size(md), exactly as for sparse_mla_decode;
//   sparse_mla_decode_packed(params, md, workspace, wbytes, stream);   // after an event
// The decode's out / lse equal sparse_mla_decode's over the same cache, indices and plan (bitwise:
// the same kernel reads the same bytes in the same order) as long as the packed buffer reflects
// that cache, i.e. it was packed (and patched) after the cache entries it selects were written.
// Pass the same topk_length to the pack and the decode: the decode attends entries that are valid
// in the buffer and below its own plan's lengths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "selkv/decode.h"
#include "selkv/formats.h"
#include "selkv/status.h"

namespace selkv {

// Bytes of a packed KV buffer for B * S_q rows of top-k K (K a positive multiple of 64): ~1.28 MiB
// per row at K = 2048. 0 when the shape is invalid (negative sizes, K not a multiple of 64, or
// B * S_q * K >= 2^31 entries).
size_t packed_kv_workspace_size(int64_t batch, int64_t seq_q, int64_t topk);

// ---- pack ------------------------------------------------------------------------------------
// indices [B, S_q, K] int32 physical slots (last dim contiguous) -> packed KV as laid out above.
// GPU requirements: cache 16-byte aligned with block_stride_bytes a multiple of 16, format
// ds_mla_fp8; packed_kv 16-byte aligned and at least packed_kv_workspace_size bytes; packed_kv
// must not overlap the cache, indices or topk_length.
struct PackSelectedKvParams {
  PagedKvCache cache;  // format must be ds_mla_fp8
  const int32_t* indices = nullptr;
  int64_t indices_batch_stride = 0, indices_seq_stride = 0;  // in elements
  int32_t batch = 0, seq_q = 0, topk = 0;                    // B, S_q, K (K a multiple of 64)
  const int32_t* topk_length = nullptr;  // optional [B]: entries k >= topk_length[b] are invalid
  void* packed_kv = nullptr;
  size_t packed_kv_bytes = 0;
};
Status check_pack_selected_kv(const PackSelectedKvParams& p);
Status pack_selected_kv(const PackSelectedKvParams& p, cudaStream_t stream);

// ---- patch -----------------------------------------------------------------------------------
// For i < num_records: entry positions[i] (= (b * S_q + s) * K + k) of a packed buffer of shape
// (B, S_q, K) gets the 656 bytes at records + i * record_stride_bytes and becomes valid. A
// position < 0 or >= B * S_q * K is skipped (CUDA-graph padding; never written). Valid positions
// must be distinct (two records written to one entry race). records must not overlap packed_kv.
// A buffer whose shape words are not (B, S_q, K) gets no record and its K word is poisoned: the
// mistake fails closed (NaN decode rows) since the device cannot report it.
struct PatchPackedKvParams {
  void* packed_kv = nullptr;
  size_t packed_kv_bytes = 0;
  int32_t batch = 0, seq_q = 0, topk = 0;   // the shape the buffer was packed for
  const int64_t* positions = nullptr;       // [num_records]
  const uint8_t* records = nullptr;         // [num_records, >= 656] ds_mla_fp8 records
  int64_t record_stride_bytes = 0;          // >= 656, a multiple of 16; records 16-byte aligned
  int64_t num_records = 0;
};
Status check_patch_packed_kv(const PatchPackedKvParams& p);
Status patch_packed_kv(const PatchPackedKvParams& p, cudaStream_t stream);

// ---- decode ----------------------------------------------------------------------------------
// sparse_mla_decode over a packed KV buffer: the same plan (make_decode_metadata for
// (B, S_q, H, K, topk_length)), the same split workspace, the same outputs and rules as
// SparseDecodeParams (selkv/decode.h), with the cache and indices replaced by the buffer.
struct PackedDecodeParams {
  // q: bf16 [B, S_q, H, 576]; last dim contiguous; pointer and strides 16-byte aligned.
  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_seq_stride = 0, q_head_stride = 0;  // in elements
  int32_t batch = 0, seq_q = 0, num_heads = 0;

  const void* packed_kv = nullptr;  // packed for (B, S_q, K); 16-byte aligned
  size_t packed_kv_bytes = 0;       // >= packed_kv_workspace_size(B, S_q, K)
  int32_t topk = 0;                 // K

  const int32_t* topk_length = nullptr;  // optional [B]: entries k >= topk_length[b] are not attended
  const float* attn_sink = nullptr;      // optional [H]
  float sm_scale = 0.f;

  void* out = nullptr;  // bf16 [B, S_q, H, 512]
  int64_t out_batch_stride = 0, out_seq_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // fp32 [B, S_q, H]
  int64_t lse_batch_stride = 0, lse_seq_stride = 0;
  bool empty_lse_pos_inf = false;  // as SparseDecodeParams::empty_lse_pos_inf
};
void set_contiguous_strides(PackedDecodeParams* p);
Status check_sparse_mla_decode_packed(const PackedDecodeParams& p, const DecodeMetadata& metadata,
                                      size_t workspace_bytes);
Status sparse_mla_decode_packed(const PackedDecodeParams& p, const DecodeMetadata& metadata,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace selkv
