// The architecture check of the sm_90a kernel launchers, cached per device: a launch on the hot
// path should not query device attributes on every call. Plain attribute queries on a miss,
// legal during stream capture, never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/resident_ctas.h"  // kMaxCachedDevices

namespace selkv::detail {

// kUnsupported ("<op>: needs an SM90 (Hopper) GPU, got sm_XY") on any other device.
inline Status require_sm90(const char* op) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};  // compute capability 10 * major + minor
  int cc = 0;
  SELKV_RETURN_IF_ERROR(cached_per_device(cache, op, &cc, [op](int dev, int* v) -> Status {
    int major = 0, minor = 0;
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), op);
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), op);
    *v = 10 * major + minor;
    return Status::Ok();
  }));
  if (cc != 90)
    return Status(StatusCode::kUnsupported, concat(op, ": needs an SM90 (Hopper) GPU, got sm_", cc));
  return Status::Ok();
}

// cudaFuncSetAttribute(kKernel, MaxDynamicSharedMemorySize, bytes) once per device (the attribute
// is per device; every launch needs it set, none needs it set again). `bytes` is fixed per kernel.
// (A cudaDeviceReset drops the attribute but not this cache: not supported mid-process.)
template <auto kKernel>
cudaError_t set_max_dynamic_smem_once(int bytes) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  cudaError_t err = cudaSuccess;
  int done = 0;
  // A failed attribute call is not cached (value 0) and its CUDA error is returned as is.
  const Status st = cached_per_device(cache, "set_max_dynamic_smem_once", &done, [&](int, int* v) -> Status {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    *v = err == cudaSuccess ? 1 : 0;
    return Status::Ok();
  });
  if (!st.ok() && err == cudaSuccess) err = cudaErrorInvalidDevice;  // cudaGetDevice failed
  return err;
}

}  // namespace selkv::detail
