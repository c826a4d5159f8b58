// Shared helpers for the GPU GoogleTest suites: CUDA_OK, ST_OK, a RAII device buffer, host<->device copies.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#ifndef CUDA_OK
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#endif
// A selkv::Status that must be ok (its message on failure).
#ifndef ST_OK
#define ST_OK(x)                              \
  do {                                        \
    const ::selkv::Status _st = (x);          \
    ASSERT_TRUE(_st.ok()) << _st.to_string(); \
  } while (0)
#endif

namespace selkv::test {

// Device buffer of raw bytes (at least 16 bytes are allocated; ptr is null if cudaMalloc fails).
struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n ? n : 16) != cudaSuccess) ptr = nullptr;
  }
  ~DevBuf() { if (ptr) cudaFree(ptr); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr) + byte_offset);
  }
  // Copies all of h to the start of the buffer.
  template <typename T>
  void upload(const std::vector<T>& h) const {
    ASSERT_EQ(cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // The whole buffer (bytes / sizeof(T) elements).
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> h(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

template <typename T>
void up(const DevBuf& b, const std::vector<T>& v) {
  b.upload(v);
}

// The first n elements of the buffer.
template <typename T>
std::vector<T> down(const DevBuf& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

}  // namespace selkv::test
