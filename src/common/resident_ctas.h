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

// Multiprocessor count of the current device.
inline Status device_sm_count(const char* op, int* sms) {
  static std::atomic<int> cached[kMaxCachedDevices] = {};
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), op);
  if (dev < kMaxCachedDevices) {
    if (const int c = cached[dev].load(std::memory_order_relaxed); c > 0) {
      *sms = c;
      return Status::Ok();
    }
  }
  int n = 0;
  SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), op);
  if (dev < kMaxCachedDevices) cached[dev].store(n, std::memory_order_relaxed);
  *sms = n;
  return Status::Ok();
}

// CTAs of `kKernel` (launched with `threads` threads and `smem` dynamic bytes, fixed per kernel)
// resident on the whole current device at once: SMs x occupancy (at least one per SM).
template <auto kKernel>
Status resident_ctas(int threads, size_t smem, const char* op, int64_t* ctas) {
  static std::atomic<int> cached[kMaxCachedDevices] = {};
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), op);
  if (dev < kMaxCachedDevices) {
    if (const int c = cached[dev].load(std::memory_order_relaxed); c > 0) {
      *ctas = c;
      return Status::Ok();
    }
  }
  int sms = 0, per_sm = 0;
  SELKV_RETURN_IF_ERROR(device_sm_count(op, &sms));
  SELKV_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem), op);
  const int wave = sms * (per_sm > 0 ? per_sm : 1);
  if (dev < kMaxCachedDevices) cached[dev].store(wave, std::memory_order_relaxed);
  *ctas = wave;
  return Status::Ok();
}

}  // namespace selkv::detail
