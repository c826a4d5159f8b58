// selkv/cache_ops.h — memory-bound KV-cache operations (DESIGN C1-C3).
//
// All pointers are device pointers; every call is asynchronous on `stream`, never synchronizes
// the host, never allocates, and is CUDA-graph capturable. The same Params structs, filled with
// host pointers, drive the CPU oracle (src/reference/oracle.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "selkv/formats.h"
#include "selkv/status.h"

namespace selkv {

// ---- C1: cache write -------------------------------------------------------------------------
// bf16 latent [T,512] (model1_fp8: [T,448]) + RoPE [T,64] (ds_mla_fp8, model1_fp8) -> FP8 records
// at slot_mapping[t]; model1_fp8 takes only ScaleMode::kPow2 (its scales are UE8M0 powers of two).
// slot_mapping < 0 skips the token (CUDA-graph padding); a slot >= num_slots is also skipped
// (never written), so no caller value can write out of bounds. Valid slots must be distinct
// (two tokens writing one slot race on the GPU; the oracle keeps the later one).
// GPU requirements: latent/rope/cache 16-byte aligned, row strides multiples of 8 elements,
// block_stride_bytes a multiple of 16; rope must be null for nope_fp8. The cache (every block of
// the view) must not share memory with latent, rope or slot_mapping.
struct WriteKvCacheParams {
  const void* latent = nullptr;    // bf16 [num_tokens, 512] (model1_fp8: 448), rows 16-byte aligned
  int64_t latent_row_stride = 0;   // in elements
  const void* rope = nullptr;      // bf16 [num_tokens, 64]; required for ds_mla_fp8 and model1_fp8, null for nope_fp8
  int64_t rope_row_stride = 0;     // in elements
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  void* cache = nullptr;           // uint8 paged cache, see PagedKvCache
  int64_t num_blocks = 0;
  int32_t page_size = 0;
  int64_t block_stride_bytes = 0;
  KvFormat format = KvFormat::kDsMlaFp8;
  ScaleMode scale_mode = ScaleMode::kPow2;
};
// Validation only (no launch): the checks write_kv_cache runs before it touches the device.
Status check_write_kv_cache(const WriteKvCacheParams& p);
Status write_kv_cache(const WriteKvCacheParams& p, cudaStream_t stream);

// ---- C2: request-local top-k positions -> physical slots -----------------------------------
// For row t < num_tokens: r = req_id_per_token[t]; for each k,
//   pos = req_local_indices[t, k]; blk = pos / page_size;
//   slot = block_table[r, blk] * page_size + pos % page_size
// and -1 when r is outside [0, num_reqs), pos < 0, pos >= token_seq_lens[t] (when given: the
// tokens a row may attend, e.g. its request's length after this step's write), blk >=
// max_blocks_per_req, or the block id is outside [0, num_blocks). Only the first num_tokens
// entries of req_id_per_token (and token_seq_lens) are read
// (a longer vector is fine and never causes an out-of-bounds access).
// valid_counts (optional, [num_tokens]) receives the number of valid slots per row.
// compact: valid slots are moved to the front of the row in their original order and the rest
// filled with -1, so valid_counts can serve as topk_length. topk == 0 zero-fills valid_counts.
// In place (out_slots == req_local_indices) is allowed with equal row strides; any other overlap
// of out_slots or valid_counts with each other or with an input (req_local_indices, the first
// num_tokens entries of req_id_per_token, block_table) is rejected. topk <= 2^30.
struct ConvertIndicesParams {
  const int32_t* req_local_indices = nullptr;  // [num_tokens, topk]
  int64_t indices_row_stride = 0;              // in elements
  const int32_t* req_id_per_token = nullptr;   // [>= num_tokens]
  const int32_t* block_table = nullptr;        // [num_reqs, max_blocks_per_req]
  int64_t block_table_row_stride = 0;          // in elements
  int32_t num_reqs = 0;
  int32_t max_blocks_per_req = 0;
  int64_t num_tokens = 0;
  int32_t topk = 0;
  int32_t page_size = 0;
  int64_t num_blocks = 0;
  int32_t* out_slots = nullptr;                // [num_tokens, topk]
  int64_t out_row_stride = 0;                  // in elements
  int32_t* valid_counts = nullptr;             // optional [num_tokens]
  bool compact = false;
  const int32_t* token_seq_lens = nullptr;     // optional [>= num_tokens]: positions >= it are -1
};
// Validation only (no launch), as for write_kv_cache.
Status check_convert_req_indices_to_slots(const ConvertIndicesParams& p);
Status convert_req_indices_to_slots(const ConvertIndicesParams& p, cudaStream_t stream);

// ---- C3: gather + upconvert ------------------------------------------------------------------
// For each request r < num_reqs: tokens [seq_starts[r], seq_starts[r] + seq_lens[r]) are read
// through block_table row r, dequantized to bf16 and written to out rows
// [ws_starts[r], ws_starts[r] + seq_lens[r]). ds_mla_fp8 -> [.., 576], nope_fp8 and model1_fp8 ->
// [.., 512] (dequant_dim).
// Starts need not be page aligned. Tokens whose block is missing (past max_blocks_per_req or a
// block id outside [0, num_blocks)) or whose position is negative are written as zeros; out rows
// outside [0, out_rows) are never written, nor are rows no request covers. Output ranges must
// not overlap (the GPU gives no order between requests), and out must not share memory with the
// cache, block_table, seq_starts, seq_lens or ws_starts. num_reqs <= 4096 per call; out and
// cache 16-byte aligned, out_row_stride a multiple of 8, block_stride_bytes a multiple of 16.
// NaN outputs (only from corrupt records: E4M3 code 0x7F/0xFF or a NaN scale) are the
// canonical bf16 NaN 0x7FFF, on the GPU and in the oracle alike.
struct GatherKvParams {
  const void* cache = nullptr;
  int64_t num_blocks = 0;
  int32_t page_size = 0;
  int64_t block_stride_bytes = 0;
  KvFormat format = KvFormat::kDsMlaFp8;
  const int32_t* block_table = nullptr;  // [num_reqs, max_blocks_per_req]
  int64_t block_table_row_stride = 0;
  int32_t max_blocks_per_req = 0;
  const int32_t* seq_starts = nullptr;   // [num_reqs] first token position to gather
  const int32_t* seq_lens = nullptr;     // [num_reqs] tokens to gather (0 allowed)
  const int32_t* ws_starts = nullptr;    // [num_reqs] first output row
  int32_t num_reqs = 0;
  void* out = nullptr;                   // bf16 [out_rows, dequant_dim(format)]
  int64_t out_row_stride = 0;            // in elements
  int64_t out_rows = 0;
};
// Validation only (no launch), as for write_kv_cache.
Status check_gather_kv_bf16(const GatherKvParams& p);
Status gather_kv_bf16(const GatherKvParams& p, cudaStream_t stream);

}  // namespace selkv
