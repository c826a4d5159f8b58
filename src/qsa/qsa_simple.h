// Host entry of the C8 exact simple kernel (qsa_simple.cu). The caller (qsa_api.cpp) has run
// every argument check; this only launches.
#pragma once

#include <cuda_runtime_api.h>

#include "qsa/qsa_kernel_params.h"

namespace selkv::qsa {

// One CTA per (row, kv head) on `stream`; head_dim 128 or 256, p.group in [1, 8].
// p.only_nonfinite: the fix-up pass after the page-4 kernel (only flagged (row, kv head)s run).
cudaError_t launch_qsa_simple(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream);

// The same in the SIMT form on any GPU (the form bf16 takes below SM80; qsa_sparse_prefill_simt).
cudaError_t launch_qsa_simple_simt(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream);

}  // namespace selkv::qsa
