// CPU oracle of C7 with strided Params and of the composed prefill paths (selkv/composed.h):
// the same Params structs as the GPU calls, filled with host pointers. Built from the oracle's
// pieces (ref::dequant_selected, ref::gather_kv_bf16, ref::sparse_prefill, fp64), so GPU results
// can be compared with it end to end. Used by the tests, the benchmarks and the torch CPU ops.
#pragma once

#include "selkv/composed.h"
#include "selkv/prefill.h"
#include "selkv/status.h"

namespace selkv::ref {

// C7 over host pointers with any strides the GPU op accepts (same validation as
// check_sparse_mla_prefill): out rounded to bf16 (round to nearest even), max_logits / lse fp32
// (either may be null), empty rows out = 0, lse = max_logits = -inf.
Status sparse_mla_prefill_strided(const SparsePrefillParams& p);

// (a) and (b) of selkv/composed.h on host memory: the workspace is written exactly as the GPU
// call writes it (C4 / C3 are bit-exact), then C7's oracle runs on it.
Status dequant_sparse_mla_prefill(const DequantPrefillParams& p);
Status gather_sparse_mla_prefill(const GatherPrefillParams& p);

}  // namespace selkv::ref
