// Launch sizing shared by the persistent (one-wave) kernels: SM count and resident CTAs per
// device, computed once per device (and kernel) with plain attribute queries, which are legal
// during stream capture and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"

namespace selkv::detail {

inline constexpr int kMaxCachedDevices = 64;  // devices beyond this are queried every call

// A positive per-device value computed once per device by `query(dev, &value)` (a Status); the
// cache is the caller's static array. Racing first calls compute the same value twice: harmless.
template <class Query>
Status cached_per_device(std::atomic<int> (&cache)[kMaxCachedDevices], const char* op, int* value, Query&& query) {
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), op);
  if (dev < kMaxCachedDevices) {
    if (const int c = cache[dev].load(std::memory_order_relaxed); c > 0) {
      *value = c;
      return Status::Ok();
    }
  }
  int v = 0;
  SELKV_RETURN_IF_ERROR(query(dev, &v));
  if (dev < kMaxCachedDevices && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  *value = v;
  return Status::Ok();
}

// Multiprocessor count of the current device.
inline Status device_sm_count(const char* op, int* sms) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, op, sms, [op](int dev, int* n) -> Status {
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev), op);
    return Status::Ok();
  });
}

// Shared memory a block of the current device may opt in to (cudaFuncSetAttribute's ceiling).
inline Status device_smem_optin(const char* op, int* bytes) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, op, bytes, [op](int dev, int* n) -> Status {
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), op);
    return Status::Ok();
  });
}

// CTAs of `kKernel` (launched with `threads` threads and `smem` dynamic bytes, fixed per kernel)
// resident on the whole current device at once: SMs x occupancy (at least one per SM).
template <auto kKernel>
Status resident_ctas(int threads, size_t smem, const char* op, int64_t* ctas) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int wave = 0;
  SELKV_RETURN_IF_ERROR(cached_per_device(cache, op, &wave, [&](int, int* w) -> Status {
    int sms = 0, per_sm = 0;
    SELKV_RETURN_IF_ERROR(device_sm_count(op, &sms));
    SELKV_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem), op);
    *w = sms * (per_sm > 0 ? per_sm : 1);
    return Status::Ok();
  }));
  *ctas = wave;
  return Status::Ok();
}

}  // namespace selkv::detail
