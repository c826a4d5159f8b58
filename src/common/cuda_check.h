// CUDA error -> Status, for launchers. Never used on device.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/check.h"

namespace selkv::detail {

// The runtime reports a machine without any NVIDIA driver as cudaErrorInsufficientDriver ("driver
// version is insufficient"); cudaDriverGetVersion then returns 0, which tells the two apart.
inline bool no_nvidia_driver(cudaError_t err) {
  int version = 0;
  return err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&version) == cudaSuccess && version == 0;
}

// "cudaErrorX (description)", or what is really missing when there is no driver or no GPU.
inline std::string cuda_error_text(cudaError_t err) {
  if (no_nvidia_driver(err)) return "no NVIDIA driver or GPU found (cudaErrorInsufficientDriver: no driver installed)";
  if (err == cudaErrorNoDevice) return "no NVIDIA GPU found (cudaErrorNoDevice)";
  return concat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

inline Status cuda_status(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, concat(op, ": ", what, ": ", cuda_error_text(err)));
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
