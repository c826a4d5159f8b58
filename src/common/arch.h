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
  static std::atomic<int> cached[kMaxCachedDevices] = {};  // compute capability 10 * major + minor
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), op);
  int cc = dev < kMaxCachedDevices ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), op);
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), op);
    cc = 10 * major + minor;
    if (dev < kMaxCachedDevices) cached[dev].store(cc, std::memory_order_relaxed);
  }
  if (cc != 90)
    return Status(StatusCode::kUnsupported, concat(op, ": needs an SM90 (Hopper) GPU, got sm_", cc));
  return Status::Ok();
}

}  // namespace selkv::detail

namespace selkv::detail {

// cudaFuncSetAttribute(kKernel, MaxDynamicSharedMemorySize, bytes) once per device (the attribute
// is per device; every launch needs it set, none needs it set again). `bytes` is fixed per kernel.
// (A cudaDeviceReset drops the attribute but not this cache: not supported mid-process.)
template <auto kKernel>
cudaError_t set_max_dynamic_smem_once(int bytes) {
  static std::atomic<int> done[kMaxCachedDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxCachedDevices && done[dev].load(std::memory_order_relaxed) != 0) return cudaSuccess;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && dev < kMaxCachedDevices) done[dev].store(1, std::memory_order_relaxed);
  return err;
}

}  // namespace selkv::detail
