// Host entries of the C8 exact simple kernel: its launchers (qsa_simple.cu; the caller has run every
// argument check, they only launch) and its SIMT form behind the checks (qsa_api.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include "qsa/qsa_kernel_params.h"
#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::qsa {

// One CTA per (row, kv head) on `stream`; head_dim 128 or 256, p.group in [1, 8].
// p.only_nonfinite: the fix-up pass after the page-4 kernel (only flagged (row, kv head)s run).
cudaError_t launch_qsa_simple(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream);

// The same in the SIMT form on any GPU (the form bf16 takes below SM80; qsa_sparse_prefill_simt).
cudaError_t launch_qsa_simple_simt(const QsaSimpleParams& p, bool bf16, int head_dim, cudaStream_t stream);

// The simple kernel in its SIMT form whatever the GPU, so the tests run it on Hopper (qsa_api.cpp):
// the argument checks, then launch_qsa_simple_simt.
Status qsa_sparse_prefill_simt(const QsaSparsePrefillParams& p, cudaStream_t stream);

}  // namespace selkv::qsa
