// C8 GPU entry points (include/selkv/qsa.h). The kernels are not written yet: after the argument
// checks (shared with the oracle, qsa_checks.cpp) both entry points return kUnsupported, so a
// caller gets a clear Status and the library links. Zero-row calls are a no-op as documented.
#include "common/check.h"
#include "qsa/qsa_checks.h"
#include "selkv/qsa.h"

namespace selkv {

Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, cudaStream_t /*stream*/) {
  constexpr const char* kOp = "selkv::qsa_sparse_prefill";
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(qsa::check_params(kOp, p, qsa::Use::kAttention, /*device=*/true, &work));
  if (work == qsa::Work::kNone) return Status::Ok();
  SELKV_CHECK_SUPPORTED(false, "not yet implemented on CUDA (C8 kernels are planned; the CPU oracle is "
                               "selkv::ref::qsa_sparse_prefill)");
  return Status::Ok();
}

Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes, cudaStream_t /*stream*/) {
  constexpr const char* kOp = "selkv::qsa_plan";
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(
      qsa::check_params(kOp, p, qsa::Use::kPlan, /*device=*/true, &work, metadata, metadata_bytes));
  if (work == qsa::Work::kNone) return Status::Ok();
  SELKV_CHECK_SUPPORTED(false, "not yet implemented on CUDA (the CPU reference is selkv::ref::qsa_plan)");
  return Status::Ok();
}

}  // namespace selkv
