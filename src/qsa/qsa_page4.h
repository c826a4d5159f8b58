// Host entries of the C8 SM90 page-4 kernel (qsa_page4.cuh; one instantiation per dtype and head
// dim in qsa_page4_*.cu) and the page-4 route of qsa_sparse_prefill (qsa_api.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "qsa/qsa_kernel_params.h"
#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::qsa {

// A persistent grid of `ctas` CTAs over the units (group of p.rows_per_cta rows, kv head) on
// `stream` (qsa_page4.cuh); the caller has checked p.
template <typename T, int D>
cudaError_t launch_qsa_page4(const QsaPage4Params& p, int ctas, cudaStream_t stream);

extern template cudaError_t launch_qsa_page4<__half, 256>(const QsaPage4Params&, int, cudaStream_t);
extern template cudaError_t launch_qsa_page4<__half, 128>(const QsaPage4Params&, int, cudaStream_t);
extern template cudaError_t launch_qsa_page4<__nv_bfloat16, 256>(const QsaPage4Params&, int, cudaStream_t);
extern template cudaError_t launch_qsa_page4<__nv_bfloat16, 128>(const QsaPage4Params&, int, cudaStream_t);

// The page-4 route of qsa_sparse_prefill, whatever qsa_route says (the tests and benchmarks call
// it directly): the argument checks, then the page-4 kernel over p.metadata (required: the group
// plan of qsa::qsa_group_plan for the same selection and grouping) and the simple kernel's fix-up pass over the
// (row, kv head)s the page-4 kernel flags. rows_per_cta: query rows one CTA groups, 0 for the
// default qsa_page4_max_rows(Hq / Hkv), else in [1, qsa_page4_max_rows(Hq / Hkv)]. SM90 only.
Status qsa_sparse_prefill_page4(const QsaSparsePrefillParams& p, cudaStream_t stream, int rows_per_cta = 0);

}  // namespace selkv::qsa
