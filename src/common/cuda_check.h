// CUDA error -> Status, for launchers. Never used on device.
#pragma once

#include <cuda_runtime_api.h>

#include "common/check.h"

namespace selkv::detail {

inline Status cuda_status(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError,
                concat(op, ": ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// After a kernel launch: reports launch-configuration errors without synchronizing.
inline Status launch_status(const char* op) {
  return cuda_status(cudaGetLastError(), op, "kernel launch");
}

}  // namespace selkv::detail

#define SELKV_CUDA_RETURN(expr, op)                                            \
  do {                                                                         \
    cudaError_t _selkv_err = (expr);                                           \
    if (_selkv_err != cudaSuccess) return ::selkv::detail::cuda_status(_selkv_err, op, #expr); \
  } while (0)
