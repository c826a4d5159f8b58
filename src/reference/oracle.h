// CPU oracle ("reference"): a plain, obviously-correct implementation of every selkv op.
// Bit-exact for quantization, packing, gathering and index conversion; fp64 accumulation for
// attention. The cache ops take the same Params structs as the GPU ops, filled with host
// pointers. Used by the tests, the main job's sample check, and the torch CPU ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "selkv/cache_ops.h"
#include "selkv/dequant.h"
#include "selkv/formats.h"
#include "selkv/merge.h"
#include "selkv/packed.h"
#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::ref {

// ---- records ---------------------------------------------------------------------------------
// Encode one token: latent bf16[nope_dim(format)] (512, or 448 for model1_fp8) + rope bf16[64]
// (ds_mla_fp8, model1_fp8; ignored for nope_fp8) -> token in_page of the page at `page` (page_size
// tokens): its record at record_offset(in_page), its scales at scale_offset(in_page, page_size)
// (model1_fp8: 7 UE8M0 bytes and a zero pad byte). model1_fp8 takes ScaleMode::kPow2 only (UE8M0
// holds powers of two): kAmax throws std::invalid_argument (the ops reject it with a Status first).
void encode_token(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode,
                  uint8_t* page, int64_t page_size, int64_t in_page);
// Decode token in_page of a page -> bf16 bits [dequant_dim(format)] (576 or 512).
void decode_token(const uint8_t* page, KvFormat format, int64_t page_size, int64_t in_page, uint16_t* out);
// The token of a slot of a paged view (0 <= slot < num_slots); `cache` is view.data, writable.
void encode_slot(const uint16_t* latent, const uint16_t* rope, ScaleMode mode, const PagedKvCache& view,
                 uint8_t* cache, int64_t slot);
void decode_slot(const PagedKvCache& view, int64_t slot, uint16_t* out);
// A token alone: record_bytes(format) contiguous bytes, i.e. the token of a page of one
// (model1_fp8: 576 record bytes, then its 8 scale bytes; the page padding excluded).
void encode_record(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode,
                   uint8_t* record);
void decode_record(const uint8_t* record, KvFormat format, uint16_t* out);

// ---- C1-C3 (host pointers; same semantics as the GPU ops) -----------------------------------
Status write_kv_cache(const WriteKvCacheParams& p);
Status convert_req_indices_to_slots(const ConvertIndicesParams& p);
Status gather_kv_bf16(const GatherKvParams& p);

// ---- C4 selected-row dequant (host pointers; same semantics as selkv::dequant_selected_kv) --
// N < P: workspace row t*K+k <- record of indices[t, k] for valid entries (others untouched),
// out_indices = t*K+k or -1. N >= P: every slot s -> workspace row s, out_indices = valid ? slot
// : -1. In place (out_indices == indices, same stride) works: each entry is read before written.
Status dequant_selected(const DequantSelectedParams& p);

// ---- C6 pack / patch (host pointers; same semantics and checks as the GPU ops) ---------------
// pack: entry e = (b * S_q + s) * K + k gets the 656-byte record of indices[b, s, k] when
// k < clamp(topk_length[b], 0, K) (when given) and 0 <= index < num_slots, else 656 zero bytes
// (the index is not read past the length); validity words after the records, bit e % 32 of word
// e / 32 set iff valid. Every byte of [0, packed_kv_workspace_size) is written.
Status pack_selected_kv(const PackSelectedKvParams& p);
// patch: records[i] -> entry positions[i] and its validity bit set; positions outside
// [0, B * S_q * K) skipped. With repeated positions the later record stays.
Status patch_packed_kv(const PatchPackedKvParams& p);

// ---- C5 sparse MLA decode (fp64) ------------------------------------------------------------
// Valid slot (DESIGN §2): 0 <= slot < cache.num_slots() and k < topk_length[b] when given.
// score = sm_scale * q . k over D dims (k = dequantized record: D = 576 for ds_mla_fp8, 512 for
// model1_fp8), out = softmax . v (v = first 512 dims of k: all of it for model1_fp8). A row with
// no valid slot: out = 0, lse = -inf. A NaN score (NaN in a valid record: every head; NaN in one
// head of q: that head) gives out = NaN and lse = NaN.
// attn_sink (optional, [H]): out *= 1 / (1 + exp(attn_sink[h] - lse)); lse is returned unchanged.
// Each index entry is one softmax term (a slot listed twice counts twice). lse may be null.
// Extra cache (model1_fp8 only, K2 > 0): the valid entries of extra_indices (0 <= slot <
// extra_cache.num_slots(), k < extra_topk_length[b] when given) join the row's keys after the
// main cache's, in one softmax.
struct SparseDecodeRefArgs {
  const uint16_t* q = nullptr;   // bf16 [B, S_q, H, D]
  int B = 0, S_q = 0, H = 0;
  PagedKvCache cache;            // host view: ds_mla_fp8 or model1_fp8
  const int32_t* indices = nullptr;  // [B, S_q, K]
  int K = 0;
  const int32_t* topk_length = nullptr;  // [B] or null
  PagedKvCache extra_cache;              // host view, cache's format; used when K2 > 0
  const int32_t* extra_indices = nullptr;  // [B, S_q, K2]
  int K2 = 0;
  const int32_t* extra_topk_length = nullptr;  // [B] or null (K2 > 0 only)
  float sm_scale = 0.f;
  const float* attn_sink = nullptr;      // [H] or null
  float* out = nullptr;          // [B, S_q, H, 512]
  float* lse = nullptr;          // [B, S_q, H], natural log
  bool empty_lse_pos_inf = false;  // an empty row's lse: +inf instead of -inf (FlashMLA's convention)
  int threads = 0;               // rows run on this many threads (0: all cores); results do not depend on it
};
void sparse_decode(const SparseDecodeRefArgs& a);
// Argument check for sparse_decode (null pointers, sizes, cache views, format ds_mla_fp8 or
// model1_fp8, the extra cache model1_fp8 only).
// sparse_decode itself writes nothing when this fails.
Status check_sparse_decode_args(const SparseDecodeRefArgs& a);

// ---- C5 plan of the CPU decode ---------------------------------------------------------------
// The oracle needs no schedule: a one-part plan (what make_decode_metadata makes on a one-SM
// device) whose buffer is zero except the lengths snapshot, kept where the GPU scheduler keeps it
// (decode_params.h md_lengths_offset), so the CPU decode also computes the result for the lengths
// at planning time. The shape itself is checked against each call by check_sparse_mla_decode.
// `buffer` (host) needs decode_metadata_size(batch, seq_q) bytes; null is fine for zero rows.
Status make_decode_metadata(const DecodeShape& shape, void* buffer, size_t buffer_bytes, DecodeMetadata* metadata);

// ---- C6 sparse MLA decode over a packed KV buffer (fp64) ------------------------------------
// The packed KV layout of selkv/packed.h: entry e = (b * S_q + s) * K + k is attended iff its
// validity bit is set and k < topk_length[b] (when given); then exactly sparse_decode over the
// buffer's records (the same scores, softmax and attn_sink rule).
struct SparseDecodePackedRefArgs {
  const uint16_t* q = nullptr;   // bf16 [B, S_q, H, 576]
  int B = 0, S_q = 0, H = 0;
  const uint8_t* packed_kv = nullptr;  // host copy of the buffer
  size_t packed_kv_bytes = 0;          // >= packed_kv_workspace_size(B, S_q, K)
  int K = 0;
  const int32_t* topk_length = nullptr;  // [B] or null
  float sm_scale = 0.f;
  const float* attn_sink = nullptr;      // [H] or null
  float* out = nullptr;          // [B, S_q, H, 512]
  float* lse = nullptr;          // [B, S_q, H]
  bool empty_lse_pos_inf = false;
  int threads = 0;
};
Status check_sparse_decode_packed_args(const SparseDecodePackedRefArgs& a);
void sparse_decode_packed(const SparseDecodePackedRefArgs& a);

// ---- C7 sparse prefill over bf16 KV (fp64) ---------------------------------------------------
// Valid index: 0 <= idx < num_kv and k < topk_length[t] when given. score = sm_scale * q . kv
// over d_qk dims (576 or 512); out = softmax . kv[:, :512]. max_logits = max valid score.
// Empty row: out = 0, max_logits = -inf, lse = -inf. A NaN score: out, max_logits, lse NaN.
struct SparsePrefillRefArgs {
  const uint16_t* q = nullptr;   // bf16 [T, H, d_qk]
  int T = 0, H = 0, d_qk = 0;
  const uint16_t* kv = nullptr;  // bf16 [num_kv, d_qk]
  int64_t num_kv = 0;
  const int32_t* indices = nullptr;  // [T, K]
  int K = 0;
  const int32_t* topk_length = nullptr;  // [T] or null
  float sm_scale = 0.f;
  const float* attn_sink = nullptr;  // [H] or null: out *= 1 / (1 + exp(attn_sink[h] - lse))
  float* out = nullptr;          // [T, H, 512]
  float* max_logits = nullptr;   // [T, H]
  float* lse = nullptr;          // [T, H]
  int threads = 0;               // rows run on this many threads (0: all cores); results do not depend on it
};
void sparse_prefill(const SparsePrefillRefArgs& a);
// Argument check for sparse_prefill (null pointers, sizes, d_qk in {576, 512}; max_logits and
// lse may be null). sparse_prefill itself writes nothing when this fails.
Status check_sparse_prefill_args(const SparsePrefillRefArgs& a);

// ---- C9 LSE merge (fp64) ---------------------------------------------------------------------
// outs [num_shards, rows, dim], lses [num_shards, rows] -> out [rows, dim], lse [rows].
// Shards with lse = -inf contribute nothing; all -inf -> out 0, lse -inf; a +inf lse wins:
// out = the out of the first shard whose lse is +inf, lse = +inf. A NaN lse in any shard makes
// the row NaN (out and lse). lse may be null (out only). pos_inf_is_empty: a +inf lse counts as
// -inf (FlashAttention's empty rows; see selkv/merge.h).
void lse_merge(const float* outs, const float* lses, int num_shards, int64_t rows, int dim,
               float* out, float* lse, bool pos_inf_is_empty = false);
// Argument check for lse_merge; lse_merge itself writes nothing when this fails.
Status check_lse_merge_args(const float* outs, const float* lses, int num_shards, int64_t rows,
                            int dim, const float* out);

// The same merge on selkv::merge_attn_states' Params with host pointers (any dtype and strides):
// inputs widened to fp32, lse_merge, out rounded to the dtype. The GPU op's argument rules,
// less its alignment rules.
Status merge_attn_states(const MergeAttnStatesParams& p);

// ---- C8 QSA sparse prefill (fp64) and its virtual page-4 plan --------------------------------
// On selkv::qsa_sparse_prefill's Params with host pointers (selkv/qsa.h has the semantics): the
// valid entries of each row in selection order, fp64 scores and softmax, out rounded to the
// dtype, lse (natural log) as fp32; a row / head without a valid entry gives 0 / -inf, a NaN
// score NaN / NaN. The GPU op's argument rules, less its alignment rules; p.metadata, p.force_simple
// are ignored. Rows run on `threads` threads (0: all cores); results do not depend on it.
Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, int threads = 0);

// One valid entry of a row: logical token t at (page, slot) of the caches.
struct QsaEntry {
  int64_t token;
  int32_t page;
  int32_t slot;
};
// The valid entries of row r in selection order (what the row attends to). No argument check:
// p must have passed the oracle's checks and r < p.num_rows.
std::vector<QsaEntry> qsa_row_entries(const QsaSparsePrefillParams& p, int64_t r);

// CPU reference of selkv::qsa_plan: the page-4 group plan of p's selection (qsa_group_plan below,
// groups of qsa_page4_max_rows(Hq / Hkv) rows) into `metadata` (host, qsa_metadata_size(num_rows,
// max_blocks) bytes; every byte of that size written, unused blocks 0). Reads only the plan's inputs.
Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes);

// CPU reference of the page-4 group plan (layout src/qsa/qsa_group_layout.h) for groups of
// rows_per_group (1..32) consecutive rows: group_plan_words(num_rows, max_blocks) int32 words,
// every one written (unused 0). hand_over: groups whose rows share too little list nothing and
// flag every row (qsa_plan's rule). No argument check: p must have passed the oracle's checks.
std::vector<int32_t> qsa_group_plan(const QsaSparsePrefillParams& p, int rows_per_group, bool hand_over = false);

}  // namespace selkv::ref
