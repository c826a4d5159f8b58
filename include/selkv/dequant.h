// selkv/dequant.h — C4: selected-row dequantization of a paged FP8 cache (DESIGN §3 C4, seed 003).
//
// Input: a paged nope_fp8 (528 B), ds_mla_fp8 (656 B) or model1_fp8 (584 B) cache with P =
// num_slots physical rows, physical indices [T, K] int32 (DESIGN §2: valid iff 0 <= slot < P and
// k < topk_length[t] when topk_length is given). N = T * K. Output: a bf16 workspace of rows of
// D = dequant_dim(format) elements (576 ds_mla_fp8, 512 nope_fp8 and model1_fp8) and remapped indices [T, K] int32 into that workspace, ready for
// the bf16 sparse prefill (selkv/prefill.h, C7) with num_kv = workspace rows used.
//
//   N <  P  ("selected"):  row j = t * K + k of the workspace receives the dequantized record of
//                          indices[t, k] when that entry is valid (out_indices[t, k] = j), and is
//                          left untouched when it is not (out_indices[t, k] = -1).
//   N >= P  ("full pool"): workspace row s receives slot s for every s < P;
//                          out_indices[t, k] = indices[t, k] when valid, else -1.
// Either way invalid entries come out as exactly -1, so consumers need not know P, and the
// workspace needs dequant_selected_workspace_rows(T, K, P) = min(N, P) rows.
//
// Duplicates and empty rows are legal. No host sync, no allocation, no data-dependent
// unique/sort: the mode is picked on the host from the shapes alone (T, K, P), so the call is
// CUDA-graph capturable (a graph bakes the mode in with the shapes).
//
// GPU requirements: cache and workspace 16-byte aligned, block_stride_bytes and
// workspace_row_stride * 2 multiples of 16 bytes; indices / topk_length / out_indices 4-byte
// aligned. out_indices must not overlap indices unless it is the same buffer with the same row
// stride (in place is allowed); the workspace rows used and out_indices must not share memory
// with each other, the cache or topk_length, nor the workspace with indices. Dequantization is bf16(float(e4m3) * scale), bit-exact with the
// oracle (src/reference/oracle.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "selkv/formats.h"
#include "selkv/status.h"

namespace selkv {

enum class DequantMode : int32_t {
  kSelected = 0,  // N < P: only the selected rows, indices remapped to t * K + k
  kFullPool = 1,  // N >= P: every slot, indices kept (invalid -> -1)
};

// The mode a call with these shapes takes: kSelected iff T * K < P.
DequantMode dequant_selected_mode(int64_t num_tokens, int64_t topk, int64_t num_slots);
// Workspace rows the call needs: min(T * K, P) (0 when either is 0).
int64_t dequant_selected_workspace_rows(int64_t num_tokens, int64_t topk, int64_t num_slots);

struct DequantSelectedParams {
  PagedKvCache cache;                    // nope_fp8 or ds_mla_fp8 (device view)
  const int32_t* indices = nullptr;      // [T, K] physical slots
  int64_t indices_row_stride = 0;        // in elements, >= K
  const int32_t* topk_length = nullptr;  // optional [T]: entries k >= topk_length[t] are invalid
  int64_t num_tokens = 0;                // T
  int32_t topk = 0;                      // K (any value >= 0)
  void* workspace = nullptr;             // bf16 [workspace_rows, D], D = dequant_dim(format)
  int64_t workspace_rows = 0;            // capacity; must be >= dequant_selected_workspace_rows
  int64_t workspace_row_stride = 0;      // in elements, >= D, multiple of 8
  int32_t* out_indices = nullptr;        // [T, K] remapped indices
  int64_t out_indices_row_stride = 0;    // in elements, >= K
};

// Argument validation only (no launch); dequant_selected_kv runs the same checks. A workspace
// smaller than needed gives kWorkspaceTooSmall with the needed rows and bytes in the message.
Status check_dequant_selected(const DequantSelectedParams& p);

Status dequant_selected_kv(const DequantSelectedParams& p, cudaStream_t stream);

}  // namespace selkv
