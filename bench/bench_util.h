// Host-side helpers shared by the benchmark harness, the op workloads and the CLI:
// CUDA error checks that throw, an RAII device buffer, a fast seeded RNG and random data.
// Host tooling only (never part of the library): errors are exceptions here.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "selkv/decode.h"  // DecodePartials
#include "selkv/status.h"

namespace selkv::bench {

// A CUDA runtime call failed (not an op's argument error).
struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A selkv op returned a non-ok Status.
struct OpFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) {
    throw CudaFailure(std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) +
                      ") at " + file + ":" + std::to_string(line) + ": " + expr);
  }
}
#define SELKV_BENCH_CUDA(expr) ::selkv::bench::cuda_check((expr), #expr, __FILE__, __LINE__)

inline void throw_if_error(const Status& st) {
  if (!st.ok()) throw OpFailure(st.to_string());
}

// Owning device allocation (cudaMalloc'd, so 256-byte aligned).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_) SELKV_BENCH_CUDA(cudaMalloc(&ptr_, bytes_));
  }
  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    if (b.bytes_) SELKV_BENCH_CUDA(cudaMemcpy(b.ptr_, host.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  void fill_async(uint8_t byte, cudaStream_t s) {
    if (bytes_) SELKV_BENCH_CUDA(cudaMemsetAsync(ptr_, byte, bytes_, s));
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) SELKV_BENCH_CUDA(cudaMemcpy(host.data(), ptr_, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// splitmix64-seeded xoshiro256**: fast, good enough for test data, same stream everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform integer in [lo, hi] (hi >= lo); the tiny modulo bias is irrelevant here.
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = float(r * std::sin(6.283185307179586 * u2));
    has_spare_ = true;
    return float(r * std::cos(6.283185307179586 * u2));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  float spare_ = 0.f;
  bool has_spare_ = false;
};

// bf16 bits of N(0, stddev) samples.
std::vector<uint16_t> random_bf16(size_t n, float stddev, Rng& rng);
// k distinct values from [0, n), in random order (k <= n).
std::vector<int64_t> sample_distinct(int64_t n, int64_t k, Rng& rng);
// A random permutation of [0, n).
std::vector<int32_t> permutation(int32_t n, Rng& rng);

// Random bytes / bf16 values on the device (no host round trip, for large buffers).
void device_fill_random_bytes(void* ptr, size_t bytes, uint64_t seed, cudaStream_t stream);
// Reads `bytes` (a multiple of 16) once; used to leave the L2 full of clean lines.
void device_read_sweep(const void* ptr, size_t bytes, void* sink, cudaStream_t stream);
// Runs 256 KB of straight-line code on every SM (4 warps per SM): evicts the SMs' instruction
// caches (the flush's memset leaves them holding the previous call's code). `sink` is written
// only for an impossible value.
void device_icache_sweep(void* sink, cudaStream_t stream);
// bf16 uniform in [-1, 1) (never all zeros: timing on zeros is not representative).
void device_fill_random_bf16(void* ptr, size_t count, uint64_t seed, cudaStream_t stream);

// Split-KV granularity of every decode case (A/B of the scheduler without a rebuild):
// SELKV_BENCH_MIN_BLOCKS, else 0 = the library's default for H.
inline int32_t env_min_blocks() {
  const char* env = std::getenv("SELKV_BENCH_MIN_BLOCKS");
  return env != nullptr && *env ? int32_t(std::atoi(env)) : 0;
}

// Extra-cache lengths of the MODEL1 extra_topk_length cases: SELKV_BENCH_EXTRA_LEN = "L" or
// "L0,L1,..." (batch row b takes entry b mod n, clamped to [0, K2]), else drawn uniform in
// [0, K2]. Not in the case label: one CLI run per setting (a sweep of the short-row plans).
inline std::vector<int32_t> env_extra_lengths() {
  std::vector<int32_t> v;
  const char* env = std::getenv("SELKV_BENCH_EXTRA_LEN");
  for (const char* p = env; p != nullptr && *p;) {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    if (end == p) break;
    v.push_back(int32_t(x));
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

// Partial format of every decode case: SELKV_BENCH_PARTIALS = fp32 | fp16, else the library's
// choice (not in the case label, so bench_ab variants of it line up).
inline DecodePartials env_partials() {
  const char* env = std::getenv("SELKV_BENCH_PARTIALS");
  if (env == nullptr) return DecodePartials::kAuto;
  if (std::strcmp(env, "fp32") == 0) return DecodePartials::kFp32;
  if (std::strcmp(env, "fp16") == 0) return DecodePartials::kFp16;
  return DecodePartials::kAuto;
}

inline std::string human_count(int64_t n) {
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n / 1024) + "K";
  return std::to_string(n);
}

}  // namespace selkv::bench
